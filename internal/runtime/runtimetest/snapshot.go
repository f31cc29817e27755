package runtimetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/runtime"
)

// callTimeout bounds one agent call, so that a dead channel fails the test
// instead of hanging it.
const callTimeout = 60 * time.Second

// snapshotter returns the driver as a runtime.Snapshotter or skips.
func (s *suite) snapshotter(t *testing.T) runtime.Snapshotter {
	t.Helper()
	sn, ok := s.d.(runtime.Snapshotter)
	if !ok {
		t.Skipf("driver %s does not implement runtime.Snapshotter", s.d.Name())
	}
	return sn
}

// waitReady waits for b's agent to answer.
func (s *suite) waitReady(t *testing.T, b *box) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.BootTimeout)
	defer cancel()
	if err := b.c.WaitReady(ctx); err != nil {
		t.Fatalf("agent of %s: %v", b.id, err)
	}
}

// counter starts a guest loop appending "<pid> <n>" to path about every
// 50 ms, n counting up from 1.
func (s *suite) counter(t *testing.T, b *box, path string) {
	t.Helper()
	if _, err := b.c.StartProcess(context.Background(), agentapi.ProcessSpec{ID: "counter", User: "root", Argv: []string{"bash", "-c",
		`i=0; while :; do i=$((i+1)); echo "$$ $i" >> ` + path + `; sleep 0.05; done`}}); err != nil {
		t.Fatalf("start counter: %v", err)
	}
}

// counterLines reads the counter file and checks it counts 1, 2, 3... from
// one PID; it returns that PID and the last value.
func (s *suite) counterLines(t *testing.T, b *box, path string) (pid string, last int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	rc, _, err := b.c.ReadFile(ctx, path)
	if err != nil {
		if ctx.Err() != nil {
			t.Fatalf("%s: read %s: %v", b.id, path, err)
		}
		return "", 0
	}
	data, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue // a line being written
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			t.Fatalf("counter line %q", l)
		}
		if pid == "" {
			pid = f[0]
		}
		if f[0] != pid || n != last+1 {
			t.Fatalf("counter restarted or skipped: after %s %d came %q", pid, last, l)
		}
		last = n
	}
	return pid, last
}

// waitCounter waits until the counter passes min and returns its PID and value.
func (s *suite) waitCounter(t *testing.T, b *box, path string, min int) (string, int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		pid, n := s.counterLines(t, b, path)
		if n > min {
			return pid, n
		}
		if time.Now().After(deadline) {
			t.Fatalf("the guest counter in %s does not pass %d (at %d)", b.id, min, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// randomFile writes n random bytes to path in the guest through the agent
// and returns their sha256.
func randomFile(t *testing.T, b *box, path string, n int) string {
	t.Helper()
	data := make([]byte, n)
	rand.Read(data)
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if _, err := b.c.WriteFile(ctx, path, "0644", "", bytes.NewReader(data)); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// fileSum reads path from the guest and returns its sha256 ("" if absent).
func fileSum(t *testing.T, b *box, path string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	rc, _, err := b.c.ReadFile(ctx, path)
	if err != nil {
		if ctx.Err() != nil {
			t.Fatalf("%s: read %s: %v", b.id, path, err)
		}
		return ""
	}
	defer rc.Close()
	h := sha256.New()
	if _, err := io.Copy(h, rc); err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// testSuspendWake checkpoints, deletes and restores one sandbox under the
// same id Options.SuspendWakeCycles times (the second time from paused): the guest process
// keeps its PID and its counter goes on, and every file comes back byte for
// byte.
func (s *suite) testSuspendWake(t *testing.T) {
	sn := s.snapshotter(t)
	b := s.start(t)
	ctx := context.Background()
	loops := !s.opts.Simulated // a guest process that survives each cycle
	if !loops {
		t.Logf("SKIP (in part): a guest process surviving suspend and wake needs a Linux guest; driver %s simulates its guest; files are checked", s.d.Name())
	}
	var pid string
	if loops {
		s.counter(t, b, "/tmp/count")
		pid, _ = s.waitCounter(t, b, "/tmp/count", 3)
	}
	files := map[string]string{}
	s.sh(t, b, "mkdir -p /home/user/data /opt/x")
	for cycle := 1; cycle <= s.opts.SuspendWakeCycles; cycle++ {
		files[fmt.Sprintf("/home/user/data/c%d.bin", cycle)] = randomFile(t, b, fmt.Sprintf("/home/user/data/c%d.bin", cycle), (1<<20)+cycle*4097)
		files[fmt.Sprintf("/opt/x/small%d", cycle)] = randomFile(t, b, fmt.Sprintf("/opt/x/small%d", cycle), cycle*13)
		// A file the guest writes itself, and one it deletes from the template.
		if loops {
			s.sh(t, b, fmt.Sprintf("head -c 3000000 /dev/urandom > /root/guest%d.bin", cycle))
		} else {
			s.sh(t, b, fmt.Sprintf("echo guest %d > /root/guest%d.bin", cycle, cycle))
		}
		files[fmt.Sprintf("/root/guest%d.bin", cycle)] = fileSum(t, b, fmt.Sprintf("/root/guest%d.bin", cycle))
		if cycle == 1 {
			s.sh(t, b, "rm /etc/debian_version")
		}
		var before int
		if loops {
			_, before = s.counterLines(t, b, "/tmp/count")
		}

		if cycle == 2 {
			p, ok := s.d.(runtime.Pauser)
			if ok {
				if err := p.Pause(ctx, b.id); err != nil {
					t.Fatalf("cycle %d: Pause: %v", cycle, err)
				}
			}
		}
		dir := filepath.Join(t.TempDir(), "image")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := sn.Checkpoint(ctx, b.id, dir, false); err != nil {
			t.Fatalf("cycle %d: Checkpoint: %v", cycle, err)
		}
		b.c.Close()
		b.sb.Close()
		if err := s.d.Delete(ctx, b.id); err != nil {
			t.Fatalf("cycle %d: Delete after Checkpoint: %v", cycle, err)
		}
		s.assertGone(t, b.id)
		if entries, _ := os.ReadDir(dir); len(entries) == 0 {
			t.Fatalf("cycle %d: Checkpoint wrote nothing into %s", cycle, dir)
		}
		t.Logf("cycle %d: image of %s", cycle, dirSize(dir))

		rctx, cancel := context.WithTimeout(ctx, s.opts.BootTimeout)
		sb, err := sn.Restore(rctx, s.spec(b.id), dir)
		if err != nil {
			cancel()
			t.Fatalf("cycle %d: Restore: %v", cycle, err)
		}
		b.sb = sb
		b.c = agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
		err = b.c.WaitReady(rctx)
		cancel()
		if err != nil {
			t.Fatalf("cycle %d: agent after Restore: %v", cycle, err)
		}
		// The worker deletes the snapshot once the sandbox runs: nothing
		// may still need the image (lazily loaded pages, say).
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		if st, err := s.d.Status(ctx, b.id); err != nil || st != runtime.StatusRunning {
			t.Errorf("cycle %d: Status after Restore = %q, %v; want running", cycle, st, err)
		}
		if loops {
			gotPID, n := s.waitCounter(t, b, "/tmp/count", before+3)
			if gotPID != pid {
				t.Errorf("cycle %d: counter PID %s after wake, was %s", cycle, gotPID, pid)
			}
			t.Logf("cycle %d: counter %d before suspend, %d after wake (pid %s)", cycle, before, n, gotPID)
		}
		for path, want := range files {
			if got := fileSum(t, b, path); got != want {
				t.Errorf("cycle %d: %s sha256 %q after wake, want %s", cycle, path, got, want)
			}
		}
		if out, code := s.exec(t, b, "cat", "/etc/debian_version"); code == 0 {
			t.Errorf("cycle %d: a deleted template file is back after wake: %q", cycle, out)
		}
	}
	if !loops {
		return
	}
	infos, err := b.c.ListProcesses(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range infos {
		if p.ID == "counter" && (!p.Running || strconv.Itoa(p.PID) != pid) {
			t.Errorf("agent reports counter %+v, want running with pid %s", p, pid)
		}
	}
}

// testFork checkpoints a running sandbox without stopping it and restores
// the image into two new ids: the original and both copies run, each copy
// starts from the checkpointed files and counter, and writes in one are
// invisible in the others.
func (s *suite) testFork(t *testing.T) {
	sn := s.snapshotter(t)
	orig := s.start(t)
	ctx := context.Background()
	loops := !s.opts.Simulated
	if !loops {
		t.Logf("SKIP (in part): guest processes running on in the original and the forks need a Linux guest; driver %s simulates its guest; files and channels are checked", s.d.Name())
	}
	if loops {
		s.counter(t, orig, "/tmp/count")
		_, _ = s.waitCounter(t, orig, "/tmp/count", 3)
	}
	shared := randomFile(t, orig, "/home/user/shared.bin", 2<<20)
	dir := filepath.Join(t.TempDir(), "image")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	var before int
	if loops {
		_, before = s.counterLines(t, orig, "/tmp/count")
	}
	if err := sn.Checkpoint(ctx, orig.id, dir, true); err != nil {
		t.Fatalf("Checkpoint leaving it running: %v", err)
	}
	if st, err := s.d.Status(ctx, orig.id); err != nil || st != runtime.StatusRunning {
		t.Fatalf("Status after Checkpoint(leaveRunning) = %q, %v; want running", st, err)
	}
	// The channel may be re-established across a checkpoint (gvisor
	// restores in place): wait for the agent as after a wake.
	s.waitReady(t, orig)
	if loops {
		s.waitCounter(t, orig, "/tmp/count", before+3)
	}

	ids := []string{s.opts.NewID(), s.opts.NewID()}
	forks := make([]*box, len(ids))
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ft := &forkT{}
			b := s.restoreNoFatal(ctx, ft, sn, id, dir)
			mu.Lock()
			forks[i] = b
			if ft.err != nil {
				t.Errorf("fork %s: %v", id, ft.err)
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, b := range forks {
			if b != nil {
				b.c.Close()
				b.sb.Close()
				if err := s.d.Delete(context.Background(), b.id); err != nil {
					t.Errorf("Delete %s: %v", b.id, err)
				}
				s.assertGone(t, b.id)
			}
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	all := append([]*box{orig}, forks...)
	for _, b := range forks {
		if got := fileSum(t, b, "/home/user/shared.bin"); got != shared {
			t.Errorf("fork %s: shared.bin sha256 %q, want %s", b.id, got, shared)
		}
		if loops {
			s.waitCounter(t, b, "/tmp/count", before+3)
		}
		host := strings.TrimSpace(s.sh(t, b, "hostname"))
		t.Logf("fork %s: hostname %q (restored with Hostname \"fork\", checkpointed as \"conformance\")", b.id, host)
	}
	// Each agent answers on its own channel: what a client writes through
	// one box is only in that sandbox.
	for _, b := range all {
		if _, err := b.c.WriteFile(ctx, "/tmp/who", "", "", strings.NewReader(b.id)); err != nil {
			t.Fatalf("%s: write /tmp/who: %v", b.id, err)
		}
		s.sh(t, b, "echo mine > /tmp/only-"+b.id)
	}
	for _, b := range all {
		if out := s.sh(t, b, "cat /tmp/who"); out != b.id {
			t.Errorf("sandbox %s reads /tmp/who = %q: channels or overlays are shared", b.id, out)
		}
		for _, other := range all {
			_, code := s.exec(t, b, "test", "-e", "/tmp/only-"+other.id)
			if (code == 0) != (other == b) {
				t.Errorf("sandbox %s: /tmp/only-%s exists=%v", b.id, other.id, code == 0)
			}
		}
	}
}

// forkT collects the first failure of a restore run off the test goroutine.
type forkT struct{ err error }

// restoreNoFatal is restore for use off the test goroutine.
func (s *suite) restoreNoFatal(ctx context.Context, ft *forkT, sn runtime.Snapshotter, id, dir string) *box {
	rctx, cancel := context.WithTimeout(ctx, s.opts.BootTimeout)
	defer cancel()
	spec := s.spec(id)
	spec.Hostname = "fork" // logged, not checked: drivers may keep the guest's
	sb, err := sn.Restore(rctx, spec, dir)
	if err != nil {
		ft.err = fmt.Errorf("Restore: %w", err)
		return nil
	}
	b := &box{id: id, sb: sb}
	b.c = agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
	if err := b.c.WaitReady(rctx); err != nil {
		ft.err = fmt.Errorf("agent after Restore: %w", err)
	}
	return b
}

// testRestoreFailure restores from images that cannot work and from an id
// that exists: each fails and leaves nothing (or the existing sandbox
// untouched).
func (s *suite) testRestoreFailure(t *testing.T) {
	sn := s.snapshotter(t)
	ctx := context.Background()
	garbage := t.TempDir()
	junk := make([]byte, 64<<10)
	rand.Read(junk)
	for _, name := range []string{"checkpoint.img", "pages.img", "pages_meta.img"} {
		if err := os.WriteFile(filepath.Join(garbage, name), junk, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct{ name, dir string }{
		{"empty dir", t.TempDir()},
		{"garbage", garbage},
		{"missing dir", filepath.Join(t.TempDir(), "nope")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := s.opts.NewID()
			rctx, cancel := context.WithTimeout(ctx, s.opts.BootTimeout)
			defer cancel()
			sb, err := sn.Restore(rctx, s.spec(id), tt.dir)
			if err == nil {
				sb.Close()
				s.d.Delete(ctx, id)
				t.Fatalf("Restore from %s succeeded", tt.name)
			}
			t.Logf("Restore from %s: %v", tt.name, err)
			s.assertGone(t, id)
		})
	}
	t.Run("existing id", func(t *testing.T) {
		b := s.start(t)
		dir := t.TempDir()
		if err := sn.Checkpoint(ctx, b.id, dir, true); err != nil {
			t.Fatalf("Checkpoint: %v", err)
		}
		s.waitReady(t, b)
		if _, err := sn.Restore(ctx, s.spec(b.id), dir); err == nil {
			t.Fatal("Restore over a running sandbox succeeded")
		}
		if out := s.sh(t, b, "echo alive"); out != "alive\n" {
			t.Errorf("the running sandbox was disturbed: %q", out)
		}
	})
	t.Run("checkpoint unknown id", func(t *testing.T) {
		if err := sn.Checkpoint(ctx, s.opts.NewID(), t.TempDir(), false); err == nil {
			t.Error("Checkpoint of an unknown id succeeded")
		}
	})
}

// dirSize describes the total size of the files under dir.
func dirSize(dir string) string {
	var n int64
	var files int
	filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() {
			if fi, err := e.Info(); err == nil {
				n += fi.Size()
				files++
			}
		}
		return nil
	})
	return fmt.Sprintf("%d files, %.1f MiB", files, float64(n)/(1<<20))
}
