package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestUpAndCLI drives `airlock up` (server + worker in one process over
// SQLite) with the real CLI, as the README's walkthrough does, then restarts
// it and checks the second start reuses everything.
func TestUpAndCLI(t *testing.T) {
	s := need(t)
	u := newUp(t, s, "http")
	dir, url, logPath := u.dir, u.url, u.logPath
	start := func() *exec.Cmd { return u.start(t, s, http.DefaultClient) }
	up := start()
	defer func() { kill(up, syscall.SIGTERM) }()

	env := append(os.Environ(), "AIRLOCK_URL="+url, "AIRLOCK_API_KEY="+readTrim(filepath.Join(dir, "admin.key")))
	cli := airlockCLI(t, s, env)
	out, code := cli("", "sandbox", "create", "--json")
	if code != 0 {
		t.Fatalf("sandbox create: exit %d: %s", code, out)
	}
	var created struct {
		Sandbox struct{ ID, State string }
	}
	if err := json.Unmarshal([]byte(out), &created); err != nil || created.Sandbox.ID == "" {
		t.Fatalf("sandbox create --json: %v: %s", err, out)
	}
	id := created.Sandbox.ID
	if created.Sandbox.State != "running" {
		t.Errorf("state after create %q", created.Sandbox.State)
	}
	if out, _ := cli("", "exec", id, "--", "python3", "-c", "print(6*7)"); out != "42\n" {
		t.Errorf("python3 printed %q", out)
	}
	if _, code := cli("", "exec", id, "--", "sh", "-c", "exit 7"); code != 7 {
		t.Errorf("exit code %d, want 7", code)
	}
	if out, _ := cli("", "exec", id, "--", "id", "-un"); out != "user\n" {
		t.Errorf("id -un printed %q", out)
	}
	if out, _ := cli("piped input\n", "exec", id, "--", "cat"); out != "piped input\n" {
		t.Errorf("stdin through exec: %q", out)
	}
	local := filepath.Join(dir, "in.txt")
	os.WriteFile(local, bytes.Repeat([]byte("airlock\n"), 100000), 0o640)
	if out, code := cli("", "cp", local, id+":/home/user/in.txt"); code != 0 {
		t.Fatalf("cp in: %s", out)
	}
	back := filepath.Join(dir, "back.txt")
	if out, code := cli("", "cp", id+":/home/user/in.txt", back); code != 0 {
		t.Fatalf("cp out: %s", out)
	}
	a, _ := os.ReadFile(local)
	b, _ := os.ReadFile(back)
	if !bytes.Equal(a, b) {
		t.Errorf("cp round trip differs (%d vs %d bytes)", len(a), len(b))
	}
	if out, _ := cli("", "sandbox", "ls"); !strings.Contains(out, id) {
		t.Errorf("sandbox ls lacks %s:\n%s", id, out)
	}
	if out, _ := cli("", "template", "ls"); !strings.Contains(out, "base") {
		t.Errorf("template ls lacks base:\n%s", out)
	}

	// Restart: the sandbox survives; set-up is not redone.
	kill(up, syscall.SIGTERM)
	before, _ := os.ReadFile(logPath)
	up = start()
	after, _ := os.ReadFile(logPath)
	second := string(after[len(before):])
	if strings.Contains(second, "debootstrap") || strings.Contains(second, "building") {
		t.Errorf("second start redid set-up:\n%s", second)
	}
	if out, _ := cli("", "exec", id, "--", "cat", "/home/user/in.txt"); out != string(a) {
		t.Errorf("file after restart: %d bytes", len(out))
	}
	if out, code := cli("", "sandbox", "rm", id); code != 0 {
		t.Fatalf("sandbox rm: %s", out)
	}
	if left := leftoversIn(dir, id); len(left) > 0 {
		t.Errorf("left behind after rm:\n%s", strings.Join(left, "\n"))
	}
}
