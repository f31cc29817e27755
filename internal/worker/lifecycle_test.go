package worker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/gvisor"
	"github.com/airlock/airlock/internal/snapshot"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

// lifeEnv adds data-plane helpers to a gvisorEnv.
type lifeEnv struct {
	*gvisorEnv
	t     *testing.T
	ctx   context.Context
	files map[string]string // path → sha256 of what was written
}

func newLifeEnv(t *testing.T, wrap func(*gvisor.Driver) runtime.Driver) *lifeEnv {
	e := newGVisorEnvWith(t, wrap)
	return &lifeEnv{gvisorEnv: e, t: t, ctx: testContext(t), files: map[string]string{}}
}

func (e *lifeEnv) fc() *client.FilesClient {
	return &client.FilesClient{URL: e.tw.w.DataPlaneURL(), Token: e.srv.sign(e.t, token.Claims{SandboxID: e.id, Scope: token.ScopeFiles})}
}

func (e *lifeEnv) run(cid string, argv ...string) (string, agentapi.Exit) {
	e.t.Helper()
	tok := e.srv.sign(e.t, token.Claims{SandboxID: e.id, Scope: token.ScopeCommand,
		Command: &model.CommandSpec{ID: cid, SandboxID: e.id, Argv: argv}})
	var out, errb bytes.Buffer
	exit, err := client.RunCommand(e.ctx, sandboxURL(e.tw.w, e.id)+"/commands/"+cid+"/attach", tok, nil, &out, &errb)
	if err != nil {
		e.t.Fatalf("run %v: %v (stderr %q)", argv, err, errb.String())
	}
	return out.String(), exit
}

// detach starts a command and leaves it running without an attachment.
func (e *lifeEnv) detach(cid string, argv ...string) {
	e.t.Helper()
	tok := e.srv.sign(e.t, token.Claims{SandboxID: e.id, Scope: token.ScopeCommand,
		Command: &model.CommandSpec{ID: cid, SandboxID: e.id, Argv: argv}})
	s, err := client.AttachCommand(e.ctx, sandboxURL(e.tw.w, e.id)+"/commands/"+cid+"/attach", tok, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	if kind, _, err := s.Next(); err != nil || kind != agentapi.FrameStarted {
		e.t.Fatalf("first frame %d: %v", kind, err)
	}
	s.Close()
}

// writeRandom writes a new file of random content and remembers its hash.
func (e *lifeEnv) writeRandom(name string, size int64, seed uint64) {
	e.t.Helper()
	h := sha256.New()
	var s [32]byte
	copy(s[:], strconv.FormatUint(seed, 10))
	if _, err := e.fc().Write(e.ctx, name, io.TeeReader(io.LimitReader(mrand.NewChaCha8(s), size), h), "", ""); err != nil {
		e.t.Fatalf("write %s: %v", name, err)
	}
	e.files[name] = hex.EncodeToString(h.Sum(nil))
}

// verifyFiles reads back every file written so far, byte for byte.
func (e *lifeEnv) verifyFiles() {
	e.t.Helper()
	for name, sum := range e.files {
		rc, err := e.fc().Read(e.ctx, name)
		if err != nil {
			e.t.Fatalf("read %s: %v", name, err)
		}
		h := sha256.New()
		_, err = io.Copy(h, rc)
		rc.Close()
		if err != nil || hex.EncodeToString(h.Sum(nil)) != sum {
			e.t.Fatalf("file %s differs after lifecycle changes (err %v)", name, err)
		}
	}
}

// counterLine is one line of the counter file: the writer's PID and time.
type counterLine struct {
	pid int
	at  time.Time
}

const counterScript = `while :; do echo "$$ $(date +%s%N)" >> counter.log; sleep 0.1; done`

func (e *lifeEnv) counter() []counterLine {
	e.t.Helper()
	rc, err := e.fc().Read(e.ctx, "counter.log")
	if errors.Is(err, model.ErrNotFound) {
		return nil // not written yet
	}
	if err != nil {
		e.t.Fatalf("read counter: %v", err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		e.t.Fatal(err)
	}
	var ls []counterLine
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue // a line being written
		}
		pid, err1 := strconv.Atoi(f[0])
		ns, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		ls = append(ls, counterLine{pid, time.Unix(0, ns)})
	}
	return ls
}

// counterGrows waits until the counter has more than n lines and returns them.
func (e *lifeEnv) counterGrows(n int) []counterLine {
	e.t.Helper()
	for {
		ls := e.counter()
		if len(ls) > n+2 {
			return ls
		}
		select {
		case <-e.ctx.Done():
			e.t.Fatalf("counter stuck at %d lines", len(ls))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func samePID(t *testing.T, ls []counterLine) {
	t.Helper()
	for _, l := range ls {
		if l.pid != ls[0].pid {
			t.Fatalf("counter PID changed from %d to %d", ls[0].pid, l.pid)
		}
	}
}

// maxGap is the longest pause between consecutive counter lines.
func maxGap(ls []counterLine) time.Duration {
	var g time.Duration
	for i := 1; i < len(ls); i++ {
		g = max(g, ls[i].at.Sub(ls[i-1].at))
	}
	return g
}

// noRunsc fails if any process mentions the sandbox id.
func noRunsc(t *testing.T, id string) {
	t.Helper()
	if out, err := exec.Command("pgrep", "-af", id).Output(); err == nil {
		t.Fatalf("processes for %s while suspended:\n%s", id, out)
	}
}

func (e *lifeEnv) suspend() string {
	e.t.Helper()
	e.srv.assign(e.id, e.tmpl.Digest, model.StateSuspended)
	o := e.srv.waitObserved(e.ctx, e.id, model.StateSuspended)
	if o.SnapshotID == "" || o.SnapshotBytes <= 0 {
		e.t.Fatalf("suspended without a snapshot: %+v", o)
	}
	noRunsc(e.t, e.id)
	ms, err := e.snaps.List(e.id)
	if err != nil {
		e.t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].ID != o.SnapshotID || ms[0].Kind != snapshot.KindSuspend {
		e.t.Fatalf("snapshots of %s while suspended: %+v, want exactly %s", e.id, ms, o.SnapshotID)
	}
	if err := e.snaps.Verify(e.id, o.SnapshotID); err != nil {
		e.t.Fatalf("verify snapshot: %v", err)
	}
	return o.SnapshotID
}

func (e *lifeEnv) wake() {
	e.t.Helper()
	t0 := time.Now()
	e.srv.assign(e.id, e.tmpl.Digest, model.StateRunning)
	e.srv.waitObserved(e.ctx, e.id, model.StateRunning)
	e.t.Logf("wake: %v", time.Since(t0))
}

// TestWorkerLifecycleGVisor: pause, suspend, wake, auto-wake, an
// attachment across a suspend, a worker restart while suspended, and
// delete, with a detached counter and files checked throughout.
func TestWorkerLifecycleGVisor(t *testing.T) {
	e := newLifeEnv(t, nil)
	e.detach("c-counter", "sh", "-c", counterScript)
	e.writeRandom("f0", 3<<20, 0)
	n := len(e.counterGrows(5))

	// Pause for 2 s: the counter stops (a gap of at least 2 s), and the
	// same process continues after resume. Data-plane use while paused is
	// refused for a sandbox that opted out of auto-wake.
	e.srv.setNoAutoWake(e.id, true)
	e.srv.assign(e.id, e.tmpl.Digest, model.StatePaused)
	e.srv.waitObserved(e.ctx, e.id, model.StatePaused)
	if _, err := e.fc().Stat(e.ctx, "f0"); !errors.Is(err, model.ErrConflict) {
		t.Fatalf("stat while paused without auto-wake: %v, want conflict", err)
	}
	time.Sleep(2 * time.Second)
	e.srv.assign(e.id, e.tmpl.Digest, model.StateRunning)
	e.srv.waitObserved(e.ctx, e.id, model.StateRunning)
	ls := e.counterGrows(n)
	samePID(t, ls)
	if g := maxGap(ls); g < 2*time.Second {
		t.Fatalf("longest counter gap %v across a 2 s pause: the counter kept running", g)
	} else {
		t.Logf("counter gap across the pause: %v", g)
	}

	// Auto-wake from paused: a file request resumes the sandbox.
	e.srv.setNoAutoWake(e.id, false)
	e.srv.assign(e.id, e.tmpl.Digest, model.StatePaused)
	e.srv.waitObserved(e.ctx, e.id, model.StatePaused)
	e.verifyFiles()
	e.srv.waitObserved(e.ctx, e.id, model.StateRunning)

	// Suspend and wake three times, new files before each; the counter is
	// the same process throughout.
	for i := 1; i <= 3; i++ {
		e.writeRandom(fmt.Sprintf("f%d", i), int64(i)<<20+int64(i)*777, uint64(i))
		n = len(e.counter())
		e.suspend()
		e.wake()
		ls = e.counterGrows(n)
		samePID(t, ls)
		if ms, _ := e.snaps.List(e.id); len(ms) != 0 {
			t.Fatalf("suspend snapshots left after wake: %+v", ms)
		}
	}
	e.verifyFiles()

	// Auto-wake from suspended; opted out first, which is a 409.
	e.srv.setNoAutoWake(e.id, true)
	e.suspend()
	if _, err := e.fc().Stat(e.ctx, "f0"); !errors.Is(err, model.ErrConflict) {
		t.Fatalf("stat while suspended without auto-wake: %v, want conflict", err)
	}
	e.srv.setNoAutoWake(e.id, false)
	wakes := e.srv.wakeCount()
	e.verifyFiles()
	if got := e.srv.wakeCount(); got != wakes+1 {
		t.Fatalf("wake requests: %d, want %d", got, wakes+1)
	}

	// A worker restart while suspended: the new worker finds the committed
	// snapshot and wakes from it.
	e.suspend()
	e.tw.stop(t)
	e.tw = startWorkerWith(t, e.srv, e.driver(), e.rootfsFor, e.snaps)
	e.srv.waitRegistered(e.ctx, 2)
	e.srv.waitObserved(e.ctx, e.id, model.StateSuspended)
	e.wake()
	samePID(t, e.counterGrows(len(e.counter())))

	// An attachment open across a suspend re-attaches and sees all output.
	done := make(chan error, 1)
	var out bytes.Buffer
	u, tok := e.attachURLFor("c-seq", "sh", "-c", "for i in $(seq 1 60); do echo $i; sleep 0.1; done")
	go func() {
		_, err := client.RunCommand(e.ctx, u, tok, nil, &out, io.Discard)
		done <- err
	}()
	time.Sleep(time.Second) // let it print a few lines first
	e.srv.assign(e.id, e.tmpl.Digest, model.StateSuspended)
	e.srv.waitObserved(e.ctx, e.id, model.StateSuspended)
	if err := <-done; err != nil {
		t.Fatalf("attached command across a suspend: %v", err)
	}
	var want strings.Builder
	for i := 1; i <= 60; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if out.String() != want.String() {
		t.Fatalf("output across a suspend:\n%q\nwant 1..60", out.String())
	}
	e.srv.waitObserved(e.ctx, e.id, model.StateRunning) // the re-attach woke it
	e.verifyFiles()
	samePID(t, e.counter())

	e.srv.assign(e.id, e.tmpl.Digest, model.StateDeleted)
	e.srv.waitObserved(e.ctx, e.id, model.StateDeleted)
	if ms, _ := e.snaps.List(e.id); len(ms) != 0 {
		t.Fatalf("snapshots left after delete: %+v", ms)
	}
	noRunsc(t, e.id)
}

func (e *lifeEnv) attachURLFor(cid string, argv ...string) (string, string) {
	tok := e.srv.sign(e.t, token.Claims{SandboxID: e.id, Scope: token.ScopeCommand,
		Command: &model.CommandSpec{ID: cid, SandboxID: e.id, Argv: argv}})
	return sandboxURL(e.tw.w, e.id) + "/commands/" + cid + "/attach", tok
}

// roCheckpoint makes every checkpoint write into a read-only directory, so
// the real runsc checkpoint fails while the sandbox keeps running.
type roCheckpoint struct {
	*gvisor.Driver
	dir string
}

func (d *roCheckpoint) Checkpoint(ctx context.Context, id, _ string, leaveRunning bool) error {
	return d.Driver.Checkpoint(ctx, id, d.dir, leaveRunning)
}

// TestWorkerSuspendFailsGVisor: a checkpoint that fails leaves the sandbox
// running with the reason, no snapshot, and its processes untouched.
func TestWorkerSuspendFailsGVisor(t *testing.T) {
	requireRunsc(t)
	ro := filepath.Join(t.TempDir(), "ro")
	if err := os.Mkdir(ro, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", ro, "tmpfs", syscall.MS_RDONLY, "size=1m"); err != nil {
		t.Skipf("needs a read-only tmpfs mount: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(ro, syscall.MNT_DETACH) })
	e := newLifeEnv(t, func(d *gvisor.Driver) runtime.Driver { return &roCheckpoint{Driver: d, dir: ro} })
	e.detach("c-counter", "sh", "-c", counterScript)
	e.writeRandom("f0", 1<<20, 9)
	n := len(e.counterGrows(3))

	e.srv.assign(e.id, e.tmpl.Digest, model.StateSuspended)
	o := e.srv.waitFor(e.ctx, e.id, func(o workerapi.Observed, h []model.SandboxState) bool {
		return slices.Contains(h, model.StateSuspending) && o.State != model.StateSuspending
	})
	if o.State != model.StateRunning || !strings.HasPrefix(o.Reason, "suspend failed") {
		t.Fatalf("after a failed suspend: %+v", o)
	}
	t.Logf("reason: %s", o.Reason)
	if ms, _ := e.snaps.List(e.id); len(ms) != 0 {
		t.Fatalf("snapshots after a failed suspend: %+v", ms)
	}
	// Like the controller: roll the desired state back.
	e.srv.assign(e.id, e.tmpl.Digest, model.StateRunning)
	samePID(t, e.counterGrows(n))
	e.verifyFiles()
	if out, _ := e.run("c-echo", "echo", "alive"); out != "alive\n" {
		t.Fatalf("command after a failed suspend: %q", out)
	}
}

// TestWorkerCrashMidSuspendGVisor simulates a worker killed during suspend:
// (1) after the checkpoint stopped the guest but before the commit (a
// pending snapshot dir and a stopped runtime): the restarted worker GCs the
// pending dir, restores nothing and reports the sandbox failed; (2) after
// the commit but before the runtime was released: the restarted worker
// reports it suspended with that snapshot, and it wakes with its processes.
func TestWorkerCrashMidSuspendGVisor(t *testing.T) {
	e := newLifeEnv(t, nil)
	e.detach("c-counter", "sh", "-c", counterScript)
	e.writeRandom("f0", 2<<20, 4)
	n := len(e.counterGrows(3))

	// (2) committed, runtime stopped but not released. The server wants
	// it suspended (the crash came in the middle of a suspend).
	e.tw.stop(t)
	e.srv.assign(e.id, e.tmpl.Digest, model.StateSuspended)
	d := e.newDriver()
	p, err := e.snaps.Begin(e.id)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Checkpoint(e.ctx, e.id, p.Dir(), false); err != nil {
		t.Fatal(err)
	}
	m, err := p.Commit(snapshot.Meta{Kind: snapshot.KindSuspend, Runtime: gvisor.Name})
	if err != nil {
		t.Fatal(err)
	}
	// runsc may report the stopped guest as running for a while: the
	// restarted worker must go by the committed snapshot, not by that.
	if err := e.snaps.GC(); err != nil {
		t.Fatal(err)
	}
	e.tw = startWorkerWith(t, e.srv, e.driver(), e.rootfsFor, e.snaps)
	e.srv.waitRegistered(e.ctx, 2)
	o := e.srv.waitObserved(e.ctx, e.id, model.StateSuspended)
	if o.SnapshotID != m.ID {
		t.Fatalf("suspended with snapshot %q, want %q", o.SnapshotID, m.ID)
	}
	noRunsc(t, e.id)
	e.wake()
	samePID(t, e.counterGrows(n))
	e.verifyFiles()

	// (3) checkpoint done and marked complete (what suspend does once the
	// checkpoint returns), commit never happened: recovered at start.
	n = len(e.counter())
	e.tw.stop(t)
	e.srv.assign(e.id, e.tmpl.Digest, model.StateSuspended)
	p, err = e.snaps.Begin(e.id)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Checkpoint(e.ctx, e.id, p.Dir(), false); err != nil {
		t.Fatal(err)
	}
	if err := p.MarkComplete(snapshot.Meta{Kind: snapshot.KindSuspend, Runtime: gvisor.Name}); err != nil {
		t.Fatal(err)
	}
	rec, err := e.snaps.Recover() // what the daemon does at start, before GC
	if err != nil || len(rec) != 1 || rec[0].ID != p.ID() {
		t.Fatalf("recover: %+v, %v; want %s", rec, err, p.ID())
	}
	if err := e.snaps.GC(); err != nil {
		t.Fatal(err)
	}
	e.tw = startWorkerWith(t, e.srv, e.driver(), e.rootfsFor, e.snaps)
	e.srv.waitRegistered(e.ctx, 3)
	o = e.srv.waitObserved(e.ctx, e.id, model.StateSuspended)
	if o.SnapshotID != p.ID() {
		t.Fatalf("suspended with snapshot %q, want the recovered %q", o.SnapshotID, p.ID())
	}
	noRunsc(t, e.id)
	e.wake()
	samePID(t, e.counterGrows(n))
	e.verifyFiles()

	// (1) checkpoint done, commit never happened.
	e.tw.stop(t)
	e.srv.assign(e.id, e.tmpl.Digest, model.StateSuspended)
	p, err = e.snaps.Begin(e.id)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Checkpoint(e.ctx, e.id, p.Dir(), false); err != nil {
		t.Fatal(err)
	}
	pending := p.Dir()
	if err := e.snaps.GC(); err != nil { // what the daemon does at start
		t.Fatal(err)
	}
	if _, err := os.Stat(pending); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pending snapshot dir after GC: %v", err)
	}
	e.tw = startWorkerWith(t, e.srv, e.driver(), e.rootfsFor, e.snaps)
	e.srv.waitRegistered(e.ctx, 4)
	o = e.srv.waitObserved(e.ctx, e.id, model.StateFailed)
	t.Logf("reason: %s", o.Reason)
	if ms, _ := e.snaps.List(e.id); len(ms) != 0 {
		t.Fatalf("snapshots after a crash before commit: %+v", ms)
	}
	noRunsc(t, e.id)
	e.srv.assign(e.id, e.tmpl.Digest, model.StateDeleted)
	e.srv.waitObserved(e.ctx, e.id, model.StateDeleted)
}

// badRestore makes restores fail for real (runsc restore from an empty
// image dir) while fail is set.
type badRestore struct {
	*gvisor.Driver
	empty string
	fail  *atomic.Bool
}

func (d *badRestore) Restore(ctx context.Context, spec runtime.Spec, dir string) (runtime.Sandbox, error) {
	if d.fail.Load() {
		dir = d.empty
	}
	return d.Driver.Restore(ctx, spec, dir)
}

// TestWorkerWakeFailsGVisor: a restore that fails leaves the sandbox
// suspended with the reason and its snapshot intact; the next wake works.
func TestWorkerWakeFailsGVisor(t *testing.T) {
	fail := new(atomic.Bool)
	empty := t.TempDir()
	e := newLifeEnv(t, func(d *gvisor.Driver) runtime.Driver { return &badRestore{Driver: d, empty: empty, fail: fail} })
	e.detach("c-counter", "sh", "-c", counterScript)
	e.writeRandom("f0", 1<<20, 11)
	n := len(e.counterGrows(3))
	snap := e.suspend()

	fail.Store(true)
	e.srv.assign(e.id, e.tmpl.Digest, model.StateRunning)
	o := e.srv.waitFor(e.ctx, e.id, func(o workerapi.Observed, h []model.SandboxState) bool {
		return slices.Contains(h, model.StateWaking) && o.State != model.StateWaking
	})
	if o.State != model.StateSuspended || !strings.HasPrefix(o.Reason, "wake failed") || o.SnapshotID != snap {
		t.Fatalf("after a failed wake: %+v, want suspended with snapshot %s and the reason", o, snap)
	}
	t.Logf("reason: %s", o.Reason)
	noRunsc(t, e.id)
	if err := e.snaps.Verify(e.id, snap); err != nil {
		t.Fatalf("snapshot after a failed wake: %v", err)
	}

	// Like the controller: back to suspended, then wake again.
	e.srv.assign(e.id, e.tmpl.Digest, model.StateSuspended)
	fail.Store(false)
	e.wake()
	samePID(t, e.counterGrows(n))
	e.verifyFiles()
}
