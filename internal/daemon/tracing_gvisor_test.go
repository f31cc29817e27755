package daemon

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/runtime/gvisor"
	"github.com/airlock/airlock/internal/store/sqlite"
	"github.com/airlock/airlock/internal/store/sqlstore"
	"github.com/airlock/airlock/internal/testenv"
	"github.com/airlock/airlock/internal/tracing"
	"github.com/airlock/airlock/internal/tracing/tracingtest"
)

// TestTracesOnGVisor is TestTracesAcrossServerAndWorker over the real
// gVisor runtime: the server and the worker `airlock up` wires (newServer,
// newWorker: runsc, the Debian template, a static agent built here), over
// loopback HTTP, exporting to an in-test OTLP/HTTP receiver. It needs root
// and the test cache's runsc and Debian layer (the full suite makes them;
// it skips naming what is missing rather than downloading them).
func TestTracesOnGVisor(t *testing.T) {
	testenv.RequireRunsc(t)
	testenv.RequireRoot(t, "the worker runs gVisor sandboxes")
	for _, f := range []string{"bin/runsc", "cache/debian-bookworm.done"} {
		if _, err := os.Stat(filepath.Join(testCacheDir, f)); err != nil {
			t.Skipf("SKIP: %s not in the test cache %s (the full suite, sudo ./scripts/test.sh, makes it): %v", f, testCacheDir, err)
		}
	}
	testenv.RequireGoBuild(t, "a static airlock-agent")
	t.Setenv(tracing.EnvEndpoint, "")
	t.Setenv(tracing.EnvTracesEndpoint, "")
	dir := t.TempDir()
	t.Cleanup(func() { syscall.Unmount(filepath.Join(dir, "runsc", "null-netns"), syscall.MNT_DETACH) })
	for _, d := range []string{"cache", "bin"} { // runsc and the Debian layer, read only
		if err := os.Symlink(filepath.Join(testCacheDir, d), filepath.Join(dir, d)); err != nil {
			t.Fatal(err)
		}
	}
	agent := filepath.Join(t.TempDir(), "airlock-agent")
	build := exec.Command("go", "build", "-o", agent, "github.com/airlock/airlock/cmd/airlock-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build airlock-agent: %v\n%s", err, out)
	}
	t.Setenv("AIRLOCK_AGENT", agent)

	rcv := tracingtest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	newTP := func(service string) *tracing.Provider {
		p, err := tracing.New(ctx, tracing.Config{Service: service, Endpoint: rcv.URL, Sync: true})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	serverTP, workerTP := newTP(tracing.ServiceServer), newTP(tracing.ServiceWorker)

	log := newLogger("error")
	st, err := sqlite.Open(ctx, filepath.Join(dir, "airlock.db"), sqlstore.WithClock(time.Now))
	if err != nil {
		t.Fatal(err)
	}
	const token = "trace-worker-token"
	srv, err := newServer(ctx, st, token, 0, log, time.Now, serverTP.TracerProvider(), "")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	errc := make(chan error, 2)
	go func() { errc <- srv.serve(ctx, ln) }()
	if err := ensureAdminKey(ctx, srv.svc, dir, io.Discard); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	w, err := newWorker(ctx, workerOptions{
		dataDir: dir, serverURL: url, token: token, dataListen: "127.0.0.1:0", id: "w-trace",
		log: log, progress: io.Discard, templateImages: runtimeSet(""), shipped: runtimeSet(""),
		capacity: capacity{vcpus: 8, mib: 4096}, tracer: workerTP.TracerProvider(),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv.setLocalWorker("w-trace", w.Handler())
	go func() { errc <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("stack: %v", err)
			}
		}
		st.Close()
	})
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Minute)
	defer rcancel()
	if err := waitReady(rctx, srv.ctrl, st, "w-trace", started, errc); err != nil {
		t.Fatalf("the stack never became ready: %v", err)
	}
	c := client.New(url, readTrim(filepath.Join(dir, "admin.key")))
	lctx, lcancel := context.WithTimeout(ctx, 5*time.Minute)
	defer lcancel()
	driveTracedLifecycle(t, lctx, c, gvisor.Name, rcv, serverTP, workerTP)
}
