package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestAPIFuzz runs Schemathesis, a property-based API fuzzer, against the
// committed OpenAPI document and a real `airlock server` process over its
// own SQLite database: every operation gets generated valid and invalid
// requests, and a run fails on any 5xx answer or any answer that does not
// match the document (status code, content type, body schema).
//
// The server runs without a worker, so created sandboxes stay pending and no
// runtime is started; /healthz is left out because its 503 ("no worker has
// registered") is the documented answer there. scripts/test.sh installs
// Schemathesis into a virtualenv under the test cache; the number of cases
// per operation is bounded by AIRLOCK_APIFUZZ_EXAMPLES (default 40) and the
// whole run by AIRLOCK_APIFUZZ_SECONDS (default 90).
func TestAPIFuzz(t *testing.T) {
	s := need(t)
	stBin := schemathesis()
	if stBin == "" {
		t.Skip("SKIP: schemathesis (`st`) not found: set AIRLOCK_SCHEMATHESIS, put st on PATH, or run scripts/test.sh, which installs it")
	}
	examples, budget := 40, 90
	if v, err := strconv.Atoi(os.Getenv("AIRLOCK_APIFUZZ_EXAMPLES")); err == nil && v > 0 {
		examples = v
	}
	if v, err := strconv.Atoi(os.Getenv("AIRLOCK_APIFUZZ_SECONDS")); err == nil && v > 0 {
		budget = v
	}
	modRoot, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	srv := exec.Command(filepath.Join(s.bin, "airlock"), "server", "--listen", addr,
		"--data-dir", filepath.Join(dir, "data"))
	srv.Env = append(os.Environ(), "AIRLOCK_WORKER_TOKEN=apifuzz-worker-token")
	srv.Stdout, srv.Stderr = logf, logf
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer kill(srv, 15)
	key := ""
	deadline := time.Now().Add(30 * time.Second)
	for key == "" && time.Now().Before(deadline) {
		key = readTrim(filepath.Join(dir, "data", "admin.key"))
		time.Sleep(50 * time.Millisecond)
	}
	if key == "" {
		t.Fatal("fuzz server wrote no admin.key")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	report := filepath.Join(dir, "report.json")
	cmd := exec.CommandContext(ctx, stBin, "run", filepath.Join(modRoot, "api", "openapi.json"),
		"--url", "http://"+addr,
		"--header", "Authorization: Bearer "+key,
		"--checks", "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
		"--exclude-path", "/healthz",
		"--max-examples", strconv.Itoa(examples),
		// The fuzzing and stateful phases repeat until the budget is spent.
		"--max-time", strconv.Itoa(budget),
		"--seed", "20261201",
		"--workers", "1",
		"--request-timeout", "20",
		"--no-color",
		"--report", "json", "--report-json-path", report)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SCHEMATHESIS_TELEMETRY=false")
	out, err := cmd.CombinedOutput()
	summary := string(out)
	if i := strings.LastIndex(summary, "Test cases:"); i >= 0 {
		t.Logf("schemathesis: %s", strings.TrimSpace(summary[i:]))
	}
	if err != nil {
		t.Fatalf("schemathesis found failures (%v); its output:\n%s\nserver log: %s", err, out, filepath.Join(dir, "server.log"))
	}
}

// schemathesis finds the `st` command: $AIRLOCK_SCHEMATHESIS, the virtualenv
// scripts/test.sh installs into the test cache, or PATH.
func schemathesis() string {
	if p := os.Getenv("AIRLOCK_SCHEMATHESIS"); p != "" {
		return p
	}
	if p := filepath.Join(cacheDir(), "venv-schemathesis", "bin", "st"); fileExists(p) {
		return p
	}
	if p, err := exec.LookPath("st"); err == nil {
		return p
	}
	return ""
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
