package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/model"
)

// TestWorkerKilledDuringRunscCheckpoint SIGKILLs the worker process at the
// moment `runsc checkpoint` of a sandbox runs (found in /proc), during a
// suspend and during a checkpoint task (what a fork starts with), restarts
// it, and requires the sandbox to come through intact: the suspend ends
// suspended and wakes with its file byte for byte, the checkpoint ends
// with the sandbox running and the checkpoint usable for a fork; and once
// more while a rollback's `runsc delete` runs (the sandbox ends rolled
// back). (Before
// the checkpoint helper, runsc checkpoint completed after the worker died,
// nobody marked the snapshot complete, and the restarted worker failed the
// sandbox: "could not be adopted after a worker restart".)
func TestWorkerKilledDuringRunscCheckpoint(t *testing.T) {
	s := need(t)
	ctx := ctxT(t, 15*time.Minute)
	admin := s.client()
	org, err := admin.CreateOrg(ctx, "crash-"+time.Now().Format("150405.000"))
	if err != nil {
		t.Fatal(err)
	}
	fs := []string{model.FeatureSnapshots}
	if _, err := admin.UpdateOrg(ctx, org.ID, client.UpdateOrgRequest{Features: &fs}); err != nil {
		t.Fatal(err)
	}
	k, err := admin.CreateKey(ctx, org.ID, client.CreateKeyRequest{Name: "crash"})
	if err != nil {
		t.Fatal(err)
	}
	c := client.New(s.url(), k.Secret)
	sb := newSandbox(t, c, client.CreateSandboxRequest{})
	sum := strings.TrimSpace(sh(t, c, sb.ID, "head -c 8388608 /dev/urandom > /root/crash.bin && sha256sum < /root/crash.bin").stdout)
	check := func(t *testing.T, id, when string) {
		t.Helper()
		waitUsable(t, c, id)
		if got := strings.TrimSpace(sh(t, c, id, "sha256sum < /root/crash.bin").stdout); got != sum {
			t.Fatalf("%s: /root/crash.bin of %s has sha256 %q, want %q", when, id, got, sum)
		}
	}

	// killDuring starts op and SIGKILLs the worker once runsc checkpoint of
	// sb runs; it reports whether it caught that moment (the checkpoint of
	// a small sandbox is short: then the caller tries again).
	killDuring := func(t *testing.T, verb string, start func() (model.Operation, error)) (model.Operation, bool) {
		t.Helper()
		found := make(chan bool, 1)
		wctx, cancel := context.WithCancel(ctx)
		go func() { found <- watchRunsc(wctx, verb, sb.ID) }()
		op, err := start()
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			c.WaitOperation(wctx, op.ID)
			close(done)
		}()
		caught := false
		select {
		case caught = <-found:
		case <-done:
		}
		if caught {
			kill(s.worker, syscall.SIGKILL)
			t.Logf("worker SIGKILLed while runsc %s of %s ran (%s)", verb, sb.ID, op.Kind)
			if err := s.startWorker(); err != nil {
				t.Fatal(err)
			}
		}
		cancel()
		wctx2, cancel2 := context.WithTimeout(ctx, 4*time.Minute)
		defer cancel2()
		done2, err := c.WaitOperation(wctx2, op.ID)
		if err != nil && done2.State == "" {
			done2, _ = c.GetOperation(ctx, op.ID)
		}
		return done2, caught
	}
	settled := func(t *testing.T, want model.SandboxState) model.Sandbox {
		t.Helper()
		for {
			got, err := c.GetSandbox(ctx, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			switch got.State {
			case model.StateRunning, model.StateSuspended, model.StatePaused, model.StateFailed:
				if got.State != want {
					t.Fatalf("sandbox %s is %s (%q), want %s", sb.ID, got.State, got.Reason, want)
				}
				return got
			}
			if ctx.Err() != nil {
				t.Fatalf("sandbox %s stuck in %s", sb.ID, got.State)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	wake := func(t *testing.T) {
		t.Helper()
		op, err := c.WakeSandbox(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.WaitOperation(ctx, op.ID); err != nil {
			t.Fatalf("wake: %v", err)
		}
		settled(t, model.StateRunning)
	}

	t.Run("suspend", func(t *testing.T) {
		for attempt := 1; ; attempt++ {
			op, caught := killDuring(t, "checkpoint", func() (model.Operation, error) { return c.SuspendSandbox(ctx, sb.ID) })
			got := settled(t, model.StateSuspended)
			t.Logf("attempt %d: suspend %s (%s); sandbox %s %q", attempt, op.State, op.Reason, got.State, got.Reason)
			wake(t)
			check(t, sb.ID, "after a suspend")
			if caught {
				return
			}
			if attempt == 10 {
				t.Skip("SKIP: never caught runsc checkpoint running in 10 suspends")
			}
		}
	})
	t.Run("checkpoint", func(t *testing.T) {
		for attempt := 1; ; attempt++ {
			name := "crash" + string(rune('a'+attempt))
			op, caught := killDuring(t, "checkpoint", func() (model.Operation, error) { return c.CreateCheckpoint(ctx, sb.ID, name) })
			got := settled(t, model.StateRunning)
			t.Logf("attempt %d: checkpoint %s (%s); sandbox %s %q", attempt, op.State, op.Reason, got.State, got.Reason)
			check(t, sb.ID, "after a checkpoint")
			if op.State == model.OpSucceeded {
				forks, err := c.ForkSandbox(ctx, client.CreateSandboxRequest{FromCheckpoint: &client.CheckpointRef{SandboxID: sb.ID, Checkpoint: name}}, "")
				if err != nil {
					t.Fatalf("fork: %v", err)
				}
				for _, f := range forks {
					id := f.Sandbox.ID
					t.Cleanup(func() { deleteSandbox(t, context.Background(), c, id) })
					if _, err := c.WaitOperation(ctx, f.Operation.ID); err != nil {
						t.Fatalf("fork %s: %v", id, err)
					}
					check(t, id, "in a fork of the checkpoint")
				}
			} else if caught {
				t.Logf("the checkpoint cut short by the crash failed: %s", op.Reason)
			}
			if caught {
				return
			}
			if attempt == 10 {
				t.Skip("SKIP: never caught runsc checkpoint running in 10 checkpoints")
			}
		}
	})
	// A rollback releases the runtime, then restores the checkpoint: a
	// worker killed in between (while runsc delete runs) must not lose the
	// sandbox.
	t.Run("rollback", func(t *testing.T) {
		op, err := c.CreateCheckpoint(ctx, sb.ID, "rb")
		if err != nil {
			t.Fatal(err)
		}
		if op, err = c.WaitOperation(ctx, op.ID); err != nil || op.State != model.OpSucceeded {
			t.Fatalf("checkpoint rb: %+v, %v", op, err)
		}
		for attempt := 1; ; attempt++ {
			sh(t, c, sb.ID, "echo after > /root/crash.bin")
			op, caught := killDuring(t, "delete", func() (model.Operation, error) { return c.RollbackSandbox(ctx, sb.ID, "rb") })
			got := settled(t, model.StateRunning)
			t.Logf("attempt %d: rollback %s (%s); sandbox %s %q", attempt, op.State, op.Reason, got.State, got.Reason)
			check(t, sb.ID, "after a rollback")
			if caught {
				return
			}
			if attempt == 10 {
				t.Skip("SKIP: never caught runsc delete running in 10 rollbacks")
			}
		}
	})
}

// watchRunsc returns true once a `runsc … verb … id` process runs, false
// when ctx ends first.
func watchRunsc(ctx context.Context, verb, id string) bool {
	for ctx.Err() == nil {
		ents, err := os.ReadDir("/proc")
		if err != nil {
			return false
		}
		for _, e := range ents {
			if e.Name()[0] < '0' || e.Name()[0] > '9' {
				continue
			}
			b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if err != nil {
				if errors.Is(err, os.ErrNotExist) {
					continue
				}
				continue
			}
			args := strings.Split(string(b), "\x00")
			if len(args) > 2 && strings.HasSuffix(args[0], "runsc") && hasArg(args, verb) && hasArg(args, id) {
				return true
			}
		}
	}
	return false
}

func hasArg(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
