package e2e

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/model"
)

// TestRestarts kills the worker and then the server with SIGKILL while
// sandboxes run: the sandboxes survive, stay usable, keep their processes,
// and an operation pending across a server crash completes.
func TestRestarts(t *testing.T) {
	s := need(t)
	c := s.client()
	sb := newSandbox(t, c, client.CreateSandboxRequest{})
	ctx := ctxT(t, 5*time.Minute)
	// A detached counter whose PID must survive both restarts.
	cmd, err := c.CreateCommand(ctx, sb.ID, client.CreateCommandRequest{
		Argv: []string{"sh", "-c", "while :; do echo $$ >> /tmp/ticks; sleep 0.1; done"}})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := client.AttachCommand(ctx, cmd.AttachURL, cmd.Token, 0)
	if err != nil {
		t.Fatal(err)
	}
	sess.Next()
	sess.Close()
	time.Sleep(500 * time.Millisecond)
	pid := strings.TrimSpace(sh(t, c, sb.ID, "tail -n1 /tmp/ticks").stdout)
	if pid == "" {
		t.Fatal("counter not running")
	}

	// Worker crash: SIGKILL, then start again on the same data dir.
	kill(s.worker, syscall.SIGKILL)
	if err := s.startWorker(); err != nil {
		t.Fatal(err)
	}
	waitUsable(t, c, sb.ID)
	if got := strings.TrimSpace(sh(t, c, sb.ID, "sleep 0.3; tail -n1 /tmp/ticks").stdout); got != pid {
		t.Errorf("counter pid after worker restart %q, want %q", got, pid)
	}

	// Server crash with an operation in flight.
	sb2, op2, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if op, err := c.DeleteSandbox(context.Background(), sb2.ID); err == nil {
			c.WaitOperation(context.Background(), op.ID)
		}
	})
	kill(s.server, syscall.SIGKILL)
	if err := s.startServer(); err != nil {
		t.Fatal(err)
	}
	if err := s.waitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	if op, err := c.WaitOperation(ctx, op2.ID); err != nil || op.State != model.OpSucceeded {
		t.Fatalf("operation across a server crash: %v %+v", err, op)
	}
	waitUsable(t, c, sb2.ID)
	got, err := c.GetSandbox(ctx, sb.ID)
	if err != nil || got.State != model.StateRunning {
		t.Fatalf("sandbox after server restart: %v %+v", err, got)
	}
	if r := sh(t, c, sb.ID, "sleep 0.3; tail -n1 /tmp/ticks"); strings.TrimSpace(r.stdout) != pid {
		t.Errorf("counter pid after server restart %q, want %q", r.stdout, pid)
	}
}

// waitUsable waits until a command runs in the sandbox (the worker may still
// be re-adopting it).
func waitUsable(t *testing.T, c *client.Client, id string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cmd, err := c.CreateCommand(ctx, id, client.CreateCommandRequest{Argv: []string{"true"}})
		if err == nil {
			var exit, e2 = client.RunCommand(ctx, cmd.AttachURL, cmd.Token, nil, nil, nil)
			err = e2
			if err == nil && exit.ExitCode == 0 {
				cancel()
				return
			}
		}
		cancel()
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s not usable: %v", id, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
}
