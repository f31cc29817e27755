package gvisor_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/runtimetest"
)

// TestPrecompiledSeccomp checks, in runsc's own debug logs, that the runsc
// Airlock builds installs a precompiled seccomp program when a sandbox
// starts and when one is restored, instead of compiling one (13–130 ms
// per start; see internal/setup/runscbuild.go).
func TestPrecompiledSeccomp(t *testing.T) {
	if os.Getenv("AIRLOCK_RUNSC") != "" {
		t.Skip("SKIP: AIRLOCK_RUNSC names another runsc; this checks Airlock's build")
	}
	logs := t.TempDir()
	t.Setenv("AIRLOCK_RUNSC_DEBUG_LOG", logs)
	d, rootfs, _ := fixture(t)
	ctx := context.Background()
	id := runtimetest.NewID()
	spec := runtime.Spec{ID: id, RootFS: rootfs, VCPUs: 1, MemoryMiB: 256}
	sb, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	sb.Close()
	t.Cleanup(func() { d.Delete(context.Background(), id) })
	check := func(what string) {
		t.Helper()
		boots, _ := filepath.Glob(filepath.Join(logs, "*.boot.txt"))
		if len(boots) == 0 {
			t.Fatalf("%s: no runsc boot log in %s", what, logs)
		}
		for _, f := range boots {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			log := string(b)
			if strings.Contains(log, "No precompiled program found") || !strings.Contains(log, "Loaded precompiled seccomp instructions") {
				t.Errorf("%s: %s does not show a precompiled seccomp program installed", what, filepath.Base(f))
			}
			os.Remove(f)
		}
	}
	check("start")

	img := t.TempDir()
	if err := d.Checkpoint(ctx, id, img, false); err != nil {
		t.Fatal(err)
	}
	if err := d.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	sb, err = d.Restore(ctx, spec, img)
	if err != nil {
		t.Fatal(err)
	}
	sb.Close()
	check("restore")
}
