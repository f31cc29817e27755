package daemon

import (
	"context"
	"debug/elf"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	airruntime "github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/gvisor"
	"github.com/airlock/airlock/internal/runtime/qemu"
	"github.com/airlock/airlock/internal/runtime/runtimetest"
	"github.com/airlock/airlock/internal/setup"
	"github.com/airlock/airlock/internal/testenv"
)

// testCacheDir holds runsc and the base template between test runs (shared
// with the other packages' tests; AIRLOCK_TEST_CACHE names another, as for
// internal/e2e).
var testCacheDir = func() string {
	if d := os.Getenv("AIRLOCK_TEST_CACHE"); d != "" {
		return d
	}
	return "/var/tmp/airlock-test-cache"
}()

// dynamicAgent builds airlock-agent the way a plain `go build ./cmd/...`
// does (cgo on: linked against the C library); it skips without go or a C
// compiler, and under -short (a cold cgo build takes a minute).
func dynamicAgent(t *testing.T) string {
	t.Helper()
	testenv.RequireGoBuild(t, "a cgo (dynamically linked) airlock-agent")
	testenv.RequireTool(t, "gcc", "for a cgo (dynamically linked) build of airlock-agent")
	out := filepath.Join(t.TempDir(), "airlock-agent")
	cmd := exec.Command("go", "build", "-o", out, "github.com/airlock/airlock/cmd/airlock-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build airlock-agent: %v\n%s", err, b)
	}
	if !isDynamic(t, out) {
		t.Skip("SKIP: a cgo build of airlock-agent came out static on this machine")
	}
	return out
}

func isDynamic(t *testing.T, path string) bool {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return true
		}
	}
	return false
}

// TestStaticAgentRefusesDynamic: with a dynamically linked agent and no
// source tree to rebuild it from, the worker's start is refused with a
// message that says how to build a static one.
func TestStaticAgentRefusesDynamic(t *testing.T) {
	agent := dynamicAgent(t)
	t.Chdir(t.TempDir()) // no go.mod here; the test binary's dir has none either
	got, err := staticAgent(context.Background(), agent, t.TempDir(), io.Discard)
	if err == nil {
		t.Fatalf("staticAgent = %q, nil; want a refusal", got)
	}
	for _, want := range []string{"dynamically linked", "must be static", "scripts/build.sh", "CGO_ENABLED=0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// TestUpRefusesDynamicAgent runs `airlock up` itself with a cgo-built agent
// and no source tree at hand: it refuses to start, saying how to build a
// static agent, before any runtime set-up.
func TestUpRefusesDynamicAgent(t *testing.T) {
	testenv.RequireRoot(t, "airlock up: its worker checks for root before the agent")
	agent := dynamicAgent(t)
	t.Setenv("AIRLOCK_AGENT", agent)
	t.Chdir(t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dataDir := t.TempDir()
	err := up(ctx, []string{"--listen", "127.0.0.1:0", "--data-dir", dataDir, "--log-level", "error"})
	if err == nil {
		t.Fatal("airlock up started with a dynamically linked agent")
	}
	for _, want := range []string{agent + " is dynamically linked", "must be static", "./scripts/build.sh"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("airlock up: %q does not say %q", err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(dataDir, "bin", "runsc")); err == nil {
		t.Error("runsc was set up before the agent check")
	}
}

// TestStaticAgentRebuildsDynamic: from the source tree, a dynamically
// linked agent is rebuilt static into the data dir.
func TestStaticAgentRebuildsDynamic(t *testing.T) {
	agent := dynamicAgent(t)
	t.Chdir("../..") // the module root
	dataDir := t.TempDir()
	got, err := staticAgent(context.Background(), agent, dataDir, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got != filepath.Join(dataDir, "bin", "airlock-agent") {
		t.Errorf("staticAgent = %q, want the rebuilt agent in the data dir", got)
	}
	if isDynamic(t, got) {
		t.Errorf("%s is still dynamically linked", got)
	}
}

// TestBrokenQEMUDoesNotBlockGVisor is the "plain go build, then airlock up"
// trial: the qemu runtime's real set-up fails on a dynamically linked agent
// ("the agent is the guest's /init and must be static"). A real gVisor
// sandbox must still be listed, observed and deleted — also by a fresh
// Multi, as after a worker restart — qemu must not be offered, and a qemu
// start must fail at once with the reason. Likewise while a qemu set-up is
// still running.
func TestBrokenQEMUDoesNotBlockGVisor(t *testing.T) {
	testenv.RequireRunsc(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	broken := dynamicAgent(t)
	runsc, err := setup.EnsureRunsc(ctx, testCacheDir, io.Discard)
	if err != nil {
		t.Skipf("SKIP: no runsc (set %s or install Go to build it): %v", setup.RunscEnv, err)
	}
	static := filepath.Join(t.TempDir(), "airlock-agent")
	cmd := exec.Command("go", "build", "-trimpath", "-o", static, "github.com/airlock/airlock/cmd/airlock-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build airlock-agent: %v\n%s", err, b)
	}
	_, rootfs, err := setup.EnsureDebianTemplate(ctx, testCacheDir, static, io.Discard)
	if err != nil {
		t.Skipf("SKIP: needs the base template (debootstrap): %v", err)
	}

	base := t.TempDir()
	state, run := filepath.Join(base, "state"), filepath.Join(base, "run")
	t.Cleanup(func() { syscall.Unmount(filepath.Join(state, "null-netns"), syscall.MNT_DETACH) })
	g, err := gvisor.New(gvisor.Config{RunscPath: runsc, StateDir: state, RunDir: run, CgroupParent: "/airlock-test"})
	if err != nil {
		t.Fatal(err)
	}
	q := newLazyQEMU(ctx, filepath.Join(base, "data"), broken, io.Discard, slog.New(slog.NewTextHandler(io.Discard, nil)))
	<-q.Ready()
	if err := q.Unavailable(); err == nil || !strings.Contains(err.Error(), "must be static") {
		t.Fatalf("qemu Unavailable = %v, want the static-agent reason", err)
	}
	drivers := map[string]airruntime.Driver{gvisor.Name: g, qemu.Name: q}
	m := &airruntime.Multi{Drivers: drivers, Default: gvisor.Name}
	if got := m.Offered(); !slices.Equal(got, []string{gvisor.Name}) {
		t.Errorf("Offered = %v, want only gvisor", got)
	}

	id := runtimetest.NewID()
	t.Cleanup(func() { _ = g.Delete(context.Background(), id) })
	sb, err := m.Start(ctx, airruntime.Spec{ID: id, RootFS: rootfs, VCPUs: 1, MemoryMiB: 128})
	if err != nil {
		t.Fatal(err)
	}
	sb.Close()

	_, err = m.Start(ctx, airruntime.Spec{ID: runtimetest.NewID(), Runtime: qemu.Name, RootFS: rootfs, VCPUs: 1, MemoryMiB: 128})
	if err == nil || !strings.Contains(err.Error(), "must be static") {
		t.Errorf("qemu Start = %v, want the set-up failure", err)
	}

	restarted := &airruntime.Multi{Drivers: drivers, Default: gvisor.Name}
	for name, mm := range map[string]*airruntime.Multi{"same worker": m, "restarted worker": restarted} {
		ids, err := mm.List(ctx)
		if err != nil || !slices.Contains(ids, id) {
			t.Errorf("%s: List = %v, %v; want the gvisor sandbox %s", name, ids, err, id)
		}
		if st, err := mm.Status(ctx, id); err != nil || st != airruntime.StatusRunning {
			t.Errorf("%s: Status = %q, %v; want running", name, st, err)
		}
	}

	// A qemu set-up still running (it takes a minute on a first start, and
	// may hang on a package mirror) while a qemu sandbox of an earlier run
	// has its run dir: gVisor calls must not wait for it either. The
	// context only keeps the old behaviour (wait for the set-up) from
	// hanging the test.
	pendingDir := filepath.Join(base, "pending-qemu-run")
	qid := runtimetest.NewID()
	if err := os.MkdirAll(filepath.Join(pendingDir, qid), 0o700); err != nil {
		t.Fatal(err)
	}
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	pending := airruntime.NewLazy(ctx, airruntime.LazyConfig{ // never ready during the test
		Info:   qemu.Info,
		Traces: func() []string { return runDirs(pendingDir) },
		Setup: func(context.Context) (airruntime.Driver, error) {
			<-hold
			return nil, errors.New("test over")
		},
	})
	pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
	defer pcancel()
	pm := &airruntime.Multi{Drivers: map[string]airruntime.Driver{gvisor.Name: g, qemu.Name: pending}, Default: gvisor.Name}
	if ids, err := pm.List(pctx); err != nil || !slices.Contains(ids, id) || !slices.Contains(ids, qid) {
		t.Errorf("pending qemu set-up: List = %v, %v; want the gvisor sandbox and the qemu one's id", ids, err)
	}
	if st, err := pm.Status(pctx, id); err != nil || st != airruntime.StatusRunning {
		t.Errorf("pending qemu set-up: Status = %q, %v; want running", st, err)
	}

	// Restarted workers have not seen Start: their Delete asks every
	// driver (the broken qemu one, then the pending one: idempotent).
	if err := restarted.Delete(ctx, id); err != nil {
		t.Fatalf("Delete of the gvisor sandbox: %v", err)
	}
	if err := (&airruntime.Multi{Drivers: pm.Drivers, Default: gvisor.Name}).Delete(pctx, id); err != nil {
		t.Fatalf("pending qemu set-up: Delete of the gvisor sandbox: %v", err)
	}
	if st, err := m.Status(ctx, id); err != nil || st != airruntime.StatusGone {
		t.Errorf("after Delete, Status = %q, %v; want gone", st, err)
	}
}
