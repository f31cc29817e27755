package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/model"
)

// TestE2BSDK runs the unmodified E2B JS SDK (test/e2b, npm e2b pinned in
// its package.json and package-lock.json) against this stack: server and
// worker in separate processes, so sandbox traffic goes server → worker
// data plane → agent envd. It installs the npm packages with `npm ci`
// when test/e2b/node_modules lacks them.
func TestE2BSDK(t *testing.T) {
	s := need(t)
	dir := e2bSuiteDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runE2BSuite(t, dir, s.url(), e2bSuiteKey(ctx, t, s.client()), filepath.Join(s.root, "stack.log"))
}

// TestE2BSDKUp runs the same suite against `airlock up`, where the server
// hands sandbox traffic to its in-process worker.
func TestE2BSDKUp(t *testing.T) {
	s := need(t)
	suite := e2bSuiteDir(t)
	u := newUp(t, s, "http")
	dir, url, logPath := u.dir, u.url, u.logPath
	up := u.start(t, s, http.DefaultClient)
	defer kill(up, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	admin := client.New(url, readTrim(filepath.Join(dir, "admin.key")))
	defer func() { // delete what the suite left
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if page, err := admin.ListSandboxes(ctx, client.SandboxFilter{Limit: 1000}); err == nil {
			for _, sb := range page.Sandboxes {
				if op, err := admin.DeleteSandbox(ctx, sb.ID); err == nil {
					admin.WaitOperation(ctx, op.ID)
				}
			}
		}
	}()
	runE2BSuite(t, suite, url, e2bSuiteKey(ctx, t, admin), logPath)
}

// e2bSuiteKey returns an admin e2b_ key of a new org with the snapshots
// feature gate (the suite's snapshots and forks are checkpoints), inline
// network policies (updateNetwork) and an admin key (secrets).
func e2bSuiteKey(ctx context.Context, t *testing.T, operator *client.Client) string {
	t.Helper()
	org, err := operator.CreateOrg(ctx, fmt.Sprintf("e2b-suite-%d", time.Now().UnixNano()))
	if err != nil {
		t.Fatalf("create the suite's org: %v", err)
	}
	if _, err := operator.UpdateOrg(ctx, org.ID, client.UpdateOrgRequest{Features: &[]string{"snapshots"}, Network: &model.OrgNetwork{InlinePolicies: true}}); err != nil {
		t.Fatalf("enable snapshots and inline network policies for %s: %v", org.ID, err)
	}
	key, err := operator.CreateKey(ctx, org.ID, client.CreateKeyRequest{Name: "e2b-sdk-test", E2B: true, Admin: true})
	if err != nil {
		t.Fatalf("create an e2b key: %v", err)
	}
	return key.Secret
}

// e2bSuiteDir returns test/e2b with its npm packages installed (`npm ci`
// when node_modules lacks them), or skips when node or npm is missing.
func e2bSuiteDir(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("SKIP: node is not installed; the E2B SDK suite needs node >= 20.18.1 and npm")
	}
	// e2b 2.51 declares node ">=20.18.1 <21 || >=22".
	if out, err := exec.Command("node", "-e", "const [a,b]=process.versions.node.split('.').map(Number);process.exit(a>20||(a===20&&b>=18)?0:3)").CombinedOutput(); err != nil {
		v, _ := exec.Command("node", "--version").Output()
		t.Skipf("SKIP: node %s is too old for the e2b SDK (needs >= 20.18.1): %v %s", bytes.TrimSpace(v), err, out)
	}
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "test", "e2b")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json")); err != nil {
		e2bInstall.Do(func() {
			npm, err := exec.LookPath("npm")
			if err != nil {
				e2bInstallErr = errSkip("SKIP: npm is not installed and test/e2b/node_modules is missing; run `npm ci --prefix test/e2b`")
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			if out, err := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--prefix", dir).CombinedOutput(); err != nil {
				e2bInstallErr = fmt.Errorf("npm ci --prefix test/e2b: %v\n%s", err, out)
			}
		})
		var skip errSkip
		if errors.As(e2bInstallErr, &skip) {
			t.Skip(string(skip))
		}
		if e2bInstallErr != nil {
			t.Fatal(e2bInstallErr)
		}
	}
	return dir
}

var (
	e2bInstall    sync.Once
	e2bInstallErr error
)

type errSkip string

func (e errSkip) Error() string { return string(e) }

// runE2BSuite runs test/e2b/*.test.mjs with node's test runner against url.
func runE2BSuite(t *testing.T, dir, url, key, logPath string) {
	t.Helper()
	if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(key) {
		t.Fatalf("e2b key %q is not e2b_ and 40 hex characters", key)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.test.mjs"))
	if len(files) == 0 {
		t.Fatalf("no *.test.mjs in %s", dir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{"--test", "--test-reporter=spec"}, files...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"E2B_API_URL="+url, "E2B_SANDBOX_URL="+url, "E2B_API_KEY="+key,
		"NO_COLOR=1", "FORCE_COLOR=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("node --test test/e2b (%s):\n%s", url, out.String())
	if err != nil {
		t.Fatalf("the E2B SDK suite failed: %v (server log: %s)", err, logPath)
	}
	if !regexp.MustCompile(`(?m)pass [1-9]`).Match(out.Bytes()) || regexp.MustCompile(`(?m)(fail|todo|skipped) [1-9]`).Match(out.Bytes()) {
		t.Fatalf("the E2B SDK suite did not pass every test")
	}
}
