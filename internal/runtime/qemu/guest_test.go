package qemu_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/cgroup"
	"github.com/airlock/airlock/internal/logcap"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/qemu"
)

func newClient(sb runtime.Sandbox) *agentclient.Client {
	return agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
}

// waitStopped polls Status until the VM is stopped; the bound only keeps a
// broken guest from hanging the test binary.
func waitStopped(t *testing.T, f fix, id string, bound time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		st, err := f.d.Status(context.Background(), id)
		if err == nil && st == runtime.StatusStopped {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Status = %q, %v after %v; want stopped", st, err, bound)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestGuestPanicLineFlood is the attack of finding H1: guest root writes a
// 9 MB "Kernel panic - not syncing: AAAA…" line to its console and resets
// the VM. The reason the driver gives is bounded (it travels in every Sync of
// the worker) and the console file on the host stays capped.
func TestGuestPanicLineFlood(t *testing.T) {
	f := fixture(t, qemu.AccelTCG)
	id, _, c := start(t, f)
	ctx := context.Background()
	// Then a reset (sysrq b), which ends QEMU (-no-reboot): poweroff -f
	// only halts a microvm guest (no ACPI), and QEMU would run on.
	// The marker is assembled in the guest: the agent logs argv to the
	// console, and that copy must not be the line found.
	script := `printf 'Kernel %s - not syncing: %s' panic "$(head -c 9000000 /dev/zero | tr '\0' A)" >/dev/ttyS0; echo b >/proc/sysrq-trigger`
	if _, err := c.StartProcess(ctx, agentapi.ProcessSpec{ID: "flood", User: "root", Argv: []string{"sh", "-c", script}}); err != nil {
		t.Fatalf("start the flood: %v", err)
	}
	waitStopped(t, f, id, 15*time.Minute)
	reason := f.d.StopReason(id)
	t.Logf("StopReason (%d bytes): %.200s…", len(reason), reason)
	if len(reason) > 1024 {
		t.Errorf("StopReason is %d bytes; want at most 1024", len(reason))
	}
	serial := filepath.Join(f.run, id, "serial.log")
	var total int64
	for _, p := range []string{serial, serial + ".1"} {
		if fi, err := os.Stat(p); err == nil {
			t.Logf("%s: %d bytes", filepath.Base(p), fi.Size())
			total += fi.Size()
		}
	}
	if total > logcap.Max+logcap.Keep {
		t.Errorf("the host keeps %d bytes of the guest's 9 MB console line; want at most %d", total, logcap.Max+logcap.Keep)
	}
}

// TestConfinement: a running VM's QEMU has no root uid or capability, a
// seccomp filter and its own cgroup with CPU, memory and pids limits; it
// checkpoints and restores confined; Delete leaves no cgroup behind.
func TestConfinement(t *testing.T) {
	f := fixture(t, qemu.AccelTCG)
	id, _, c := start(t, f)
	if out, code := run(t, c, "echo", "confined"); code != 0 || out != "confined\n" {
		t.Fatalf("guest: %q exit %d", out, code)
	}
	b, err := os.ReadFile(filepath.Join(f.run, id, "qemu.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(string(b))
	status, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{}
	for _, line := range strings.Split(string(status), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	for _, k := range []string{"Uid", "Gid"} {
		if slices.Contains(strings.Fields(fields[k]), "0") {
			t.Errorf("QEMU %s: %s; want no root id", k, fields[k])
		}
	}
	want := map[string]string{"Seccomp": "2", "NoNewPrivs": "1", "CapEff": "0000000000000000", "CapPrm": "0000000000000000"}
	for k, v := range want {
		if fields[k] != v {
			t.Errorf("QEMU %s: %q, want %q", k, fields[k], v)
		}
	}
	t.Logf("QEMU pid %s: Uid %s Seccomp %s NoNewPrivs %s CapEff %s", pid, fields["Uid"], fields["Seccomp"], fields["NoNewPrivs"], fields["CapEff"])

	h, err := cgroup.Detect(cgroup.DefaultRoot)
	if err != nil {
		t.Fatal(err)
	}
	rel := "/airlock/qemu-" + id
	cgs, _ := os.ReadFile("/proc/" + pid + "/cgroup")
	t.Logf("/proc/%s/cgroup:\n%s", pid, cgs)
	limits := map[string]string{"cpu/cpu.cfs_quota_us": "100000", "memory/memory.limit_in_bytes": strconv.Itoa((256 + 40 + 256) << 20), "pids/pids.max": "512"}
	if h.Version == cgroup.V2 {
		limits = map[string]string{"cpu.max": "100000 100000", "memory.max": strconv.Itoa((256 + 40 + 256) << 20), "pids.max": "512"}
		if !strings.Contains(string(cgs), "0::"+rel+"\n") {
			t.Errorf("QEMU is not in its cgroup %s", rel)
		}
	} else {
		for _, ctl := range []string{"cpu", "memory", "pids"} {
			if !strings.Contains(string(cgs), ":"+ctl+":"+rel+"\n") {
				t.Errorf("QEMU is not in its %s cgroup %s", ctl, rel)
			}
		}
	}
	for file, v := range limits {
		p := filepath.Join(cgroup.DefaultRoot, rel, file)
		if h.Version == cgroup.V1 {
			ctl, name, _ := strings.Cut(file, "/")
			p = filepath.Join(cgroup.DefaultRoot, ctl, rel, name)
		}
		got, err := os.ReadFile(p)
		if err != nil || strings.TrimSpace(string(got)) != v {
			t.Errorf("%s = %q, %v; want %s", p, got, err, v)
		}
	}
	// A suspend and wake still work confined: the device state travels
	// through a descriptor the worker opens (spawn=deny, no exec:cat).
	ctx := context.Background()
	snap := t.TempDir()
	if err := f.d.Checkpoint(ctx, id, snap, true); err != nil {
		qlog, _ := os.ReadFile(filepath.Join(f.run, id, "qemu.log"))
		t.Fatalf("Checkpoint of a confined VM: %v\nqemu.log:\n%s", err, qlog)
	}
	if out, code := run(t, c, "echo", "after checkpoint"); code != 0 || out != "after checkpoint\n" {
		t.Fatalf("guest after checkpoint: %q exit %d", out, code)
	}

	c.Close()
	if err := f.d.Delete(ctx, id); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	for _, d := range h.Dirs(rel) {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("cgroup %s remains after Delete", d)
		}
	}
	// Restore the checkpoint under the same id: confined again, and it runs.
	sb, err := f.d.Restore(ctx, runtime.Spec{ID: id, RootFS: f.rootfs}, snap)
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	rc := newClient(sb)
	defer rc.Close()
	rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := rc.WaitReady(rctx); err != nil {
		t.Fatalf("restored guest: %v", err)
	}
	if out, code := run(t, rc, "echo", "restored"); code != 0 || out != "restored\n" {
		t.Fatalf("restored guest: %q exit %d", out, code)
	}
	if err := f.d.Delete(ctx, id); err != nil {
		t.Fatalf("Delete after restore: %v", err)
	}
	for _, d := range h.Dirs(rel) {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("cgroup %s remains after Delete", d)
		}
	}
}
