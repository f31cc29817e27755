package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/blob"
	"github.com/airlock/airlock/internal/blob/blobtest"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime/gvisor"
	"github.com/airlock/airlock/internal/store/sqlite"
	"github.com/airlock/airlock/internal/store/sqlstore"
	"github.com/airlock/airlock/internal/testenv"
)

// TestDrainOnGVisor: two real workers (gVisor, each with its own data
// directory, as two hosts would have) on one server and one blob store —
// the real S3-compatible server when the run has one, else a directory.
// Draining the worker a sandbox runs on moves it to the other: its files,
// and a process started before the move, with the same PID, still
// running. The time the sandbox was not running is logged. Needs root and
// the test cache's runsc and Debian layer, as TestTracesOnGVisor.
func TestDrainOnGVisor(t *testing.T) {
	testenv.RequireRunsc(t)
	testenv.RequireRoot(t, "the workers run gVisor sandboxes")
	for _, f := range []string{"bin/runsc", "cache/debian-bookworm.done"} {
		if _, err := os.Stat(filepath.Join(testCacheDir, f)); err != nil {
			t.Skipf("SKIP: %s not in the test cache %s (the full suite, sudo ./scripts/test.sh, makes it): %v", f, testCacheDir, err)
		}
	}
	testenv.RequireGoBuild(t, "a static airlock-agent")
	agent := filepath.Join(t.TempDir(), "airlock-agent")
	build := exec.Command("go", "build", "-o", agent, "github.com/airlock/airlock/cmd/airlock-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build airlock-agent: %v\n%s", err, out)
	}
	t.Setenv("AIRLOCK_AGENT", agent)
	blobURL := "file://" + t.TempDir()
	if os.Getenv(blobtest.EnvURL) != "" {
		blobURL = blobtest.S3URL(t)
	}

	ctx, cancel := context.WithCancel(context.Background())
	log := newLogger("error")
	dir := t.TempDir()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "airlock.db"), sqlstore.WithClock(time.Now))
	if err != nil {
		t.Fatal(err)
	}
	const token = "move-worker-token"
	srv, err := newServer(ctx, st, token, 0, log, time.Now, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	b, err := blob.Open(ctx, blobURL)
	if err != nil {
		t.Fatal(err)
	}
	srv.ctrl.SetBlobStore(b)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	errc := make(chan error, 3)
	go func() { errc <- srv.serve(ctx, ln) }()
	if err := ensureAdminKey(ctx, srv.svc, dir, io.Discard); err != nil {
		t.Fatal(err)
	}
	c := client.New(url, readTrim(filepath.Join(dir, "admin.key")))
	ids := []string{"w-move-1", "w-move-2"}
	for _, id := range ids {
		wdir := filepath.Join(dir, id)
		if err := os.MkdirAll(wdir, 0o700); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Unmount(filepath.Join(wdir, "runsc", "null-netns"), syscall.MNT_DETACH) })
		for _, d := range []string{"cache", "bin"} { // runsc and the Debian layer, read only
			if err := os.Symlink(filepath.Join(testCacheDir, d), filepath.Join(wdir, d)); err != nil {
				t.Fatal(err)
			}
		}
		w, err := newWorker(ctx, workerOptions{
			dataDir: wdir, serverURL: url, token: token, dataListen: "127.0.0.1:0", id: id,
			log: log, progress: io.Discard, templateImages: runtimeSet(""), shipped: runtimeSet(""),
			capacity: capacity{vcpus: 8, mib: 4096}, blobStore: blobURL,
		})
		if err != nil {
			t.Fatal(err)
		}
		go func() { errc <- w.Run(ctx) }()
	}
	t.Cleanup(func() {
		if sbs, err := c.ListSandboxes(context.Background(), client.SandboxFilter{Limit: 100}); err == nil {
			for _, sb := range sbs.Sandboxes {
				if op, err := c.DeleteSandbox(context.Background(), sb.ID); err == nil {
					c.WaitOperation(context.Background(), op.ID)
				}
			}
		}
		cancel()
		for range 3 {
			if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("stack: %v", err)
			}
		}
		st.Close()
	})
	tctx, tcancel := context.WithTimeout(ctx, 8*time.Minute)
	defer tcancel()
	for { // both registered, with the same base template
		ws, err := c.ListWorkers(tctx)
		ready := 0
		for _, w := range ws {
			if w.State == "ready" && len(w.Templates) > 0 && w.BlobStore != "" {
				ready++
			}
		}
		if err == nil && ready == 2 {
			if ws[0].Templates[0] != ws[1].Templates[0] {
				t.Skipf("SKIP: the two workers built different base templates (%s, %s): a move needs the same template on both", ws[0].Templates[0], ws[1].Templates[0])
			}
			break
		}
		if tctx.Err() != nil {
			t.Fatalf("the workers never became ready: %+v %v", ws, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := c.CordonWorker(tctx, ids[1], true); err != nil {
		t.Fatal(err)
	}
	sb, op, err := c.CreateSandbox(tctx, client.CreateSandboxRequest{Runtime: gvisor.Name}, "")
	if err != nil {
		t.Fatal(err)
	}
	if done, err := c.WaitOperation(tctx, op.ID); err != nil || done.State != model.OpSucceeded {
		t.Fatalf("create: %+v %v", done, err)
	}
	if _, err := c.CordonWorker(tctx, ids[1], false); err != nil {
		t.Fatal(err)
	}
	sh := func(script string) string {
		t.Helper()
		cmd, err := c.CreateCommand(tctx, sb.ID, client.CreateCommandRequest{Argv: []string{"/bin/sh", "-c", script}})
		if err != nil {
			t.Fatalf("command %q: %v", script, err)
		}
		var out, errb strings.Builder
		exit, err := client.RunCommand(tctx, cmd.AttachURL, cmd.Token, nil, &out, &errb)
		if err != nil || exit.ExitCode != 0 {
			t.Fatalf("run %q: exit %+v %v (stderr %q)", script, exit, err, errb.String())
		}
		return out.String()
	}
	// 8 MiB of random bytes, their sum, and a process that keeps running.
	sum := sh("head -c 8388608 /dev/urandom > $HOME/data && sha256sum $HOME/data | cut -d' ' -f1")
	pid := strings.TrimSpace(sh("setsid sleep 100000 >/dev/null 2>&1 < /dev/null & echo $!"))

	down := time.Time{}
	var gap time.Duration
	t0 := time.Now()
	if _, err := c.DrainWorker(tctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	for {
		got, err := c.GetSandbox(tctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != model.StateRunning && down.IsZero() {
			down = time.Now()
		}
		if got.State == model.StateRunning && got.WorkerID == ids[1] {
			gap = time.Since(down)
			break
		}
		if got.State.Terminal() || tctx.Err() != nil {
			t.Fatalf("the move never finished: %s on %s (%s)", got.State, got.WorkerID, got.Reason)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("gVisor sandbox moved %s → %s by a drain in %v; not running for %v", ids[0], ids[1], time.Since(t0).Round(time.Millisecond), gap.Round(time.Millisecond))
	if got := sh("sha256sum $HOME/data | cut -d' ' -f1"); got != sum {
		t.Fatalf("file sum after the move %q, before %q", got, sum)
	}
	if got := strings.TrimSpace(sh(fmt.Sprintf("kill -0 %s && cat /proc/%s/cmdline | tr '\\0' ' '", pid, pid))); got != "sleep 100000" {
		t.Fatalf("process %s after the move: %q, want sleep 100000 still running", pid, got)
	}
}
