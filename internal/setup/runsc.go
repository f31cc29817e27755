package setup

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// The pinned runsc. It must be built with CGO_ENABLED=0: a cgo build is
// dynamically linked and fails inside the sandbox chroot ("error executing
// umounter: fork/exec /proc/self/exe: no such file or directory").
const (
	RunscModule  = "gvisor.dev/gvisor/runsc"
	RunscVersion = "v0.0.0-20260905035102-160fafc42237"
)

// RunscEnv names the environment variable that points at an existing runsc
// binary instead of the pinned build.
const RunscEnv = "AIRLOCK_RUNSC"

// EnsureRunsc returns the path of a statically linked runsc: $AIRLOCK_RUNSC
// if set, else dir/bin/runsc, built from the pinned gVisor source on first
// use (buildRunsc) and reused while its version marker matches this build
// recipe (runscMarker).
func EnsureRunsc(ctx context.Context, dir string, progress io.Writer) (string, error) {
	if p := os.Getenv(RunscEnv); p != "" {
		if err := checkStatic(p); err != nil {
			return "", fmt.Errorf("runsc from %s: %w", RunscEnv, err)
		}
		progressf(progress, "runsc: using %s (from %s)", p, RunscEnv)
		return p, nil
	}
	bin := filepath.Join(dir, "bin")
	path := filepath.Join(bin, "runsc")
	marker := path + ".version"
	want := runscMarker()
	if runscCurrent(path, marker, want) {
		return path, nil
	}

	unlock, err := lock(dir)
	if err != nil {
		return "", fmt.Errorf("ensure runsc: %w", err)
	}
	defer unlock()
	if runscCurrent(path, marker, want) { // built by someone else meanwhile
		return path, nil
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("ensure runsc: the go command is needed once to build runsc; install Go 1.26 or newer "+
			"(https://go.dev/dl/) and put it on PATH, or set %s to a statically linked runsc: %w", RunscEnv, err)
	}
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", fmt.Errorf("ensure runsc: %w", err)
	}
	tmp, err := os.MkdirTemp(dir, ".runsc-build-")
	if err != nil {
		return "", fmt.Errorf("ensure runsc: %w", err)
	}
	defer os.RemoveAll(tmp)

	progressf(progress, "runsc: building %s with precompiled seccomp programs (once; a minute or two)", RunscModule+"@"+RunscVersion)
	built := filepath.Join(tmp, "runsc")
	if err := buildRunsc(ctx, goBin, tmp, built, progress); err != nil {
		return "", fmt.Errorf("ensure runsc: build %s@%s: %w", RunscModule, RunscVersion, err)
	}
	if err := checkStatic(built); err != nil {
		return "", fmt.Errorf("ensure runsc: built binary: %w", err)
	}
	if err := os.Chmod(built, 0o755); err != nil {
		return "", fmt.Errorf("ensure runsc: %w", err)
	}
	if err := os.Rename(built, path); err != nil {
		return "", fmt.Errorf("ensure runsc: move into place: %w", err)
	}
	if err := writeFileAtomic(marker, []byte(want+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("ensure runsc: write version marker: %w", err)
	}
	progressf(progress, "runsc: installed %s", path)
	return path, nil
}

// runscCurrent reports whether path exists and the marker names want.
func runscCurrent(path, marker, want string) bool {
	b, err := os.ReadFile(marker)
	if err != nil || strings.TrimSpace(string(b)) != want {
		return false
	}
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// errDynamic is returned for a dynamically linked binary.
var errDynamic = errors.New("binary is dynamically linked (has an ELF interpreter); build it with CGO_ENABLED=0")

// checkStatic verifies path is an ELF executable without PT_INTERP.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("open %s as ELF: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s: %w", path, errDynamic)
		}
	}
	return nil
}
