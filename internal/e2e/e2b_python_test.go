package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// pytestVersion is the pytest that runs test/e2b/sdk_test.py (the same pin
// as templates/code-interpreter/server/test.sh).
const pytestVersion = "9.2.0"

// e2bPythonSkips is how many tests of test/e2b/sdk_test.py are expected to
// skip against Airlock (each names its gap in its pytest.skip reason); any
// other count fails TestE2BPythonSDK.
const e2bPythonSkips = 0

// TestE2BPythonSDK runs the scenario of the E2B JS SDK suite
// (test/e2b/sdk.test.mjs) with the unmodified E2B Python SDK (e2b ==
// e2bPythonVersion), as pytest tests in test/e2b/sdk_test.py, once with
// the sync client (e2b.Sandbox) and once with the async one
// (e2b.AsyncSandbox), against this stack: server and worker in separate
// processes.
func TestE2BPythonSDK(t *testing.T) {
	s := need(t)
	python := e2bPytestPython(t)
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	key := e2bSuiteKey(ctx, t, s.client())
	cancel()
	if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(key) {
		t.Fatalf("e2b key %q is not e2b_ and 40 hex characters", key)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-m", "pytest", "-q", "-rsx", "-p", "no:cacheprovider", "test/e2b/sdk_test.py")
	cmd.Dir = root
	cmd.Env = append(os.Environ(),
		"E2B_API_URL="+s.url(), "E2B_SANDBOX_URL="+s.url(), "E2B_API_KEY="+key,
		"PYTHONDONTWRITEBYTECODE=1", "NO_COLOR=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	t.Logf("python -m pytest -q test/e2b/sdk_test.py (%s):\n%s", s.url(), out.String())
	if err != nil {
		t.Fatalf("the E2B Python SDK suite failed: %v (server log: %s)", err, filepath.Join(s.root, "stack.log"))
	}
	counts := pytestCounts(out.String())
	if counts["passed"] == 0 {
		t.Fatalf("pytest reported no passed test: %v", counts)
	}
	if counts["skipped"] != e2bPythonSkips || counts["xfailed"] != 0 || counts["xpassed"] != 0 || counts["failed"] != 0 || counts["error"]+counts["errors"] != 0 {
		t.Fatalf("pytest reported %v; want only passed and %d skipped", counts, e2bPythonSkips)
	}
}

// pytestCounts parses pytest's final summary ("40 passed, 2 skipped in 3.1s").
func pytestCounts(out string) map[string]int {
	counts := map[string]int{}
	summary := regexp.MustCompile(`(?m)^=*\s*\d+ (passed|failed|skipped|xfailed|xpassed|errors?|deselected|warnings?)\b.* in [0-9.]+s\b.*$`).FindAllString(out, -1)
	if len(summary) == 0 {
		return counts
	}
	last := summary[len(summary)-1]
	for _, m := range regexp.MustCompile(`(\d+) (passed|failed|skipped|xfailed|xpassed|errors?|deselected|warnings?)`).FindAllStringSubmatch(last, -1) {
		n, _ := strconv.Atoi(m[1])
		counts[m[2]] += n
	}
	return counts
}

// e2bPytestPython returns the python of a virtualenv in the test cache with
// e2b == e2bPythonVersion and pytest == pytestVersion (made once per
// machine), or skips naming what is missing.
func e2bPytestPython(t *testing.T) string {
	t.Helper()
	return venvPython(t, "venv-e2b-pytest-"+e2bPythonVersion+"-"+pytestVersion, "e2b=="+e2bPythonVersion, "pytest=="+pytestVersion)
}
