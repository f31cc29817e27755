package gvisor_test

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/gvisor"
	"github.com/airlock/airlock/internal/runtime/runtimetest"
	"github.com/airlock/airlock/internal/setup"
	"github.com/airlock/airlock/internal/testenv"
)

// cacheDir holds runsc and the template between test runs (shared with the
// setup package's tests, so the Debian layer is built once per machine;
// AIRLOCK_TEST_CACHE names another, as for internal/e2e).
var cacheDir = func() string {
	if d := os.Getenv("AIRLOCK_TEST_CACHE"); d != "" {
		return d
	}
	return "/var/tmp/airlock-test-cache"
}()

// tLog adapts t.Log to an io.Writer for set-up progress.
type tLog struct{ t testing.TB }

func (w tLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// fixture builds the agent, ensures runsc and the base template, and
// returns a driver with state and run dirs private to the test.
func fixture(t testing.TB) (*gvisor.Driver, string, string) {
	t.Helper()
	testenv.RequireRunsc(t)
	testenv.RequireGoBuild(t, "airlock-agent")
	ctx := context.Background()
	runsc, err := setup.EnsureRunsc(ctx, cacheDir, tLog{t})
	if err != nil {
		t.Skipf("SKIP: no runsc (set %s or install Go to build it): %v", setup.RunscEnv, err)
	}
	agent := filepath.Join(t.TempDir(), "airlock-agent")
	cmd := exec.Command("go", "build", "-trimpath", "-o", agent, "github.com/airlock/airlock/cmd/airlock-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build airlock-agent: %v\n%s", err, out)
	}
	tmpl, rootfs, err := setup.EnsureDebianTemplate(ctx, cacheDir, agent, tLog{t})
	if err != nil {
		t.Fatalf("base template: %v", err)
	}
	t.Logf("template %s at %s", tmpl.Digest, rootfs)

	base := t.TempDir()
	state, run := filepath.Join(base, "state"), filepath.Join(base, "run")
	t.Cleanup(func() {
		// runsc keeps one nsfs mount per state dir for its gofers'
		// network namespace; release it so the temp dir can go.
		syscall.Unmount(filepath.Join(state, "null-netns"), syscall.MNT_DETACH)
	})
	d, err := gvisor.New(gvisor.Config{RunscPath: runsc, StateDir: state, RunDir: run, CgroupParent: "/airlock-test"})
	if err != nil {
		t.Fatal(err)
	}
	return d, rootfs, run
}

func TestConformance(t *testing.T) {
	d, rootfs, run := fixture(t)
	runtimetest.Run(t, d, runtimetest.Options{RootFS: rootfs, RunDir: run, CgroupParent: "/airlock-test", SuspendWakeCycles: 10})
}

// TestDeleteAfterCrash kills every process of a running sandbox and removes
// runsc's state, as a host crash might, and checks Delete still cleans up.
func TestDeleteAfterCrash(t *testing.T) {
	d, rootfs, run := fixture(t)
	ctx := context.Background()
	id := runtimetest.NewID()
	sb, err := d.Start(ctx, runtime.Spec{ID: id, RootFS: rootfs, VCPUs: 1, MemoryMiB: 128})
	if err != nil {
		t.Fatal(err)
	}
	sb.Close()
	if st, err := d.Status(ctx, id); err != nil || st != runtime.StatusRunning {
		t.Fatalf("Status = %q, %v", st, err)
	}
	// Lose runsc's state as a crash between create and start would.
	state := filepath.Join(filepath.Dir(run), "state")
	files, _ := filepath.Glob(filepath.Join(state, "*"+id+"*"))
	for _, f := range files {
		os.RemoveAll(f)
	}
	if st, err := d.Status(ctx, id); err != nil || st != runtime.StatusStopped {
		t.Errorf("Status without runsc state = %q, %v; want stopped (needs Delete)", st, err)
	}
	if err := d.Delete(ctx, id); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if st, err := d.Status(ctx, id); err != nil || st != runtime.StatusGone {
		t.Errorf("Status = %q, %v; want gone", st, err)
	}
	if _, err := os.Stat(filepath.Join(run, id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("run dir remains: %v", err)
	}
	cgs, _ := filepath.Glob("/sys/fs/cgroup/*/airlock-test/" + id)
	if len(cgs) > 0 {
		t.Errorf("cgroups remain: %v", cgs)
	}
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range cmdlines {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), id) {
			t.Errorf("process remains: %s: %s", p, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}

// TestFastStatusMatchesRunsc: the in-process status (faststate.go) says
// what `runsc state` says of a real sandbox, running, paused and after its
// sandbox process is killed (SIGKILL, as the OOM killer would).
func TestFastStatusMatchesRunsc(t *testing.T) {
	d, rootfs, _ := fixture(t)
	ctx := context.Background()
	id := runtimetest.NewID()
	sb, err := d.Start(ctx, runtime.Spec{ID: id, RootFS: rootfs, VCPUs: 1, MemoryMiB: 128})
	if err != nil {
		t.Fatal(err)
	}
	sb.Close()
	t.Cleanup(func() { d.Delete(context.Background(), id) })
	same := func(want string) {
		t.Helper()
		fast, ffound, ferr := gvisor.FastStatus(d, id)
		slow, sfound, serr := gvisor.RunscStatus(d, id)
		if ferr != nil || serr != nil || fast != slow || ffound != sfound || fast != want {
			t.Errorf("fast %q %v %v, runsc %q %v %v; want %q", fast, ffound, ferr, slow, sfound, serr, want)
		}
	}
	same("running")
	if err := d.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	same("paused")
	if err := d.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	pid, err := gvisor.SandboxPid(d, id)
	if err != nil || pid <= 0 {
		t.Fatalf("sandbox pid %d: %v", pid, err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// A killed sandbox is stopped at once for fastState (a zombie has no
	// command line), and for runsc once its parent reaps it (runsc's
	// check is signal 0, which a zombie answers).
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if st, _, _ := gvisor.RunscStatus(d, id); st == "stopped" {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	same("stopped")
}

// BenchmarkStatus compares the two ways of reading a running sandbox's
// status: in process (what Status does) and `runsc state` (its fallback,
// and what it did before), the baseline measured in the same run.
func BenchmarkStatus(b *testing.B) {
	d, rootfs, _ := fixture(b)
	ctx := context.Background()
	id := runtimetest.NewID()
	sb, err := d.Start(ctx, runtime.Spec{ID: id, RootFS: rootfs, VCPUs: 1, MemoryMiB: 128})
	if err != nil {
		b.Fatal(err)
	}
	sb.Close()
	b.Cleanup(func() { d.Delete(context.Background(), id) })
	for _, c := range []struct {
		name string
		read func(*gvisor.Driver, string) (string, bool, error)
	}{{"in-process", gvisor.FastStatus}, {"runsc-state", gvisor.RunscStatus}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if st, _, err := c.read(d, id); err != nil || st != "running" {
					b.Fatalf("%q %v", st, err)
				}
			}
		})
	}
}

func TestStartDuplicateID(t *testing.T) {
	d, rootfs, _ := fixture(t)
	ctx := context.Background()
	id := runtimetest.NewID()
	spec := runtime.Spec{ID: id, RootFS: rootfs, VCPUs: 1, MemoryMiB: 128}
	sb, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Delete(ctx, id)
	defer sb.Close()
	if _, err := d.Start(ctx, spec); !errors.Is(err, model.ErrConflict) {
		t.Errorf("second Start = %v, want ErrConflict", err)
	}
	if st, err := d.Status(ctx, id); err != nil || st != runtime.StatusRunning {
		t.Errorf("the first sandbox was disturbed: %q, %v", st, err)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := gvisor.Config{RunscPath: "/bin/runsc", StateDir: "/s", RunDir: "/r", Platform: "systrap", CgroupParent: "/airlock"}
	tests := []struct {
		name   string
		mutate func(*gvisor.Config)
		valid  bool
	}{
		{"complete", func(*gvisor.Config) {}, true},
		{"ptrace", func(c *gvisor.Config) { c.Platform = "ptrace" }, true},
		{"no runsc", func(c *gvisor.Config) { c.RunscPath = "" }, false},
		{"relative state dir", func(c *gvisor.Config) { c.StateDir = "state" }, false},
		{"no run dir", func(c *gvisor.Config) { c.RunDir = "" }, false},
		{"root cgroup", func(c *gvisor.Config) { c.CgroupParent = "/" }, false},
		{"unknown platform", func(c *gvisor.Config) { c.Platform = "hyperv" }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.mutate(&c)
			err := c.Validate()
			if (err == nil) != tt.valid {
				t.Fatalf("Validate = %v, want valid %v", err, tt.valid)
			}
			if err != nil && !errors.Is(err, model.ErrInvalid) {
				t.Errorf("error %v is not ErrInvalid", err)
			}
		})
	}
}

// BenchmarkStartReadyDelete measures one sandbox life: Start, the agent's
// first /health answer, Delete.
func BenchmarkStartReadyDelete(b *testing.B) {
	d, rootfs, _ := fixture(b)
	ctx := context.Background()
	for b.Loop() {
		id := runtimetest.NewID()
		sb, err := d.Start(ctx, runtime.Spec{ID: id, RootFS: rootfs, VCPUs: 1, MemoryMiB: 256})
		if err != nil {
			b.Fatal(err)
		}
		c := agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
		if err := c.WaitReady(ctx); err != nil {
			b.Fatal(err)
		}
		c.Close()
		sb.Close()
		if err := d.Delete(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
}

// TestCgroupLimits checks the spec's resources reach the v1 cgroup files.
func TestCgroupLimits(t *testing.T) {
	d, rootfs, _ := fixture(t)
	ctx := context.Background()
	id := runtimetest.NewID()
	sb, err := d.Start(ctx, runtime.Spec{ID: id, RootFS: rootfs, VCPUs: 2, MemoryMiB: 192})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Delete(ctx, id)
	defer sb.Close()
	tests := []struct{ file, want string }{
		{"memory/airlock-test/" + id + "/memory.limit_in_bytes", "201326592"},
		{"cpu/airlock-test/" + id + "/cpu.cfs_quota_us", "200000"},
		{"cpu/airlock-test/" + id + "/cpu.cfs_period_us", "100000"},
		{"pids/airlock-test/" + id + "/pids.max", "4096"},
	}
	for _, tt := range tests {
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", tt.file))
		if got := strings.TrimSpace(string(b)); err != nil || got != tt.want {
			t.Errorf("%s = %q, %v; want %s", tt.file, got, err, tt.want)
		}
	}
}

// TestStartCancelled checks a Start whose context is already done fails and
// leaves no run dir behind.
func TestStartCancelled(t *testing.T) {
	d, rootfs, run := fixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	id := runtimetest.NewID()
	if _, err := d.Start(ctx, runtime.Spec{ID: id, RootFS: rootfs, VCPUs: 1, MemoryMiB: 128}); err == nil {
		d.Delete(context.Background(), id)
		t.Fatal("Start with a cancelled context succeeded")
	}
	if _, err := os.Stat(filepath.Join(run, id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("run dir remains: %v", err)
	}
	if st, err := d.Status(context.Background(), id); err != nil || st != runtime.StatusGone {
		t.Errorf("Status = %q, %v; want gone", st, err)
	}
}
