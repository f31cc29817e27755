package worker

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/gvisor"
	"github.com/airlock/airlock/internal/workerapi"
)

// unavailableDriver is a runtime whose set-up failed, as the qemu one does
// with a dynamically linked agent, at its most hostile: every call, Delete
// of any id included, fails with the reason.
type unavailableDriver struct{ err error }

func (d unavailableDriver) Name() string       { return "qemu" }
func (d unavailableDriver) Unavailable() error { return d.err }
func (d unavailableDriver) Start(context.Context, runtime.Spec) (runtime.Sandbox, error) {
	return nil, d.err
}
func (d unavailableDriver) Adopt(context.Context, string) (runtime.Sandbox, error) { return nil, d.err }
func (d unavailableDriver) Delete(context.Context, string) error                   { return d.err }
func (d unavailableDriver) List(context.Context) ([]string, error)                 { return nil, d.err }
func (d unavailableDriver) Status(context.Context, string) (runtime.Status, error) { return "", d.err }

// TestUnavailableRuntimeDoesNotBlockGVisor is the "plain go build, airlock
// up, create a gVisor sandbox, delete it" report on the real worker and real
// runsc: with a broken qemu runtime beside gVisor, the worker does not offer
// qemu, adopts its gVisor sandbox after a restart (the runtime listing used
// to fail with the qemu error), and the sandbox's delete completes (it used
// to fail with the qemu error and retry every 5 s forever).
func TestUnavailableRuntimeDoesNotBlockGVisor(t *testing.T) {
	runsc := requireRunsc(t)
	tmpl, rootfs := baseTemplate(t)
	ctx := testContext(t)
	base, err := os.MkdirTemp("", "uiso") // short: runsc's socket paths are at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	newDriver := func() *gvisor.Driver {
		d, err := gvisor.New(gvisor.Config{RunscPath: runsc, StateDir: filepath.Join(base, "state"), RunDir: filepath.Join(base, "run")})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	broken := unavailableDriver{&runtime.UnavailableError{Runtime: "qemu",
		Err: errors.New("qemu runtime set-up: qemu set-up: the agent is the guest's /init and must be static")}}
	multi := func() runtime.Driver {
		return &runtime.Multi{Drivers: map[string]runtime.Driver{gvisor.Name: newDriver(), "qemu": broken}, Default: gvisor.Name}
	}
	rootfsFor := func(d string) string {
		if d == tmpl.Digest {
			return rootfs
		}
		return ""
	}
	id := newSandboxID()
	t.Cleanup(func() {
		if err := newDriver().Delete(context.Background(), id); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		for range 10 {
			if syscall.Unmount(filepath.Join(base, "state", "null-netns"), syscall.MNT_DETACH) != nil {
				break
			}
		}
	})

	srv := newFakeServer(t)
	tw := startWorker(t, srv, multi(), rootfsFor)
	if got := tw.w.runtimes(); slices.Contains(got, "qemu") {
		t.Errorf("the worker offers %v, an unavailable qemu among them", got)
	}
	srv.assign(id, tmpl.Digest, model.StateRunning)
	srv.waitObserved(ctx, id, model.StateRunning)

	// Restart: the new worker knows nothing and must find the sandbox by
	// listing every runtime.
	tw.stop(t)
	tw2 := startWorker(t, srv, multi(), rootfsFor)
	srv.waitRegistered(ctx, 2)
	tw2.w.mu.Lock()
	sb := tw2.w.sandboxes[id]
	tw2.w.mu.Unlock()
	if sb == nil || sb.state != model.StateRunning {
		t.Fatalf("after a restart the gVisor sandbox was not adopted: %+v", sb)
	}

	srv.assign(id, tmpl.Digest, model.StateDeleted)
	srv.waitObserved(ctx, id, model.StateDeleted)
	if ids, err := newDriver().List(ctx); err != nil || slices.Contains(ids, id) {
		t.Fatalf("after delete, runsc lists %v (%v)", ids, err)
	}

	// A qemu sandbox placed here anyway (the server learned the runtimes
	// before the set-up failed) fails at once with the runtime's reason.
	qid := newSandboxID()
	srv.Set(workerapi.Assignment{
		Sandbox: workerapi.SandboxSpec{ID: qid, Template: "base", TemplateDigest: tmpl.Digest, Runtime: "qemu", State: model.StateStarting,
			Resources: model.Resources{VCPUs: 1, MemoryMiB: 512}},
		Desired: model.StateRunning,
	})
	o := srv.waitObserved(ctx, qid, model.StateFailed)
	if !strings.Contains(o.Reason, "runtime qemu is unavailable on this worker") || !strings.Contains(o.Reason, "must be static") {
		t.Errorf("qemu sandbox failed with %q, want the runtime's reason", o.Reason)
	}
}
