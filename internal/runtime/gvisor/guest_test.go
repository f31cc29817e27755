package gvisor_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/logcap"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/runtimetest"
)

// runRoot runs argv as root in the sandbox (as process id, within 5
// minutes) and returns its output and exit code.
func runRoot(t *testing.T, c *agentclient.Client, id string, argv ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return runtimetest.RunRoot(ctx, t, c, id, argv...)
}

// TestGuestFloodsRunscLog: guest root writes 96 MiB to PID 1's stdout,
// which is runsc.log on the host. The host file stays capped (logcap.Max,
// with logcap.Keep bytes of tail in runsc.log.1) and the sandbox lives on.
func TestGuestFloodsRunscLog(t *testing.T) {
	d, rootfs, run := fixture(t)
	ctx := context.Background()
	id, _, c := startReady(t, d, rootfs)
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
