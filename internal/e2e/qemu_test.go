package e2e

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/model"
)

// TestQEMUSandbox runs a sandbox on the qemu runtime (TCG on these machines)
// through the whole stack: its own guest kernel, files across suspend/wake,
// and a guest kernel panic that fails the sandbox with the reason and leaves
// nothing behind once deleted.
func TestQEMUSandbox(t *testing.T) {
	s := need(t)
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		// The worker installs QEMU itself during its background set-up; give
		// it the chance before deciding.
		t.Log("qemu-system-x86_64 not on PATH yet; the worker's set-up installs it")
	}
	c := s.client()
	ctx := ctxT(t, 15*time.Minute)
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
	r := sh(t, c, sb.ID, "uname -r")
	if !strings.Contains(r.stdout, "cloud-amd64") {
		t.Fatalf("guest kernel %q, want the Debian cloud kernel", r.stdout)
	}
	// virtio-net on a tap in the sandbox's own network namespace.
	if r := sh(t, c, sb.ID, "cat /sys/class/net/eth0/address"); strings.TrimSpace(r.stdout) == "" {
		t.Errorf("guest has no virtio-net eth0: %+v", r)
	}
	if out, err := exec.Command("ip", "-n", "airlock-"+sb.ID, "link", "show", "tap0").CombinedOutput(); err != nil {
		t.Errorf("no tap0 in the sandbox's netns: %v: %s", err, out)
	}
	f, err := c.Files(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(ctx, "/home/user/keep.txt", strings.NewReader("kept across suspend\n"), "", ""); err != nil {
		t.Fatal(err)
	}
	sop, err := c.SuspendSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitOperation(ctx, sop.ID); err != nil {
		t.Fatalf("suspend: %v", err)
	}
	if out, _ := exec.Command("pgrep", "-f", "qemu-system.*"+sb.ID).Output(); len(out) > 0 {
		t.Errorf("qemu still running while suspended: %s", out)
	}
	wop, err := c.WakeSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitOperation(ctx, wop.ID); err != nil {
		t.Fatalf("wake: %v", err)
	}
	if r := sh(t, c, sb.ID, "cat /home/user/keep.txt"); r.stdout != "kept across suspend\n" {
		t.Errorf("file after wake: %q", r.stdout)
	}
	// A guest kernel panic: the sandbox fails with the reason.
	cmd, err := c.CreateCommand(ctx, sb.ID, client.CreateCommandRequest{Argv: []string{"sh", "-c", "echo c > /proc/sysrq-trigger"}, User: "root"})
	if err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	client.RunCommand(pctx, cmd.AttachURL, cmd.Token, nil, nil, nil)
	cancel()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got, err := c.GetSandbox(ctx, sb.ID)
		if err == nil && got.State == model.StateFailed {
			if !strings.Contains(got.Reason, "panic") {
				t.Errorf("failed with reason %q, want it to name the panic", got.Reason)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox not failed after a guest panic: %+v", got)
		}
		time.Sleep(500 * time.Millisecond)
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
	if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), sb.ID) {
		t.Errorf("network namespace left behind: %s", out)
	}
}
