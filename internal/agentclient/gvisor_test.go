package agentclient_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/testenv"
)

// testCache is the machine's shared test set-up (runsc built from source,
// the debootstrapped Debian layer), used when the variables below are unset.
const testCache = "/var/tmp/airlock-test-cache"

// TestInGVisor runs the agent as PID 1 of a real gVisor sandbox, dialing
// out over a bind-mounted unix socket (--host-uds=open). It needs
// AIRLOCK_TEST_RUNSC (a runsc binary) and AIRLOCK_TEST_ROOTFS (a Debian
// rootfs directory, used read-only), or the shared test cache's.
func TestInGVisor(t *testing.T) {
	testenv.RequireRunsc(t)
	runsc, rootfs := os.Getenv("AIRLOCK_TEST_RUNSC"), os.Getenv("AIRLOCK_TEST_ROOTFS")
	if runsc == "" && rootfs == "" {
		_, err1 := os.Stat(filepath.Join(testCache, "bin", "runsc"))
		_, err2 := os.Stat(filepath.Join(testCache, "cache", "debian-bookworm.done"))
		if err1 == nil && err2 == nil {
			runsc, rootfs = filepath.Join(testCache, "bin", "runsc"), filepath.Join(testCache, "cache", "debian-bookworm")
		}
	}
	if runsc == "" || rootfs == "" {
		t.Skipf("needs runsc and a Debian rootfs: set AIRLOCK_TEST_RUNSC and AIRLOCK_TEST_ROOTFS, or set up %s", testCache)
	}
	bin := buildAgent(t)
	dir, err := os.MkdirTemp("", "airlock-gv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	chanDir := filepath.Join(dir, "chan")
	state := filepath.Join(dir, "state")
	for _, d := range []string{chanDir, state} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("unix", filepath.Join(chanDir, agentapi.ChannelSocket))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	conns := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- c
		}
	}()
	caps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID",
		"CAP_SETUID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_AUDIT_WRITE"}
	spec := map[string]any{
		"ociVersion": "1.0.0",
		"process": map[string]any{
			"user":         map[string]any{"uid": 0, "gid": 0},
			"args":         []string{"/airlock-agent", "-v"},
			"env":          []string{"PATH=/usr/bin:/bin"},
			"cwd":          "/",
			"capabilities": map[string]any{"bounding": caps, "effective": caps, "permitted": caps},
		},
		"root":     map[string]any{"path": rootfs, "readonly": false},
		"hostname": "sandbox",
		"mounts": []map[string]any{
			{"destination": "/proc", "type": "proc", "source": "proc"},
			{"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
			{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"},
			{"destination": "/airlock-agent", "type": "bind", "source": bin, "options": []string{"rbind", "ro"}},
			{"destination": agentapi.ChannelDir, "type": "bind", "source": chanDir, "options": []string{"rbind", "rw"}},
		},
		"linux": map[string]any{"namespaces": []map[string]any{
			{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}}},
	}
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	id := "airlock-agent-test-" + strconv.Itoa(os.Getpid())
	var logs bytes.Buffer
	cmd := exec.Command(runsc, "--root", state, "--host-uds=open", "--overlay2=root:memory", "--network=none",
		"run", "--bundle", dir, id)
	cmd.Stdout, cmd.Stderr = &lockedWriter{w: &logs}, &lockedWriter{w: &logs}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = exec.Command(runsc, "--root", state, "delete", "-force", id).Run()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = syscall.Unmount(filepath.Join(state, "null-netns"), 0) // runsc leaves this nsfs mount
		if t.Failed() {
			t.Logf("runsc output:\n%s", logs.String())
		}
	})
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) {
		select {
		case c := <-conns:
			return c, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	defer c.Close()
	ctx := testCtx(t)
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	health, err := c.Health(ctx)
	if err != nil || health.PID != 1 {
		t.Fatalf("health %+v %v, want PID 1", health, err)
	}
	h := &host{tb: t, client: c}

	r := h.run(ctx, agentapi.ProcessSpec{Argv: []string{"sh", "-c", "echo $HOME; id -u nobody >/dev/null && echo ok"}})
	if r.stdout.String() != "/root\nok\n" || r.exit.ExitCode != 0 {
		t.Fatalf("stdout %q stderr %q exit %+v", r.stdout.String(), r.stderr.String(), r.exit)
	}
	r = h.run(ctx, agentapi.ProcessSpec{User: "nobody", Cwd: "/", Argv: []string{"id", "-u"}})
	if r.stdout.String() != "65534\n" {
		t.Fatalf("as nobody: stdout %q stderr %q exit %+v", r.stdout.String(), r.stderr.String(), r.exit)
	}

	// An orphan is re-parented to the agent (PID 1), which must reap it.
	r = h.run(ctx, agentapi.ProcessSpec{Argv: []string{"sh", "-c", "sleep 0.2 </dev/null >/dev/null 2>&1 & echo $!"}})
	orphan := strings.TrimSpace(r.stdout.String())
	if _, err := strconv.Atoi(orphan); err != nil || r.exit.ExitCode != 0 {
		t.Fatalf("orphan pid %q, exit %+v", orphan, r.exit)
	}
	r = h.run(ctx, agentapi.ProcessSpec{Argv: []string{"sh", "-c",
		`i=0; while [ -e /proc/$0 ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; [ -e /proc/$0 ] && grep State /proc/$0/status || echo reaped`, orphan}})
	if r.stdout.String() != "reaped\n" {
		t.Fatalf("orphan %s not reaped: %q", orphan, r.stdout.String())
	}

	// Output and files through the sandbox.
	r = h.run(ctx, agentapi.ProcessSpec{Argv: []string{"sh", "-c", "head -c 3000000 /dev/zero; head -c 2000000 /dev/zero >&2"}})
	if r.stdout.Len() != 3000000 || r.stderr.Len() != 2000000 || r.exit.ExitCode != 0 {
		t.Fatalf("stdout %d stderr %d exit %+v", r.stdout.Len(), r.stderr.Len(), r.exit)
	}
	data := bytes.Repeat([]byte("airlock"), 1<<20)
	if _, err := c.WriteFile(ctx, "/tmp/x/f", "0600", "", bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	rc, info, err := c.ReadFile(ctx, "/tmp/x/f")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data) || info.Mode != "0600" {
		t.Fatalf("read back %d bytes (equal %v), mode %s, %v", len(got), bytes.Equal(got, data), info.Mode, err)
	}

	t.Run("symlink planted by guest user", func(t *testing.T) {
		// nobody in the guest plants symlinks to a root-only directory; the
		// file API (root, PID 1) must not write, mkdir, move or remove there.
		if _, err := c.Mkdir(ctx, agentapi.Mkdir{Path: "/tmp/home", Owner: "nobody"}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Mkdir(ctx, agentapi.Mkdir{Path: "/tmp/secret", Mode: "0700", Owner: "root"}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteFile(ctx, "/tmp/secret/victim", "0600", "root", strings.NewReader("root's")); err != nil {
			t.Fatal(err)
		}
		run := func(argv ...string) int {
			return h.run(ctx, agentapi.ProcessSpec{User: "nobody", Cwd: "/", Argv: argv}).exit.ExitCode
		}
		symlinkAttack(ctx, t, c, run, "nobody", "/tmp/home", "/tmp/secret")
		es, err := c.List(ctx, "/tmp/secret")
		if err != nil || len(es) != 1 || es[0].Name != "victim" || es[0].Size != int64(len("root's")) {
			t.Fatalf("the protected directory holds %+v (%v), want only the untouched victim", es, err)
		}
	})

	t.Run("signal reaches every process", func(t *testing.T) {
		// One child ignores TERM, one leaves the session; both write a line
		// once running. TERM ends the command, and no sleep is left.
		id := newID()
		if _, err := c.StartProcess(ctx, agentapi.ProcessSpec{ID: id, User: "root", Argv: []string{"sh", "-c",
			`(trap "" TERM; echo a; exec sleep 1000) & setsid sh -c 'echo b; exec sleep 1000' & wait`}}); err != nil {
			t.Fatal(err)
		}
		s, err := c.Output(ctx, id, 0)
		if err != nil {
			t.Fatal(err)
		}
		var seen string
		for !strings.Contains(seen, "a") || !strings.Contains(seen, "b") {
			kind, payload, err := s.Next()
			if err != nil || kind != agentapi.FrameStdout {
				t.Fatalf("frame %d %q %v", kind, payload, err)
			}
			seen += string(payload)
		}
		if err := c.Signal(ctx, id, "TERM"); err != nil {
			t.Fatal(err)
		}
		r := collect(t, s)
		if r.exit.Signal != "TERM" {
			t.Fatalf("exit %+v, want TERM", r.exit)
		}
		left := h.run(ctx, agentapi.ProcessSpec{Argv: []string{"sh", "-c", `for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done`}})
		if strings.Contains(left.stdout.String(), "sleep") {
			t.Fatalf("processes left in the sandbox:\n%s", left.stdout.String())
		}
	})
}
