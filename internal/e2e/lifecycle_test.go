package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/snapshot"
)

// counterScript appends its PID and a nanosecond timestamp every 100 ms.
const counterScript = `while :; do echo "$$ $(date +%s%N)" >> counter.log; sleep 0.1; done`

type counterLine struct {
	pid int
	at  time.Time
}

func readCounter(t *testing.T, ctx context.Context, fc *client.FilesClient) []counterLine {
	t.Helper()
	rc, err := fc.Read(ctx, "counter.log")
	if errors.Is(err, model.ErrNotFound) {
		return nil // not written yet
	}
	if err != nil {
		t.Fatalf("read counter: %v", err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatalf("read counter: %v", err)
	}
	var ls []counterLine
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		pid, err1 := strconv.Atoi(f[0])
		ns, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 == nil && err2 == nil {
			ls = append(ls, counterLine{pid, time.Unix(0, ns)})
		}
	}
	return ls
}

// counterAfter waits until the counter has grown past n lines.
func counterAfter(t *testing.T, ctx context.Context, fc *client.FilesClient, n int) []counterLine {
	t.Helper()
	for {
		ls := readCounter(t, ctx, fc)
		if len(ls) > n+2 {
			return ls
		}
		select {
		case <-ctx.Done():
			t.Fatalf("counter stuck at %d lines", len(ls))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func onePID(t *testing.T, ls []counterLine) {
	t.Helper()
	for _, l := range ls {
		if l.pid != ls[0].pid {
			t.Fatalf("counter PID changed from %d to %d", ls[0].pid, l.pid)
		}
	}
}

// lifecycle runs one lifecycle operation and waits for it.
func lifecycle(t *testing.T, ctx context.Context, verb string, do func(context.Context, string) (model.Operation, error), id string) time.Duration {
	t.Helper()
	t0 := time.Now()
	op, err := do(ctx, id)
	if err != nil {
		t.Fatalf("%s: %v", verb, err)
	}
	if _, err := st.client().WaitOperation(ctx, op.ID); err != nil {
		t.Fatalf("%s operation: %v", verb, err)
	}
	return time.Since(t0)
}

// processesOf lists host processes that mention the sandbox id.
func processesOf(id string) []string {
	var ps []string
	for _, l := range leftoversIn(st.workerDir, id) {
		if strings.HasPrefix(l, "process ") {
			ps = append(ps, l)
		}
	}
	return ps
}

// checkSuspended asserts the sandbox is suspended: no process for it on the
// host, and a complete, verified snapshot manifest in the worker's store.
func checkSuspended(t *testing.T, ctx context.Context, c *client.Client, id string) {
	t.Helper()
	sb, err := c.GetSandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != model.StateSuspended || sb.SnapshotID == "" || sb.SnapshotBytes <= 0 {
		t.Fatalf("after suspend: state %s, snapshot %q (%d bytes)", sb.State, sb.SnapshotID, sb.SnapshotBytes)
	}
	if ps := processesOf(id); len(ps) > 0 {
		t.Fatalf("processes for %s while suspended:\n%s", id, strings.Join(ps, "\n"))
	}
	store, err := snapshot.Open(filepath.Join(st.workerDir, "snapshots"))
	if err != nil {
		t.Fatalf("open the worker's snapshot store: %v", err)
	}
	ms, err := store.List(id)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, m := range ms {
		found = found || m.ID == sb.SnapshotID
	}
	if !found {
		t.Fatalf("no manifest for snapshot %s of %s in the worker's store (have %+v)", sb.SnapshotID, id, ms)
	}
	if err := store.Verify(id, sb.SnapshotID); err != nil {
		t.Fatalf("verify snapshot: %v", err)
	}
}

// TestLifecycleCounter is the acceptance through HTTP: a detached
// counter survives a 2 s pause (a gap of at least 2 s, same PID), suspend
// (no process left, manifest present) and wake (same PID), then ten more
// suspend/wake cycles with new files before each, every byte verified.
func TestLifecycleCounter(t *testing.T) {
	s := need(t)
	c := s.client()
	sb := newSandbox(t, c, client.CreateSandboxRequest{})
	ctx := ctxT(t, 20*time.Minute)

	cmd, err := c.CreateCommand(ctx, sb.ID, client.CreateCommandRequest{Argv: []string{"sh", "-c", counterScript}})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := client.AttachCommand(ctx, cmd.AttachURL, cmd.Token, 0)
	if err != nil {
		t.Fatal(err)
	}
	if kind, _, err := sess.Next(); err != nil || kind != agentapi.FrameStarted {
		t.Fatalf("first frame %d: %v", kind, err)
	}
	sess.Close() // detached from here on
	fc, err := c.Files(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	n := len(counterAfter(t, ctx, fc, 5))

	// Pause 2 s.
	d := lifecycle(t, ctx, "pause", c.PauseSandbox, sb.ID)
	t.Logf("pause: %v", d)
	if got, _ := c.GetSandbox(ctx, sb.ID); got.State != model.StatePaused {
		t.Fatalf("after pause: %s", got.State)
	}
	time.Sleep(2 * time.Second)
	d = lifecycle(t, ctx, "resume", c.ResumeSandbox, sb.ID)
	t.Logf("resume: %v", d)
	ls := counterAfter(t, ctx, fc, n)
	onePID(t, ls)
	var gap time.Duration
	for i := 1; i < len(ls); i++ {
		gap = max(gap, ls[i].at.Sub(ls[i-1].at))
	}
	if gap < 2*time.Second {
		t.Fatalf("longest counter gap %v across a 2 s pause", gap)
	}
	t.Logf("counter gap across the pause: %v", gap)

	// Suspend and wake, then ten cycles with a new file before each.
	files := map[string]string{}
	write := func(name string, seed uint64) {
		var key [32]byte
		copy(key[:], fmt.Sprint(seed))
		size := int64(mrand.N(1<<20) + 1)
		h := sha256.New()
		if _, err := fc.Write(ctx, name, io.TeeReader(io.LimitReader(mrand.NewChaCha8(key), size), h), "", ""); err != nil {
			t.Fatalf("write %s: %v", name, err)
		}
		files[name] = hex.EncodeToString(h.Sum(nil))
	}
	for i := 0; i <= 10; i++ {
		if i > 0 {
			write(fmt.Sprintf("cycle-%02d.bin", i), uint64(i)*7919)
		}
		n = len(readCounter(t, ctx, fc))
		ds := lifecycle(t, ctx, "suspend", c.SuspendSandbox, sb.ID)
		checkSuspended(t, ctx, c, sb.ID)
		dw := lifecycle(t, ctx, "wake", c.WakeSandbox, sb.ID)
		t.Logf("cycle %d: suspend %v, wake %v", i, ds, dw)
		onePID(t, counterAfter(t, ctx, fc, n))
	}
	for name, sum := range files {
		rc, err := fc.Read(ctx, name)
		if err != nil {
			t.Fatalf("read %s: %v", name, err)
		}
		h := sha256.New()
		_, err = io.Copy(h, rc)
		rc.Close()
		if err != nil || hex.EncodeToString(h.Sum(nil)) != sum {
			t.Fatalf("%s differs after 10 suspend/wake cycles (err %v)", name, err)
		}
	}
	onePID(t, readCounter(t, ctx, fc))
}

// TestLifecycleAutoWake: a file request to a suspended sandbox wakes it.
func TestLifecycleAutoWake(t *testing.T) {
	s := need(t)
	c := s.client()
	sb := newSandbox(t, c, client.CreateSandboxRequest{})
	ctx := ctxT(t, 5*time.Minute)
	fc, err := c.Files(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fc.Write(ctx, "note.txt", strings.NewReader("still here\n"), "", ""); err != nil {
		t.Fatal(err)
	}
	lifecycle(t, ctx, "suspend", c.SuspendSandbox, sb.ID)
	checkSuspended(t, ctx, c, sb.ID)
	rc, err := fc.Read(ctx, "note.txt")
	if err != nil {
		t.Fatalf("read from a suspended sandbox: %v", err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "still here\n" {
		t.Fatalf("read %q after auto-wake", b)
	}
	for { // the worker served the read once running; the server hears of it at the next sync
		got, err := c.GetSandbox(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == model.StateRunning {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("after auto-wake: %s", got.State)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r := sh(t, c, sb.ID, "cat note.txt"); r.stdout != "still here\n" {
		t.Fatalf("command after auto-wake: %+v", r)
	}
}

// TestLifecycleSIGKILL kills the worker or the server with SIGKILL at a
// random point of a suspend or a wake, 20 times: every sandbox ends up
// usable (running, or suspended and then woken with every file intact and
// the same counter process) or failed and deletable; a wrong or partial
// snapshot would show as a changed file or a new counter PID.
func TestLifecycleSIGKILL(t *testing.T) {
	s := need(t)
	c := s.client()
	ctx := ctxT(t, 40*time.Minute)
	var (
		id    string
		fc    *client.FilesClient
		files map[string]string
	)
	fresh := func() {
		sb := newSandbox(t, c, client.CreateSandboxRequest{})
		id, files = sb.ID, map[string]string{}
		cmd, err := c.CreateCommand(ctx, id, client.CreateCommandRequest{Argv: []string{"sh", "-c", counterScript}})
		if err != nil {
			t.Fatal(err)
		}
		sess, err := client.AttachCommand(ctx, cmd.AttachURL, cmd.Token, 0)
		if err != nil {
			t.Fatal(err)
		}
		sess.Next()
		sess.Close()
		if fc, err = c.Files(ctx, id); err != nil {
			t.Fatal(err)
		}
		counterAfter(t, ctx, fc, 2)
	}
	verify := func(trial int) {
		t.Helper()
		for name, sum := range files {
			rc, err := fc.Read(ctx, name)
			if err != nil {
				t.Fatalf("trial %d: read %s: %v", trial, name, err)
			}
			h := sha256.New()
			_, err = io.Copy(h, rc)
			rc.Close()
			if err != nil || hex.EncodeToString(h.Sum(nil)) != sum {
				t.Fatalf("trial %d: %s differs (err %v)", trial, name, err)
			}
		}
		onePID(t, counterAfter(t, ctx, fc, len(readCounter(t, ctx, fc))))
	}
	fresh()
	lost := 0
	const trials = 20
	for i := range trials {
		name := fmt.Sprintf("trial-%02d.bin", i)
		var key [32]byte
		copy(key[:], name)
		h := sha256.New()
		if _, err := fc.Write(ctx, name, io.TeeReader(io.LimitReader(mrand.NewChaCha8(key), int64(mrand.N(512<<10)+1)), h), "", ""); err != nil {
			t.Fatalf("trial %d: write: %v", i, err)
		}
		files[name] = hex.EncodeToString(h.Sum(nil))

		verb, do := "suspend", c.SuspendSandbox
		if i%2 == 1 { // wake under fire: suspend first
			lifecycle(t, ctx, "suspend", c.SuspendSandbox, id)
			verb, do = "wake", c.WakeSandbox
		}
		op, err := do(ctx, id)
		if err != nil {
			t.Fatalf("trial %d: %s: %v", i, verb, err)
		}
		time.Sleep(time.Duration(mrand.N(300)) * time.Millisecond)
		victim := "worker"
		if i%4 >= 2 {
			victim = "server"
			kill(s.server, syscall.SIGKILL)
			if err := s.startServer(); err != nil {
				t.Fatal(err)
			}
			if err := s.waitHealthy(ctx); err != nil {
				t.Fatal(err)
			}
		} else {
			kill(s.worker, syscall.SIGKILL)
			if err := s.startWorker(); err != nil {
				t.Fatal(err)
			}
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		done, _ := c.WaitOperation(wctx, op.ID)
		cancel()
		var sb model.Sandbox
		for {
			if sb, err = c.GetSandbox(ctx, id); err != nil {
				t.Fatalf("trial %d: get: %v", i, err)
			}
			if sb.State == model.StateRunning || sb.State == model.StateSuspended || sb.State == model.StateFailed {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("trial %d: sandbox stuck in %s", i, sb.State)
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Logf("trial %d: %s, SIGKILL %s: operation %s %q; sandbox %s %q", i, verb, victim, done.State, done.Reason, sb.State, sb.Reason)
		switch sb.State {
		case model.StateFailed:
			lost++
			dop, err := c.DeleteSandbox(ctx, id)
			if err != nil {
				t.Fatalf("trial %d: delete a failed sandbox: %v", i, err)
			}
			if _, err := c.WaitOperation(ctx, dop.ID); err != nil {
				t.Fatalf("trial %d: delete a failed sandbox: %v", i, err)
			}
			fresh()
			continue
		case model.StateSuspended:
			checkSuspended(t, ctx, c, id)
			lifecycle(t, ctx, "wake", c.WakeSandbox, id)
		}
		waitUsable(t, c, id) // a restarted worker serves again
		verify(i)
	}
	t.Logf("%d of %d trials lost the sandbox (failed, deleted)", lost, trials)
}
