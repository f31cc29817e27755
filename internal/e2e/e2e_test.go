package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/network"
)

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestCreateExecFilesDelete is the whole flow through HTTP: create, run
// commands, move files, delete, and nothing left behind on the host.
func TestCreateExecFilesDelete(t *testing.T) {
	s := need(t)
	c := s.client()
	ctx := ctxT(t, 3*time.Minute)
	sb, op, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{
		Env:       map[string]string{"GREETING": "hello"},
		Metadata:  map[string]string{"suite": "e2e"},
		Resources: model.Resources{VCPUs: 1, MemoryMiB: 256},
	}, "")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(sb.TemplateDigest, "sha256:") {
		t.Errorf("template digest %q not resolved", sb.TemplateDigest)
	}
	if op, err = c.WaitOperation(ctx, op.ID); err != nil || op.State != model.OpSucceeded {
		t.Fatalf("create: %v %+v", err, op)
	}
	r := run(t, c, sb.ID, client.CreateCommandRequest{Argv: []string{"python3", "-c", "print(6*7)"}}, nil)
	if r.stdout != "42\n" || r.exit.ExitCode != 0 {
		t.Errorf("python3: %q exit %+v", r.stdout, r.exit)
	}
	if r := sh(t, c, sb.ID, "exit 7"); r.exit.ExitCode != 7 {
		t.Errorf("exit code %d, want 7", r.exit.ExitCode)
	}
	if r := sh(t, c, sb.ID, "id -un; pwd; echo $GREETING"); r.stdout != "user\n/home/user\nhello\n" {
		t.Errorf("default user/cwd/env: %q", r.stdout)
	}
	if r := sh(t, c, sb.ID, "grep MemTotal /proc/meminfo"); !strings.Contains(r.stdout, fmt.Sprint(256*1024)) {
		t.Errorf("memory limit not applied: %q", r.stdout)
	}
	// Isolation: host processes and files are invisible.
	secret := filepath.Join(os.TempDir(), "airlock-e2e-host-secret")
	os.WriteFile(secret, []byte("s3cr3t"), 0o644)
	defer os.Remove(secret)
	if r := sh(t, c, sb.ID, "cat "+secret); r.exit.ExitCode == 0 || strings.Contains(r.stdout, "s3cr3t") {
		t.Errorf("host file readable from the sandbox: %+v", r)
	}
	if r := sh(t, c, sb.ID, `ls /proc | grep -c '^[0-9]'`); strings.TrimSpace(r.stdout) == "" || len(strings.TrimSpace(r.stdout)) > 1 {
		t.Errorf("sandbox sees %q processes", r.stdout)
	}
	// Loopback, and with egress (the default) the one link to its gateway.
	wantIfs := "lo"
	if network.HasGateway(sb.ID) {
		wantIfs = "eth0\nlo"
	}
	if r := sh(t, c, sb.ID, "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' ' | sort"); strings.TrimSpace(r.stdout) != wantIfs {
		t.Errorf("network interfaces: %q, want %q", r.stdout, wantIfs)
	}

	f, err := c.Files(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Mkdir(ctx, "/home/user/a/b/c", "0750", ""); err != nil {
		t.Fatal(err)
	}
	fi, err := f.Write(ctx, "a/b/c/hello.txt", strings.NewReader("hi there\n"), "0640", "")
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode != "0640" || fi.UID != 1000 {
		t.Errorf("written file info %+v, want mode 0640 uid 1000", fi)
	}
	if r := sh(t, c, sb.ID, "stat -c '%a %U' a/b/c/hello.txt; cat a/b/c/hello.txt"); r.stdout != "640 user\nhi there\n" {
		t.Errorf("file seen inside: %q", r.stdout)
	}
	if _, err := f.Move(ctx, "a/b/c/hello.txt", "/tmp/moved.txt"); err != nil {
		t.Fatal(err)
	}
	list, err := f.List(ctx, "/tmp")
	if err != nil || !containsName(list, "moved.txt") {
		t.Errorf("list /tmp: %v %+v", err, list)
	}
	if err := f.Remove(ctx, "/home/user/a", true); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Stat(ctx, "/home/user/a"); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("stat removed dir: %v, want not found", err)
	}

	op, err = c.DeleteSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitOperation(ctx, op.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.State != model.StateDeleted {
		t.Errorf("get after delete: %v %s, want the tombstone in state deleted", err, got.State)
	}
	if left := s.leftovers(sb.ID); len(left) > 0 {
		t.Errorf("left behind after delete:\n%s", strings.Join(left, "\n"))
	}
}

func containsName(l []agentapi.FileInfo, name string) bool {
	for _, fi := range l {
		if fi.Name == name {
			return true
		}
	}
	return false
}

// TestLargeFileRoundTrip moves 100 MiB in and out and compares sha256 on
// both sides.
func TestLargeFileRoundTrip(t *testing.T) {
	s := need(t)
	c := s.client()
	sb := newSandbox(t, c, client.CreateSandboxRequest{})
	ctx := ctxT(t, 5*time.Minute)
	f, err := c.Files(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	const size = 100 << 20
	h := sha256.New()
	src := io.TeeReader(io.LimitReader(rand.Reader, size), h)
	if _, err := f.Write(ctx, "/home/user/big.bin", src, "", ""); err != nil {
		t.Fatal(err)
	}
	want := hex.EncodeToString(h.Sum(nil))
	rc, err := f.Read(ctx, "/home/user/big.bin")
	if err != nil {
		t.Fatal(err)
	}
	h2 := sha256.New()
	n, err := io.Copy(h2, rc)
	rc.Close()
	if err != nil || n != size {
		t.Fatalf("read back %d bytes: %v", n, err)
	}
	if got := hex.EncodeToString(h2.Sum(nil)); got != want {
		t.Errorf("sha256 of the read-back file %s, want %s", got, want)
	}
	if r := sh(t, c, sb.ID, "sha256sum /home/user/big.bin"); !strings.HasPrefix(r.stdout, want) {
		t.Errorf("sha256 inside the sandbox %q, want %s", r.stdout, want)
	}
}

// TestInterleavedOutput: 10 MB on stdout and stderr, interleaved, arrive
// complete and separated.
func TestInterleavedOutput(t *testing.T) {
	s := need(t)
	c := s.client()
	sb := newSandbox(t, c, client.CreateSandboxRequest{})
	script := `
import sys
for i in range(100000):
    sys.stdout.write("out %07d ..........................................\n" % i)
    sys.stderr.write("err %07d ,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,\n" % i)
    if i % 100 == 0:
        sys.stdout.flush(); sys.stderr.flush()
`
	r := run(t, c, sb.ID, client.CreateCommandRequest{Argv: []string{"python3", "-c", script}}, nil)
	var wantOut, wantErr strings.Builder
	for i := 0; i < 100000; i++ {
		fmt.Fprintf(&wantOut, "out %07d ..........................................\n", i)
		fmt.Fprintf(&wantErr, "err %07d ,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,\n", i)
	}
	if r.exit.ExitCode != 0 {
		t.Fatalf("exit %+v", r.exit)
	}
	if len(r.stdout)+len(r.stderr) < 10_000_000 {
		t.Errorf("only %d bytes in total", len(r.stdout)+len(r.stderr))
	}
	if r.stdout != wantOut.String() {
		t.Errorf("stdout differs: got %d bytes, want %d", len(r.stdout), wantOut.Len())
	}
	if r.stderr != wantErr.String() {
		t.Errorf("stderr differs: got %d bytes, want %d", len(r.stderr), wantErr.Len())
	}
}

func TestStdinSignalsTimeout(t *testing.T) {
	s := need(t)
	c := s.client()
	sb := newSandbox(t, c, client.CreateSandboxRequest{})
	// stdin, closed at EOF.
	in := strings.Repeat("line of input\n", 10000)
	r := run(t, c, sb.ID, client.CreateCommandRequest{Argv: []string{"sh", "-c", "wc -c; cat >/dev/null"}, Stdin: true}, strings.NewReader(in))
	if strings.TrimSpace(r.stdout) != fmt.Sprint(len(in)) {
		t.Errorf("wc -c of stdin = %q, want %d", r.stdout, len(in))
	}
	// A signal ends the process and is reported.
	ctx := ctxT(t, time.Minute)
	cmd, err := c.CreateCommand(ctx, sb.ID, client.CreateCommandRequest{Argv: []string{"sleep", "300"}})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := client.AttachCommand(ctx, cmd.AttachURL, cmd.Token, 0)
	if err != nil {
		t.Fatal(err)
	}
	if kind, _, err := sess.Next(); err != nil || kind != agentapi.FrameStarted {
		t.Fatalf("first frame %d %v, want started", kind, err)
	}
	if err := sess.Signal("TERM"); err != nil {
		t.Fatal(err)
	}
	exit := waitExit(t, sess)
	if exit.Signal != "TERM" {
		t.Errorf("exit after TERM: %+v", exit)
	}
	// A command timeout kills it.
	r = run(t, c, sb.ID, client.CreateCommandRequest{Argv: []string{"sleep", "300"}, TimeoutS: 1}, nil)
	if !r.exit.TimedOut {
		t.Errorf("exit after timeout: %+v", r.exit)
	}
}

func waitExit(t *testing.T, sess *client.CommandSession) agentapi.Exit {
	t.Helper()
	for {
		kind, payload, err := sess.Next()
		if err != nil {
			t.Fatalf("waiting for exit: %v", err)
		}
		if kind == agentapi.FrameExit {
			var e agentapi.Exit
			if err := jsonUnmarshal(payload, &e); err != nil {
				t.Fatal(err)
			}
			return e
		}
	}
}

// TestReattachAndDetached: a client drops mid-stream and re-attaches from
// its offset; a command with no client attached keeps running and is listed.
func TestReattachAndDetached(t *testing.T) {
	s := need(t)
	c := s.client()
	sb := newSandbox(t, c, client.CreateSandboxRequest{})
	ctx := ctxT(t, 2*time.Minute)
	cmd, err := c.CreateCommand(ctx, sb.ID, client.CreateCommandRequest{
		Argv: []string{"sh", "-c", "for i in $(seq 1 60); do echo line $i; sleep 0.02; done"}})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := client.AttachCommand(ctx, cmd.AttachURL, cmd.Token, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	for got.Len() < 40 {
		kind, payload, err := sess.Next()
		if err != nil {
			t.Fatal(err)
		}
		if kind == agentapi.FrameStdout {
			got.Write(payload)
		}
	}
	sess.Close() // drop; the process keeps running
	time.Sleep(300 * time.Millisecond)
	sess, err = client.AttachCommand(ctx, cmd.AttachURL, cmd.Token, int64(got.Len()))
	if err != nil {
		t.Fatal(err)
	}
	for {
		kind, payload, err := sess.Next()
		if err != nil {
			t.Fatal(err)
		}
		if kind == agentapi.FrameStdout {
			got.Write(payload)
		}
		if kind == agentapi.FrameExit {
			break
		}
	}
	var want strings.Builder
	for i := 1; i <= 60; i++ {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	if got.String() != want.String() {
		t.Errorf("output across a re-attach:\n%q\nwant\n%q", got.String(), want.String())
	}

	// Detached: attach only to start it, then leave.
	det, err := c.CreateCommand(ctx, sb.ID, client.CreateCommandRequest{
		Argv: []string{"sh", "-c", "sleep 2; echo finished > /tmp/detached.txt"}})
	if err != nil {
		t.Fatal(err)
	}
	sess, err = client.AttachCommand(ctx, det.AttachURL, det.Token, 0)
	if err != nil {
		t.Fatal(err)
	}
	if kind, _, err := sess.Next(); err != nil || kind != agentapi.FrameStarted {
		t.Fatalf("detached start: %d %v", kind, err)
	}
	sess.Close()
	cmds, err := c.ListCommands(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	var listed *agentapi.ProcessInfo
	for i := range cmds {
		if cmds[i].ID == det.ID {
			listed = &cmds[i]
		}
	}
	if listed == nil || !listed.Running {
		t.Fatalf("detached command not listed as running: %+v", cmds)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if r := sh(t, c, sb.ID, "cat /tmp/detached.txt 2>/dev/null"); r.stdout == "finished\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("detached command never finished")
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestOrgIsolation: another org cannot see, use or delete a sandbox.
func TestOrgIsolation(t *testing.T) {
	s := need(t)
	admin := s.client()
	sb := newSandbox(t, admin, client.CreateSandboxRequest{})
	ctx := ctxT(t, time.Minute)
	org, err := admin.CreateOrg(ctx, fmt.Sprintf("other-%d", time.Now().UnixNano()))
	if err != nil {
		t.Fatal(err)
	}
	key, err := admin.CreateKey(ctx, org.ID, client.CreateKeyRequest{Name: "k"})
	if err != nil {
		t.Fatal(err)
	}
	other := client.New(s.url(), key.Secret)
	if _, err := other.GetSandbox(ctx, sb.ID); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("other org get: %v, want 404", err)
	}
	if _, err := other.DeleteSandbox(ctx, sb.ID); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("other org delete: %v, want 404", err)
	}
	if _, err := other.CreateCommand(ctx, sb.ID, client.CreateCommandRequest{Argv: []string{"true"}}); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("other org command: %v, want 404", err)
	}
	if _, err := other.FilesSession(ctx, sb.ID); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("other org files: %v, want 404", err)
	}
	page, err := other.ListSandboxes(ctx, client.SandboxFilter{})
	if err != nil || len(page.Sandboxes) != 0 {
		t.Errorf("other org list: %v %d sandboxes", err, len(page.Sandboxes))
	}
	// A data-plane token for one sandbox does not open another.
	sb2 := newSandbox(t, admin, client.CreateSandboxRequest{})
	fs, err := admin.FilesSession(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	u := strings.Replace(fs.URL, sb.ID, sb2.ID, 1) + "/stat?path=/etc/hostname"
	req, _ := http.NewRequestWithContext(ctx, "GET", u, nil)
	req.Header.Set("Authorization", "Bearer "+fs.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("token of %s used on %s: status %d, want 401/403", sb.ID, sb2.ID, resp.StatusCode)
	}
}

// TestErrorStatuses triggers each error status with a real bad request
// against the running server.
func TestErrorStatuses(t *testing.T) {
	s := need(t)
	admin := s.client()
	ctx := ctxT(t, time.Minute)
	org, err := admin.CreateOrg(ctx, fmt.Sprintf("plain-%d", time.Now().UnixNano()))
	if err != nil {
		t.Fatal(err)
	}
	key, err := admin.CreateKey(ctx, org.ID, client.CreateKeyRequest{Name: "plain"})
	if err != nil {
		t.Fatal(err)
	}
	sb := newSandbox(t, admin, client.CreateSandboxRequest{})
	big := `{"metadata":{"x":"` + strings.Repeat("a", 2<<20) + `"}}`
	cases := []struct {
		name, method, path, key, body string
		want                          int
	}{
		{"malformed json", "POST", "/v1/sandboxes", s.adminKey, `{"template":`, 400},
		{"no key", "GET", "/v1/sandboxes", "", "", 401},
		{"bad key", "GET", "/v1/sandboxes", "al_" + strings.Repeat("0", 40), "", 401},
		{"non-admin creates org", "POST", "/v1/orgs", key.Secret, `{"name":"x"}`, 403},
		{"unknown sandbox", "GET", "/v1/sandboxes/sb-aaaaaaaaaaaaaaaaaaaaaaaaaa", s.adminKey, "", 404},
		{"body too large", "POST", "/v1/sandboxes", s.adminKey, big, 413},
		{"bad resources", "POST", "/v1/sandboxes", s.adminKey, `{"resources":{"vcpus":999}}`, 422},
		{"unknown template", "POST", "/v1/sandboxes", s.adminKey, `{"template":"nope:nope"}`, 422},
		{"cmd and argv", "POST", "/v1/sandboxes/" + sb.ID + "/commands", s.adminKey, `{"cmd":"true","argv":["true"]}`, 422},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			req, _ := http.NewRequestWithContext(ctx, tc.method, s.url()+tc.path, body)
			if tc.key != "" {
				req.Header.Set("Authorization", "Bearer "+tc.key)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.want, b)
			}
			if !bytes.Contains(b, []byte(`"error"`)) || !bytes.Contains(b, []byte(`"message"`)) {
				t.Errorf("error body %s lacks {error:{code,message}}", b)
			}
		})
	}
	// 409: a command on a sandbox that is being deleted.
	sb3, op, err := admin.CreateSandbox(ctx, client.CreateSandboxRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}
	admin.WaitOperation(ctx, op.ID)
	dop, err := admin.DeleteSandbox(ctx, sb3.ID)
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.CreateCommand(ctx, sb3.ID, client.CreateCommandRequest{Argv: []string{"true"}})
	var apiErr *client.APIError
	if !errors.As(err, &apiErr) || (apiErr.Status != 409 && apiErr.Status != 404) {
		t.Errorf("command on a deleting sandbox: %v, want 409", err)
	}
	admin.WaitOperation(ctx, dop.ID)
}

// TestPathsStayInside: "..", absolute paths and symlinks that point out of
// the sandbox all resolve inside it.
func TestPathsStayInside(t *testing.T) {
	s := need(t)
	c := s.client()
	sb := newSandbox(t, c, client.CreateSandboxRequest{})
	ctx := ctxT(t, time.Minute)
	f, err := c.Files(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("airlock-escape-%d", time.Now().UnixNano())
	hostPath := filepath.Join("/tmp", name)
	defer os.Remove(hostPath)
	if _, err := f.Write(ctx, "../../../../../../tmp/"+name, strings.NewReader("x"), "", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(hostPath); err == nil {
		t.Fatalf("a write to ../../tmp/%s landed on the host", name)
	}
	if r := sh(t, c, sb.ID, "cat /tmp/"+name); r.stdout != "x" {
		t.Errorf("the write did not land inside the sandbox: %q", r.stdout)
	}
	// A symlink to / inside the sandbox is the sandbox's /, not the host's
	// (made by root: the file API follows only root's symlinks in a write's
	// directories, see docs/security.md).
	run(t, c, sb.ID, client.CreateCommandRequest{Argv: []string{"sh", "-c", "ln -s / /home/user/hostroot && ln -s /etc /home/user/etc-link"}, User: "root"}, nil)
	if _, err := f.Write(ctx, "/home/user/hostroot/tmp/"+name+"-2", strings.NewReader("y"), "", ""); err != nil {
		t.Fatal(err)
	}
	// One planted by guest code running as user is refused, naming it.
	sh(t, c, sb.ID, "ln -s / /home/user/userroot")
	if _, err := f.Write(ctx, "/home/user/userroot/tmp/"+name+"-3", strings.NewReader("y"), "", ""); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("a write through a symlink planted by user: %v, want a refusal naming the symlink", err)
	}
	if _, err := os.Stat(hostPath + "-2"); err == nil {
		os.Remove(hostPath + "-2")
		t.Fatal("a write through a symlink landed on the host")
	}
	// Through a symlink to /etc, a file that exists only on the host is
	// absent, and one that exists only inside is read.
	hostOnly := "/etc/airlock-e2e-host-only"
	os.WriteFile(hostOnly, []byte("host"), 0o644)
	defer os.Remove(hostOnly)
	if _, err := f.Stat(ctx, "/home/user/etc-link/airlock-e2e-host-only"); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("host-only file through a symlink: %v, want not found", err)
	}
	run(t, c, sb.ID, client.CreateCommandRequest{Argv: []string{"sh", "-c", "echo inside > /etc/inside-only"}, User: "root"}, nil)
	rc, err := f.Read(ctx, "/home/user/etc-link/inside-only")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "inside\n" {
		t.Errorf("inside-only file through a symlink: %q", b)
	}
	// The agent's channel directory is the only host path mounted in; nothing
	// written there may reach the host.
	f.Write(ctx, agentapi.ChannelDir+"/"+name, strings.NewReader("z"), "", "")
	sh(t, c, sb.ID, "echo z > "+agentapi.ChannelDir+"/"+name+"-sh 2>/dev/null")
	for _, p := range []string{name, name + "-sh"} {
		matches, _ := filepath.Glob(filepath.Join(s.workerDir, "run", sb.ID, "*", p))
		if len(matches) > 0 {
			t.Errorf("a write to the channel dir reached the host: %v", matches)
		}
	}
}

// TestIdempotentCreate: the same Idempotency-Key gives the same sandbox and
// operation.
func TestIdempotentCreate(t *testing.T) {
	s := need(t)
	c := s.client()
	ctx := ctxT(t, 2*time.Minute)
	key := fmt.Sprintf("idem-%d", time.Now().UnixNano())
	sb1, op1, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if op, err := c.DeleteSandbox(context.Background(), sb1.ID); err == nil {
			c.WaitOperation(context.Background(), op.ID)
		}
	})
	sb2, op2, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	if sb1.ID != sb2.ID || op1.ID != op2.ID {
		t.Errorf("retry made (%s, %s), first was (%s, %s)", sb2.ID, op2.ID, sb1.ID, op1.ID)
	}
	c.WaitOperation(ctx, op1.ID)
	page, err := c.ListSandboxes(ctx, client.SandboxFilter{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, sb := range page.Sandboxes {
		if sb.ID == sb1.ID {
			n++
		}
	}
	if n != 1 {
		t.Errorf("sandbox listed %d times", n)
	}
}
