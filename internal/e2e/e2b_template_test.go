package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/service"
)

// e2bPythonVersion is the Python e2b SDK the template test installs.
const e2bPythonVersion = "2.63.0"

// TestE2BTemplateBuildJS builds a template with the unmodified E2B JS
// SDK's Template() builder (test/e2b/template.mjs: fromTemplate('base'),
// runCmd, a RUN as root, copy of a file and a directory, setEnvs), creates
// a sandbox from it that sees the build, rebuilds it from the cache, and
// checks Template.exists for a missing name — against the real server and
// worker (the worker's builder runs RUN steps in gVisor).
func TestE2BTemplateBuildJS(t *testing.T) {
	s := need(t)
	dir := e2bSuiteDir(t)
	key := e2bKey(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-reporter=spec", "template.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+s.url(), "E2B_SANDBOX_URL="+s.url(), "E2B_API_KEY="+key, "NO_COLOR=1", "FORCE_COLOR=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("node --test test/e2b/template.mjs:\n%s", out.String())
	if err != nil {
		t.Fatalf("the E2B JS template suite failed: %v (server log: %s)", err, filepath.Join(s.root, "stack.log"))
	}
	if !regexp.MustCompile(`(?m)pass 2`).Match(out.Bytes()) || regexp.MustCompile(`(?m)(fail|todo|skipped) [1-9]`).Match(out.Bytes()) {
		t.Fatalf("the E2B JS template suite did not pass both tests")
	}
}

// TestE2BTemplateBuildPython does the same with the unmodified E2B Python
// SDK (PyPI e2b, installed into a virtualenv in the test cache):
// test/e2b/template_test.py.
func TestE2BTemplateBuildPython(t *testing.T) {
	s := need(t)
	py := e2bPython(t)
	key := e2bKey(t, s)
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, filepath.Join(root, "test", "e2b", "template_test.py"))
	cmd.Env = append(os.Environ(), "E2B_API_URL="+s.url(), "E2B_SANDBOX_URL="+s.url(), "E2B_API_KEY="+key)
	out, err := cmd.CombinedOutput()
	t.Logf("python test/e2b/template_test.py:\n%s", out)
	if err != nil {
		t.Fatalf("the E2B Python template test failed: %v (server log: %s)", err, filepath.Join(s.root, "stack.log"))
	}
	if !strings.Contains(string(out), "ok: built") {
		t.Fatal("the E2B Python template test did not report success")
	}
}

func e2bKey(t *testing.T, s *stack) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k, err := s.client().CreateKey(ctx, service.DefaultOrgID, client.CreateKeyRequest{Name: "e2b-template-test", E2B: true})
	if err != nil {
		t.Fatalf("create an e2b key: %v", err)
	}
	return k.Secret
}

// e2bPython returns the python of a virtualenv with the e2b SDK
// (<cache>/venv-e2b-<version>, made on first use), or skips when python3,
// its venv module or the package registry is missing.
func e2bPython(t *testing.T) string {
	t.Helper()
	return venvPython(t, "venv-e2b-"+e2bPythonVersion, "e2b=="+e2bPythonVersion)
}

// venvPython returns the python of a virtualenv named name in the test
// cache with pkg installed (made once per machine); it skips, naming what
// is missing, where that cannot be done.
func venvPython(t *testing.T, name string, reqs ...string) string {
	t.Helper()
	venvMu.Lock()
	defer venvMu.Unlock()
	if bin, ok := venvBins[name]; ok {
		return bin
	}
	if err, ok := venvErrs[name]; ok {
		t.Skip(err)
	}
	bin, err := makeVenv(name, reqs...)
	if err != "" {
		venvErrs[name] = err
		t.Skip(err)
	}
	venvBins[name] = bin
	return bin
}

var (
	venvMu   sync.Mutex
	venvBins = map[string]string{}
	venvErrs = map[string]string{}
)

func makeVenv(name string, reqs ...string) (bin, skip string) {
	python, err := exec.LookPath("python3")
	if err != nil {
		return "", "SKIP: python3 is not installed; the Python SDK test needs it"
	}
	venv := filepath.Join(cacheDir(), name)
	bin = filepath.Join(venv, "bin", "python")
	if _, err := os.Stat(filepath.Join(venv, ".done")); err == nil {
		return bin, ""
	}
	os.RemoveAll(venv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, python, "-m", "venv", venv).CombinedOutput(); err != nil {
		return "", "SKIP: python3 -m venv failed (install python3-venv): " + strings.TrimSpace(string(out))
	}
	args := append([]string{"-m", "pip", "install", "-q", "--disable-pip-version-check"}, reqs...)
	if out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput(); err != nil {
		return "", "SKIP: pip install " + strings.Join(reqs, " ") + " failed (is the Python package registry reachable?): " + strings.TrimSpace(string(out))
	}
	os.WriteFile(filepath.Join(venv, ".done"), nil, 0o644)
	return bin, ""
}
