package gvisor_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/runtimetest"
)

// BenchmarkCheckpointRestore measures one suspend/wake cycle of a sandbox
// whose python3 holds 16 or 256 MiB of random bytes: Checkpoint (stopping
// it), Delete, Restore under the same id, and the agent's first answer.
// Reported per cycle: checkpoint-ms, delete-ms, restore-ms (runsc restore
// returned), ready-ms (restore + agent answering) and image-MiB.
//
//	sudo go test ./internal/runtime/gvisor -run '^$' -bench CheckpointRestore -benchtime 5x
func BenchmarkCheckpointRestore(b *testing.B) {
	for _, mib := range []int{16, 256} {
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) { benchCheckpointRestore(b, mib) })
	}
}

func benchCheckpointRestore(b *testing.B, mib int) {
	d, rootfs, _ := fixture(b)
	ctx := context.Background()
	id := runtimetest.NewID()
	spec := runtime.Spec{ID: id, RootFS: rootfs, VCPUs: 1, MemoryMiB: mib + 384}
	sb, err := d.Start(ctx, spec)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Delete(context.Background(), id) })
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
	wait := func() {
		wctx, cancel := context.WithTimeout(ctx, 120*time.Second)
		defer cancel()
		if err := c.WaitReady(wctx); err != nil {
			b.Fatal(err)
		}
	}
	wait()
	script := fmt.Sprintf("import os, sys, time\nb = os.urandom(%d << 20)\nprint('ready', flush=True)\ntime.sleep(1e9)\n", mib)
	if _, err := c.StartProcess(ctx, agentapi.ProcessSpec{ID: "hold", Argv: []string{"python3", "-c", script}}); err != nil {
		b.Fatal(err)
	}
	out, err := c.Output(ctx, "hold", 0)
	if err != nil {
		b.Fatal(err)
	}
	var got strings.Builder
	for !strings.Contains(got.String(), "ready") {
		kind, payload, err := out.Next()
		if err != nil || kind == agentapi.FrameExit {
			b.Fatalf("python3 holding %d MiB: %v %s", mib, err, got.String())
		}
		got.Write(payload)
	}
	out.Close()

	var ckpt, del, restore, ready time.Duration
	var imageBytes int64
	n := 0
	for b.Loop() {
		dir := filepath.Join(b.TempDir(), "image")
		if err := os.Mkdir(dir, 0o700); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		if err := d.Checkpoint(ctx, id, dir, false); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		c.Close()
		sb.Close()
		if err := d.Delete(ctx, id); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		sb, err = d.Restore(ctx, spec, dir)
		if err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		c = agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
		wait()
		t4 := time.Now()
		ckpt += t1.Sub(t0)
		del += t2.Sub(t1)
		restore += t3.Sub(t2)
		ready += t4.Sub(t2)
		filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.Type().IsRegular() {
				if fi, err := e.Info(); err == nil {
					imageBytes += fi.Size()
				}
			}
			return nil
		})
		os.RemoveAll(dir)
		n++
	}
	if info, err := c.GetProcess(ctx, "hold"); err != nil || !info.Running {
		b.Errorf("python3 holding the memory did not survive: %+v, %v", info, err)
	}
	c.Close()
	sb.Close()
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(n) }
	b.ReportMetric(ms(ckpt), "checkpoint-ms")
	b.ReportMetric(ms(del), "delete-ms")
	b.ReportMetric(ms(restore), "restore-ms")
	b.ReportMetric(ms(ready), "ready-ms")
	b.ReportMetric(float64(imageBytes)/float64(n)/(1<<20), "image-MiB")
}

// TestCheckpointFailure checkpoints into a read-only directory: Checkpoint
// fails and says whether the sandbox survived (then it still answers) or
// was lost (then Delete cleans it up).
func TestCheckpointFailure(t *testing.T) {
	d, rootfs, run := fixture(t)
	ctx := context.Background()
	ro := t.TempDir()
	if err := syscall.Mount(ro, ro, "", syscall.MS_BIND, ""); err != nil {
		t.Skipf("SKIP: bind mount: %v", err)
	}
	defer syscall.Unmount(ro, syscall.MNT_DETACH)
	if err := syscall.Mount("", ro, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		t.Skipf("SKIP: read-only remount: %v", err)
	}
	id := runtimetest.NewID()
	sb, err := d.Start(ctx, runtime.Spec{ID: id, RootFS: rootfs, VCPUs: 1, MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	defer d.Delete(ctx, id)
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
	defer c.Close()
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := c.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	err = d.Checkpoint(ctx, id, ro, false)
	if err == nil {
		t.Fatal("Checkpoint into a read-only directory succeeded")
	}
	t.Logf("Checkpoint: %v", err)
	switch {
	case strings.Contains(err.Error(), "still running"):
		if err := c.WaitReady(wctx); err != nil {
			t.Errorf("the error says the sandbox is still running, but its agent does not answer: %v", err)
		}
	case strings.Contains(err.Error(), "was lost"):
		if st, _ := d.Status(ctx, id); st == runtime.StatusRunning {
			t.Errorf("the error says the sandbox was lost, but it is running")
		}
	default:
		t.Errorf("the error says neither that the sandbox survived nor that it was lost")
	}
	if err := d.Delete(ctx, id); err != nil {
		t.Errorf("Delete: %v", err)
	}
	if _, err := os.Stat(filepath.Join(run, id)); !os.IsNotExist(err) {
		t.Errorf("run dir remains: %v", err)
	}
}

// TestCheckpointPausedLeaveRunning checkpoints a paused sandbox without
// stopping it: it stays paused, answers again after Resume, and the image
// restores into a running copy.
func TestCheckpointPausedLeaveRunning(t *testing.T) {
	d, rootfs, run := fixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	spec := runtime.Spec{ID: runtimetest.NewID(), RootFS: rootfs, VCPUs: 1, MemoryMiB: 256}
	sb, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Delete(context.Background(), spec.ID)
	defer sb.Close()
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
	defer c.Close()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteFile(ctx, "/root/marker", "", "", strings.NewReader("paused checkpoint")); err != nil {
		t.Fatal(err)
	}
	if err := d.Pause(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := d.Checkpoint(ctx, spec.ID, dir, true); err != nil {
		t.Fatalf("Checkpoint of a paused sandbox: %v", err)
	}
	if st, err := d.Status(ctx, spec.ID); err != nil || st != runtime.StatusPaused {
		t.Errorf("Status after Checkpoint(leaveRunning) of a paused sandbox = %q, %v; want paused", st, err)
	}
	if err := d.Resume(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReady(ctx); err != nil {
		st, serr := d.Status(context.Background(), spec.ID)
		b, _ := os.ReadFile(filepath.Join(run, spec.ID, "runsc.log"))
		t.Fatalf("agent after Resume: %v (status %q, %v); runsc.log:\n%s", err, st, serr, b)
	}

	fork := spec
	fork.ID = runtimetest.NewID()
	fsb, err := d.Restore(ctx, fork, dir)
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	defer d.Delete(context.Background(), fork.ID)
	defer fsb.Close()
	if st, err := d.Status(ctx, fork.ID); err != nil || st != runtime.StatusRunning {
		t.Errorf("Status of the restored copy = %q, %v; want running", st, err)
	}
	fc := agentclient.New(func(ctx context.Context) (net.Conn, error) { return fsb.AgentConn(ctx) })
	defer fc.Close()
	if err := fc.WaitReady(ctx); err != nil {
		t.Fatalf("agent of the restored copy: %v", err)
	}
	// A restore runs with every host core, then gets the sandbox's quota.
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpu/airlock-test", fork.ID, "cpu.cfs_quota_us")); err != nil {
		t.Logf("no cgroup v1 cpu hierarchy to check the quota: %v", err)
	} else if q := strings.TrimSpace(string(b)); q != "100000" {
		t.Errorf("cpu.cfs_quota_us of the restored copy = %s, want 100000 (1 vCPU)", q)
	}
	rc, _, err := fc.ReadFile(ctx, "/root/marker")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if b, _ := io.ReadAll(rc); string(b) != "paused checkpoint" {
		t.Errorf("restored copy reads %q", b)
	}
}
