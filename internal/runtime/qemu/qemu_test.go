package qemu_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/image"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/qemu"
	"github.com/airlock/airlock/internal/runtime/runtimetest"
	"github.com/airlock/airlock/internal/setup"
	"github.com/airlock/airlock/internal/testenv"
)

// cacheDir is shared with the setup and gvisor tests: the kernel, the base
// template and its ext4 image are built once per machine (AIRLOCK_TEST_CACHE
// names another, as for internal/e2e).
var cacheDir = func() string {
	if d := os.Getenv("AIRLOCK_TEST_CACHE"); d != "" {
		return d
	}
	return "/var/tmp/airlock-test-cache"
}()

type tLog struct{ t testing.TB }

func (w tLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

type fix struct {
	d      *netDriver
	rootfs string
	run    string
	assets image.VMAssets
}

var (
	fixOnce sync.Once
	shared  fix
	fixErr  string
	fixSkip string
)

// fixture builds the agent, runs the qemu set-up and the base template once
// per test binary, and returns a driver with a run dir private to the test.
func fixture(t testing.TB, accel string) fix {
	t.Helper()
	testenv.RequireQEMU(t)
	testenv.RequireGoBuild(t, "airlock-agent")
	fixOnce.Do(func() {
		ctx := context.Background()
		dir, err := os.MkdirTemp("", "qemu-agent-")
		if err != nil {
			fixErr = err.Error()
			return
		}
		defer os.RemoveAll(dir) // the set-up copies the agent
		agent := filepath.Join(dir, "airlock-agent")
		cmd := exec.Command("go", "build", "-trimpath", "-o", agent, "github.com/airlock/airlock/cmd/airlock-agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fixErr = "build airlock-agent: " + err.Error() + "\n" + string(out)
			return
		}
		if shared.assets, err = setup.EnsureQEMU(ctx, cacheDir, agent, tLog{t}); err != nil {
			fixSkip = "SKIP: qemu set-up failed (needs Debian apt): " + err.Error()
			return
		}
		if _, shared.rootfs, err = setup.EnsureDebianTemplate(ctx, cacheDir, agent, tLog{t}); err != nil {
			fixErr = "base template: " + err.Error()
			return
		}
		if _, err := image.EnsureTemplateImage(ctx, cacheDir, shared.rootfs, tLog{t}); err != nil {
			fixErr = "template image: " + err.Error()
		}
	})
	if fixSkip != "" {
		t.Skip(fixSkip)
	}
	if fixErr != "" {
		t.Fatal(fixErr)
	}
	f := shared
	f.run = filepath.Join(t.TempDir(), "run")
	d, err := qemu.New(qemu.Config{Assets: f.assets, CacheDir: cacheDir, RunDir: f.run, Accel: accel, DiskMiB: 1024,
		Logger: slog.New(slog.NewTextHandler(tLog{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	f.d = &netDriver{Driver: d}
	return f
}

func TestConformance(t *testing.T) {
	f := fixture(t, qemu.AccelAuto)
	t.Logf("accelerator: %s", f.d.Accel(context.Background()))
	runtimetest.Run(t, f.d, runtimetest.Options{
		RootFS:      f.rootfs,
		RunDir:      f.run,
		MemoryMiB:   256,
		BootTimeout: 3 * time.Minute,
		Concurrent:  2,
		// Two cycles still cover waking from running and from paused;
		// each copies the guest RAM file and disk, slow on a loaded CI box.
		SuspendWakeCycles: 2,
		// The guest's RAM file, not its disk.
		MemoryFiles: []string{"mem.ram"},
		// virtio-net on the tap in the sandbox's netns.
		Interfaces: []string{"lo", "eth0"},
	})
}

// start boots one sandbox and returns a ready client; it is deleted at the end.
func start(t *testing.T, f fix) (string, runtime.Sandbox, *agentclient.Client) {
	t.Helper()
	id := runtimetest.NewID()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := f.d.Start(ctx, runtime.Spec{ID: id, Runtime: qemu.Name, RootFS: f.rootfs, VCPUs: 1, MemoryMiB: 256, Hostname: "qemu-test"})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
	t.Cleanup(func() {
		c.Close()
		sb.Close()
		if err := f.d.Delete(context.Background(), id); err != nil {
			t.Errorf("Delete: %v", err)
		}
	})
	if err := c.WaitReady(ctx); err != nil {
		serial, _ := os.ReadFile(filepath.Join(f.run, id, "serial.log"))
		t.Fatalf("agent not ready: %v\nserial console:\n%s", err, serial)
	}
	return id, sb, c
}

var seq atomic.Int64

// run runs argv as root in the sandbox and returns its output and exit code.
func run(t *testing.T, c *agentclient.Client, argv ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := fmt.Sprintf("q-%d", seq.Add(1))
	if _, err := c.StartProcess(ctx, agentapi.ProcessSpec{ID: id, Argv: argv, User: "root"}); err != nil {
		t.Fatalf("start %v: %v", argv, err)
	}
	out, err := c.Output(ctx, id, 0)
	if err != nil {
		t.Fatalf("output of %v: %v", argv, err)
	}
	defer out.Close()
	var sb strings.Builder
	for {
		kind, payload, err := out.Next()
		if err != nil {
			t.Fatalf("output of %v: %v (so far %q)", argv, err, sb.String())
		}
		switch kind {
		case agentapi.FrameStdout, agentapi.FrameStderr:
			sb.Write(payload)
		case agentapi.FrameExit:
			var e agentapi.Exit
			if err := json.Unmarshal(payload, &e); err != nil {
				t.Fatalf("exit frame: %v", err)
			}
			return sb.String(), e.ExitCode
		case agentapi.FrameError:
			t.Fatalf("output of %v: %s", argv, payload)
		}
	}
}

func TestUname(t *testing.T) {
	f := fixture(t, qemu.AccelTCG)
	_, _, c := start(t, f)
	out, code := run(t, c, "uname", "-r")
	if code != 0 || strings.TrimSpace(out) != f.assets.KernelRelease {
		t.Errorf("uname -r = %q exit %d, want %q", out, code, f.assets.KernelRelease)
	}
	out, _ = run(t, c, "sh", "-c", "grep MemTotal /proc/meminfo; nproc; mount | head -20")
	t.Logf("guest:\n%s", out)
}

// TestGuestPanic: a kernel panic ends QEMU (-no-reboot, panic=-1), Status
// reports stopped, and Delete removes everything.
func TestGuestPanic(t *testing.T) {
	f := fixture(t, qemu.AccelTCG)
	id, sb, c := start(t, f)
	ctx := context.Background()
	if _, err := c.StartProcess(ctx, agentapi.ProcessSpec{ID: "panic", User: "root", Argv: []string{"sh", "-c", "echo c > /proc/sysrq-trigger"}}); err != nil {
		t.Fatalf("start panic: %v", err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := f.d.Status(ctx, id)
		if err == nil && st == runtime.StatusStopped {
			break
		}
		if time.Now().After(deadline) {
			serial, _ := os.ReadFile(filepath.Join(f.run, id, "serial.log"))
			t.Fatalf("Status after a guest panic = %q, %v; want stopped; serial console:\n%s", st, err, serial)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if reason := f.d.StopReason(id); !strings.HasPrefix(reason, "guest kernel panic: ") {
		serial, _ := os.ReadFile(filepath.Join(f.run, id, "serial.log"))
		t.Errorf("StopReason = %q, want a guest kernel panic; serial console:\n%s", reason, serial)
	} else {
		t.Logf("StopReason: %s", reason)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := sb.AgentConn(cctx); err == nil {
		t.Error("AgentConn of a dead VM returned a connection")
	}
	c.Close()
	if err := f.d.Delete(ctx, id); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if st, err := f.d.Status(ctx, id); err != nil || st != runtime.StatusGone {
		t.Errorf("Status after Delete = %q, %v", st, err)
	}
	if _, err := os.Stat(filepath.Join("/run/netns", "airlock-"+id)); err == nil {
		t.Errorf("netns airlock-%s remains", id)
	}
	if _, err := os.Stat(filepath.Join(f.run, id)); err == nil {
		t.Errorf("run dir of %s remains", id)
	}
}

// TestChannelReconnect: the host drops the agent connection mid-use many
// times; every new connection gets a fresh, working session.
func TestChannelReconnect(t *testing.T) {
	f := fixture(t, qemu.AccelTCG)
	_, sb, c := start(t, f)
	for i := range 5 {
		c.Close()
		c = agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
		out, code := run(t, c, "echo", fmt.Sprint("round ", i))
		if code != 0 || out != fmt.Sprintf("round %d\n", i) {
			t.Fatalf("round %d: %q exit %d", i, out, code)
		}
	}
	// A raw connection closed in the middle of the handshake or of the
	// HTTP/2 preface must not confuse the next session.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c.Close()
	raw, err := sb.AgentConn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	raw.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00"))
	raw.Close()
	c = agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
	defer c.Close()
	if out, code := run(t, c, "echo", "after"); code != 0 || out != "after\n" {
		t.Fatalf("after a broken session: %q exit %d", out, code)
	}
}

// BenchmarkBootToExec: Start → first exec answered (TCG on hosts without usable KVM).
func BenchmarkBootToExec(b *testing.B) {
	f := fixture(b, qemu.AccelAuto)
	ctx := context.Background()
	for b.Loop() {
		id := runtimetest.NewID()
		sb, err := f.d.Start(ctx, runtime.Spec{ID: id, RootFS: f.rootfs, VCPUs: 1, MemoryMiB: 256, Hostname: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		c := agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
		benchExec(b, c)
		c.Close()
		sb.Close()
		b.StopTimer()
		f.d.Delete(ctx, id)
		b.StartTimer()
	}
	b.Logf("accelerator %s", f.d.Accel(ctx))
}

// benchExec runs true in the guest and waits for its exit.
func benchExec(b *testing.B, c *agentclient.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	id := fmt.Sprintf("b-%d", seq.Add(1))
	if _, err := c.StartProcess(ctx, agentapi.ProcessSpec{ID: id, Argv: []string{"true"}, User: "root"}); err != nil {
		b.Fatal(err)
	}
	out, err := c.Output(ctx, id, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer out.Close()
	for {
		kind, _, err := out.Next()
		if err != nil {
			b.Fatal(err)
		}
		if kind == agentapi.FrameExit {
			return
		}
	}
}

func benchSandbox(b *testing.B, f fix) (string, runtime.Sandbox, *agentclient.Client) {
	ctx := context.Background()
	id := runtimetest.NewID()
	sb, err := f.d.Start(ctx, runtime.Spec{ID: id, RootFS: f.rootfs, VCPUs: 1, MemoryMiB: 256, Hostname: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
	b.Cleanup(func() {
		c.Close()
		sb.Close()
		f.d.Delete(context.Background(), id)
	})
	benchExec(b, c)
	return id, sb, c
}

// BenchmarkPauseResume: QMP stop + cont.
func BenchmarkPauseResume(b *testing.B) {
	f := fixture(b, qemu.AccelAuto)
	id, _, _ := benchSandbox(b, f)
	ctx := context.Background()
	for b.Loop() {
		if err := f.d.Pause(ctx, id); err != nil {
			b.Fatal(err)
		}
		if err := f.d.Resume(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSuspendWake: Checkpoint (stop + device state + RAM/disk copy),
// Delete, Restore, first exec answered.
func BenchmarkSuspendWake(b *testing.B) {
	f := fixture(b, qemu.AccelAuto)
	id, sb, c := benchSandbox(b, f)
	ctx := context.Background()
	var suspend, wake time.Duration
	for b.Loop() {
		dir := b.TempDir()
		t0 := time.Now()
		if err := f.d.Checkpoint(ctx, id, dir, false); err != nil {
			b.Fatal(err)
		}
		c.Close()
		sb.Close()
		if err := f.d.Delete(ctx, id); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		nsb, err := f.d.Restore(ctx, runtime.Spec{ID: id, RootFS: f.rootfs}, dir)
		if err != nil {
			b.Fatal(err)
		}
		sb = nsb
		c = agentclient.New(func(ctx context.Context) (net.Conn, error) { return nsb.AgentConn(ctx) })
		benchExec(b, c)
		suspend += t1.Sub(t0)
		wake += time.Since(t1)
	}
	b.ReportMetric(float64(suspend.Milliseconds())/float64(b.N), "suspend-ms/op")
	b.ReportMetric(float64(wake.Milliseconds())/float64(b.N), "wake-to-exec-ms/op")
	b.Cleanup(func() { c.Close(); sb.Close() })
}

// TestQEMUCrash: QEMU killed from outside → Status stopped, a reason, and
// Delete cleans up.
func TestQEMUCrash(t *testing.T) {
	f := fixture(t, qemu.AccelTCG)
	id, _, _ := start(t, f)
	ctx := context.Background()
	b, err := os.ReadFile(filepath.Join(f.run, id, "qemu.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := f.d.Status(ctx, id)
		if err == nil && st == runtime.StatusStopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Status after QEMU was killed = %q, %v; want stopped", st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if reason := f.d.StopReason(id); !strings.HasPrefix(reason, "qemu exited") {
		t.Errorf("StopReason = %q, want qemu exited", reason)
	}
	if err := f.d.Delete(ctx, id); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := os.Stat(filepath.Join("/run/netns", "airlock-"+id)); err == nil {
		t.Errorf("netns airlock-%s remains", id)
	}
	if st, err := f.d.Status(ctx, id); err != nil || st != runtime.StatusGone {
		t.Errorf("Status after Delete = %q, %v", st, err)
	}
}
