package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/model"
)

// TestQEMUPanicLineKeepsWorker is the attack of finding H1 through the
// whole stack: guest root in a qemu sandbox writes a 9 MB
// "Kernel panic - not syncing: AAAA…" line to its console and resets the
// VM. Before the fix the line became the sandbox's reason, travelled in
// every Sync of the worker, every sync was a 413 and the worker (with
// every tenant's sandboxes on it) was declared unreachable. Now the
// sandbox fails with a bounded reason and the worker keeps serving: a new
// sandbox starts on it and runs a command.
func TestQEMUPanicLineKeepsWorker(t *testing.T) {
	s := need(t)
	c := s.client()
	ctx := ctxT(t, 20*time.Minute)
	sb, op, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Runtime: "qemu"}, "")
	if err != nil {
		t.Fatalf("create a qemu sandbox: %v", err)
	}
	t.Cleanup(func() {
		if op, err := c.DeleteSandbox(context.Background(), sb.ID); err == nil {
			c.WaitOperation(context.Background(), op.ID)
		}
	})
	if _, err := c.WaitOperation(ctx, op.ID); err != nil {
		t.Fatalf("qemu sandbox did not start: %v", err)
	}
	// The marker is assembled in the guest, so the agent's log of the argv
	// on the console is not it.
	script := `printf 'Kernel %s - not syncing: %s' panic "$(head -c 9000000 /dev/zero | tr '\0' A)" >/dev/ttyS0; echo b >/proc/sysrq-trigger`
	cmd, err := c.CreateCommand(ctx, sb.ID, client.CreateCommandRequest{Argv: []string{"sh", "-c", script}, User: "root"})
	if err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	client.RunCommand(pctx, cmd.AttachURL, cmd.Token, nil, nil, nil) // ends with the VM
	cancel()
	deadline := time.Now().Add(10 * time.Minute)
	for {
		got, err := c.GetSandbox(ctx, sb.ID)
		if err == nil && got.State == model.StateFailed {
			t.Logf("reason (%d bytes): %.200s", len(got.Reason), got.Reason)
			if len(got.Reason) > 1024 {
				t.Errorf("reason is %d bytes; want at most 1024", len(got.Reason))
			}
			if !strings.Contains(got.Reason, "sandbox runtime exited") {
				t.Errorf("reason %.200q does not say the runtime exited", got.Reason)
			}
			break
		}
		if err == nil && strings.Contains(got.Reason, "unreachable") {
			t.Fatalf("the worker was cut off: %.300s", got.Reason)
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox not failed after the guest reset: %+v", got)
		}
		time.Sleep(500 * time.Millisecond)
	}
	// The worker still syncs: a new sandbox is placed on it, starts and runs.
	other := newSandbox(t, c, client.CreateSandboxRequest{})
	if r := sh(t, c, other.ID, "echo still-served"); r.stdout != "still-served\n" {
		t.Fatalf("a sandbox created after the attack: %+v", r)
	}
	dop, err := c.DeleteSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitOperation(ctx, dop.ID); err != nil {
		t.Fatal(err)
	}
	if left := s.leftovers(sb.ID); len(left) > 0 {
		t.Errorf("left behind after delete:\n%s", strings.Join(left, "\n"))
	}
	if cgs, _ := filepath.Glob("/sys/fs/cgroup/*/airlock/qemu-" + sb.ID); len(cgs) > 0 {
		t.Errorf("the VM's cgroups are left behind: %v", cgs)
	}
}
