package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	airruntime "github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/qemu"
	"github.com/airlock/airlock/internal/setup"
)

// newLazyQEMU is the qemu runtime, set up in the background under dataDir
// (airruntime.Lazy): on a first start its set-up (QEMU packages, the Debian
// cloud kernel, the initramfs) takes a minute, and gVisor sandboxes need
// not wait for it. A qemu sandbox's trace is its run dir (the driver
// creates it first and removes it last). A failed set-up makes the runtime
// unavailable (Unavailable says why): its own sandboxes fail with that
// reason, and gVisor's are not affected.
func newLazyQEMU(ctx context.Context, dataDir, agent string, progress io.Writer, log *slog.Logger) *airruntime.Lazy {
	runDir := filepath.Join(dataDir, "qemu-run")
	return airruntime.NewLazy(ctx, airruntime.LazyConfig{
		Info:   qemu.Info,
		Traces: func() []string { return runDirs(runDir) },
		Setup: func(ctx context.Context) (airruntime.Driver, error) {
			assets, err := setup.EnsureQEMU(ctx, dataDir, agent, progress)
			var drv *qemu.Driver
			if err == nil {
				drv, err = qemu.New(qemu.Config{Assets: assets, CacheDir: dataDir, RunDir: runDir, Logger: log.With("component", "qemu")})
			}
			if err != nil {
				log.Error("qemu runtime unavailable; gVisor sandboxes are not affected", "err", err)
				fmt.Fprintf(progress, "qemu: runtime unavailable: %v\n", err)
				return nil, err
			}
			fmt.Fprintf(progress, "qemu: runtime ready (guest kernel %s, accel %s)\n", assets.KernelRelease, drv.Accel(ctx))
			return drv, nil
		},
	})
}

// runDirs lists the sandbox ids with a run dir under dir.
func runDirs(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var ids []string
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			ids = append(ids, e.Name())
		}
	}
	return ids
}
