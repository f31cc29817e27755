package worker

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/gvisor"
	"github.com/airlock/airlock/internal/setup"
	"github.com/airlock/airlock/internal/snapshot"
	"github.com/airlock/airlock/internal/testenv"
	"github.com/airlock/airlock/internal/token"
)

// testCacheDir is shared by every test run on the machine, so the Debian
// layer is debootstrapped once; AIRLOCK_TEST_CACHE names another, as for
// internal/e2e and the runtime packages.
var testCacheDir = cmp.Or(os.Getenv("AIRLOCK_TEST_CACHE"), "/var/tmp/airlock-test-cache")

// requireRunsc returns a static runsc: $AIRLOCK_RUNSC, the set-up cache, or
// the machine's prebuilt one; it skips when there is none.
func requireRunsc(t testing.TB) string {
	t.Helper()
	testenv.RequireRunsc(t)
	for _, p := range []string{os.Getenv(setup.RunscEnv), filepath.Join(testCacheDir, "bin", "runsc"), "/tmp/prep/bin/runsc"} {
		if p == "" {
			continue
		}
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p
		}
	}
	t.Skipf("needs a static runsc: set %s", setup.RunscEnv)
	return ""
}

// baseTemplate builds (or reuses) the base template with this tree's agent.
func baseTemplate(t testing.TB) (model.Template, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	tmpl, rootfs, err := setup.EnsureDebianTemplate(ctx, testCacheDir, buildAgent(t), io.Discard)
	if err != nil {
		t.Skipf("needs the base template (debootstrap): %v", err)
	}
	return tmpl, rootfs
}

func newSandboxID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "sbx-" + hex.EncodeToString(b)
}

// gvisorEnv is a worker over the real gVisor driver with one sandbox
// assigned and running.
type gvisorEnv struct {
	srv       *fakeServer
	tw        *testWorker
	id        string
	tmpl      model.Template
	newDriver func() *gvisor.Driver
	rootfsFor func(string) string
	// snaps is the worker's snapshot store; driver wraps a gvisor driver the
	// way the worker gets it (a runtime.Multi, as in the daemon).
	snaps  *snapshot.Store
	driver func() runtime.Driver
	base   string
}

func newGVisorEnv(t testing.TB) *gvisorEnv { return newGVisorEnvWith(t, nil) }

// newGVisorEnvWith lets wrap replace the gvisor driver inside the Multi
// (to inject failures).
func newGVisorEnvWith(t testing.TB, wrap func(*gvisor.Driver) runtime.Driver, opts ...func(*Config)) *gvisorEnv {
	runsc := requireRunsc(t)
	tmpl, rootfs := baseTemplate(t)
	ctx := testContext(t)
	base := t.TempDir()
	e := &gvisorEnv{id: newSandboxID(), tmpl: tmpl, srv: newFakeServer(t), base: base}
	e.newDriver = func() *gvisor.Driver {
		d, err := gvisor.New(gvisor.Config{RunscPath: runsc, StateDir: filepath.Join(base, "state"), RunDir: filepath.Join(base, "run")})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	e.rootfsFor = func(d string) string {
		if d == tmpl.Digest {
			return rootfs
		}
		return ""
	}
	t.Cleanup(func() {
		if err := e.newDriver().Delete(context.Background(), e.id); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		// runsc leaves its gofer's network namespace mounted in the state
		// dir (stacked, when several runsc processes raced to mount it).
		for range 10 {
			if syscall.Unmount(filepath.Join(base, "state", "null-netns"), syscall.MNT_DETACH) != nil {
				break
			}
		}
	})
	snaps, err := snapshot.Open(filepath.Join(base, "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	e.snaps = snaps
	e.driver = func() runtime.Driver {
		var d runtime.Driver = e.newDriver()
		if wrap != nil {
			d = wrap(e.newDriver())
		}
		return &runtime.Multi{Drivers: map[string]runtime.Driver{gvisor.Name: d}, Default: gvisor.Name}
	}
	e.tw = startWorkerWith(t, e.srv, e.driver(), e.rootfsFor, e.snaps, opts...)
	t0 := time.Now()
	e.srv.assign(e.id, tmpl.Digest, model.StateRunning)
	e.srv.waitObserved(ctx, e.id, model.StateRunning)
	t.Logf("assigned → running: %v", time.Since(t0))
	return e
}

// TestWorkerGVisor runs the worker over the real gVisor driver: start,
// commands and files as the default user, a worker restart that adopts the
// running sandbox (a detached process survives it), then delete.
func TestWorkerGVisor(t *testing.T) {
	e := newGVisorEnv(t)
	ctx := testContext(t)
	srv, tw, id, tmpl := e.srv, e.tw, e.id, e.tmpl
	newDriver, rootfsFor := e.newDriver, e.rootfsFor

	run := func(tw *testWorker, cid string, argv ...string) (string, agentapi.Exit) {
		t.Helper()
		tok := srv.sign(t, token.Claims{SandboxID: id, Scope: token.ScopeCommand,
			Command: &model.CommandSpec{ID: cid, SandboxID: id, Argv: argv}})
		var out, errb bytes.Buffer
		exit, err := client.RunCommand(ctx, sandboxURL(tw.w, id)+"/commands/"+cid+"/attach", tok, nil, &out, &errb)
		if err != nil {
			t.Fatalf("run %v: %v (stderr %q)", argv, err, errb.String())
		}
		return out.String(), exit
	}
	if out, exit := run(tw, "c-whoami", "id", "-un"); out != "user\n" || exit.ExitCode != 0 {
		t.Fatalf("id -un: %q %+v", out, exit)
	}
	if out, _ := run(tw, "c-py", "python3", "-c", "print(6*7)"); out != "42\n" {
		t.Fatalf("python3: %q", out)
	}
	if _, exit := run(tw, "c-exit7", "sh", "-c", "exit 7"); exit.ExitCode != 7 {
		t.Fatalf("exit code %+v, want 7", exit)
	}

	// Files: 64 MiB each way, checked inside the sandbox too.
	fc := &client.FilesClient{URL: tw.w.DataPlaneURL(), Token: srv.sign(t, token.Claims{SandboxID: id, Scope: token.ScopeFiles})}
	const size = 64 << 20
	h := sha256.New()
	t1 := time.Now()
	fi, err := fc.Write(ctx, "blob", io.TeeReader(io.LimitReader(mrand.NewChaCha8([32]byte{3}), size), h), "", "")
	if err != nil {
		t.Fatal(err)
	}
	tw1 := time.Since(t1)
	sum := hex.EncodeToString(h.Sum(nil))
	if fi.Size != size || fi.Owner != "user" || fi.Path != agentapi.DefaultHome+"/blob" {
		t.Fatalf("written %+v", fi)
	}
	t1 = time.Now()
	rc, err := fc.Read(ctx, agentapi.DefaultHome+"/blob")
	if err != nil {
		t.Fatal(err)
	}
	h.Reset()
	n, err := io.Copy(h, rc)
	rc.Close()
	tr1 := time.Since(t1)
	if err != nil || n != size || hex.EncodeToString(h.Sum(nil)) != sum {
		t.Fatalf("read back %d bytes, err %v, sha equal %v", n, err, hex.EncodeToString(h.Sum(nil)) == sum)
	}
	t.Logf("64 MiB through gVisor: write %.0f MB/s, read %.0f MB/s", size/tw1.Seconds()/1e6, size/tr1.Seconds()/1e6)
	if out, _ := run(tw, "c-sha", "sha256sum", "blob"); !strings.HasPrefix(out, sum+" ") {
		t.Fatalf("sha256sum inside: %q, want %s", out, sum)
	}

	// A detached process, then a worker restart.
	tok := srv.sign(t, token.Claims{SandboxID: id, Scope: token.ScopeCommand,
		Command: &model.CommandSpec{ID: "c-sleep", SandboxID: id, Argv: []string{"sleep", "1000"}}})
	s, err := client.AttachCommand(ctx, sandboxURL(tw.w, id)+"/commands/c-sleep/attach", tok, 0)
	if err != nil {
		t.Fatal(err)
	}
	if kind, _, err := s.Next(); err != nil || kind != agentapi.FrameStarted {
		t.Fatalf("first frame %d: %v", kind, err)
	}
	s.Close()

	tw.stop(t)
	tw2 := startWorker(t, srv, newDriver(), rootfsFor)
	srv.waitRegistered(ctx, 2) // adoption happens before registration
	fc.URL = tw2.w.DataPlaneURL()
	cmds, err := fc.ListCommands(ctx)
	if err != nil {
		t.Fatalf("list commands after restart: %v", err)
	}
	i := slices.IndexFunc(cmds, func(p agentapi.ProcessInfo) bool { return p.ID == "c-sleep" })
	if i < 0 || !cmds[i].Running {
		t.Fatalf("detached process not running after worker restart: %+v", cmds)
	}
	if out, _ := run(tw2, "c-after", "cat", "/proc/sys/kernel/hostname"); out != id+"\n" {
		t.Fatalf("command after restart: %q", out)
	}
	if st, err := fc.Stat(ctx, "blob"); err != nil || st.Size != size {
		t.Fatalf("file after restart: %+v %v", st, err)
	}

	// Pause: the data plane refuses while frozen when the sandbox opted out
	// of auto-wake; a restarted worker adopts the paused sandbox; resume
	// brings back the same processes.
	srv.setNoAutoWake(id, true)
	srv.assign(id, tmpl.Digest, model.StatePaused)
	srv.waitObserved(ctx, id, model.StatePaused)
	if _, err := fc.Stat(ctx, "blob"); !errors.Is(err, model.ErrConflict) || !strings.Contains(err.Error(), "opted out of auto-wake") {
		t.Fatalf("stat while paused without auto-wake: %v, want the server's conflict", err)
	}
	tw2.stop(t)
	tw3 := startWorker(t, srv, newDriver(), rootfsFor)
	srv.waitRegistered(ctx, 3)
	o, _ := srv.Observed(id)
	if o.State != model.StatePaused {
		t.Fatalf("after restarting while paused: observed %+v", o)
	}
	srv.assign(id, tmpl.Digest, model.StateRunning)
	srv.waitObserved(ctx, id, model.StateRunning)
	fc.URL = tw3.w.DataPlaneURL()
	cmds, err = fc.ListCommands(ctx)
	if err != nil {
		t.Fatalf("list commands after resume: %v", err)
	}
	if i := slices.IndexFunc(cmds, func(p agentapi.ProcessInfo) bool { return p.ID == "c-sleep" }); i < 0 || !cmds[i].Running {
		t.Fatalf("detached process not running after pause, restart, resume: %+v", cmds)
	}

	srv.assign(id, tmpl.Digest, model.StateDeleted)
	srv.waitObserved(ctx, id, model.StateDeleted)
	if ids, _ := newDriver().List(ctx); slices.Contains(ids, id) {
		t.Fatalf("sandbox still listed by the driver after delete: %v", ids)
	}
	if out, err := exec.Command("pgrep", "-f", id).Output(); err == nil {
		t.Fatalf("processes for %s remain after delete:\n%s", id, out)
	}
	if _, err := fc.Stat(ctx, "blob"); err == nil {
		t.Fatal("data plane still serves a deleted sandbox")
	}
}

// BenchmarkGVisorFiles64MiB measures data-plane file throughput into and
// out of a gVisor sandbox: MB/s of one 64 MiB write, and of one read.
func BenchmarkGVisorFiles64MiB(b *testing.B) {
	e := newGVisorEnv(b)
	ctx := testContext(b)
	fc := &client.FilesClient{URL: e.tw.w.DataPlaneURL(), Token: e.srv.sign(b, token.Claims{SandboxID: e.id, Scope: token.ScopeFiles})}
	const size = 64 << 20
	data := make([]byte, size)
	_, _ = mrand.NewChaCha8([32]byte{5}).Read(data)
	b.Run("write", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			if _, err := fc.Write(ctx, "bench.bin", bytes.NewReader(data), "", ""); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("read", func(b *testing.B) {
		b.SetBytes(size)
		buf := make([]byte, 1<<20)
		for b.Loop() {
			rc, err := fc.Read(ctx, "bench.bin")
			if err != nil {
				b.Fatal(err)
			}
			n, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{rc}, buf)
			rc.Close()
			if err != nil || n != size {
				b.Fatalf("read %d bytes: %v", n, err)
			}
		}
	})
}
