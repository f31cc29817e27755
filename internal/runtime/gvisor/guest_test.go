package gvisor_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/logcap"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/runtimetest"
)

// runRoot runs argv as root in the sandbox and returns its output and exit code.
func runRoot(t *testing.T, c *agentclient.Client, id string, argv ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
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
			json.Unmarshal(payload, &e)
			return sb.String(), e.ExitCode
		case agentapi.FrameError:
			t.Fatalf("output of %v: %s", argv, payload)
		}
	}
}

// TestGuestFloodsRunscLog: guest root writes 96 MiB to PID 1's stdout,
// which is runsc.log on the host. The host file stays capped (logcap.Max,
// with logcap.Keep bytes of tail in runsc.log.1) and the sandbox lives on.
func TestGuestFloodsRunscLog(t *testing.T) {
	d, rootfs, run := fixture(t)
	ctx := context.Background()
	id := runtimetest.NewID()
	sb, err := d.Start(ctx, runtime.Spec{ID: id, RootFS: rootfs, VCPUs: 1, MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
	t.Cleanup(func() {
		c.Close()
		sb.Close()
		if err := d.Delete(context.Background(), id); err != nil {
			t.Errorf("Delete: %v", err)
		}
	})
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := c.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	const flood = 96 << 20
	out, code := runRoot(t, c, "flood", "sh", "-c", "dd if=/dev/zero bs=1M count=96 2>/dev/null | tr '\\0' A >/proc/1/fd/1; echo FLOOD-END >/proc/1/fd/2")
	if code != 0 {
		t.Fatalf("flood: exit %d: %s", code, out)
	}
	// The driver caps when it looks at a sandbox (and on its own timer).
	if st, err := d.Status(ctx, id); err != nil || st != runtime.StatusRunning {
		t.Fatalf("Status after the flood = %q, %v", st, err)
	}
	log := filepath.Join(run, id, "runsc.log")
	var total int64
	for _, p := range []string{log, log + ".1"} {
		if fi, err := os.Stat(p); err == nil {
			t.Logf("%s: %d bytes (%d bytes on disk)", filepath.Base(p), fi.Size(), diskBytes(fi))
			total += fi.Size()
		}
	}
	if total > logcap.Max+logcap.Keep {
		t.Fatalf("the guest wrote %d bytes to PID 1's stdout and the host keeps %d of them; want at most %d", flood, total, logcap.Max+logcap.Keep)
	}
	if b := logcap.Tail(log, 64); !strings.Contains(string(b), "FLOOD-END") {
		t.Errorf("the tail of the capped log lost the latest line: %q", b)
	}
	if out, code := runRoot(t, c, "after", "echo", "alive"); code != 0 || out != "alive\n" {
		t.Fatalf("sandbox after the flood: %q exit %d", out, code)
	}
}
