package e2e

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// upInstance is one `airlock up` of a test: its data dir, listen
// address, URL and log file.
type upInstance struct {
	dir, addr, url, logPath string
}

// newUp makes an upInstance served over scheme ("http" or "https") on a
// free address. Its data dir shares the stack's built runsc and Debian
// layer; everything else is its own.
func newUp(t *testing.T, s *stack, scheme string) upInstance {
	t.Helper()
	dir := t.TempDir()
	// runsc keeps one nsfs mount per state dir for --network=none sandboxes.
	t.Cleanup(func() { syscall.Unmount(filepath.Join(dir, "runsc", "null-netns"), syscall.MNT_DETACH) })
	// build-cache too: the shipped templates' steps are built once.
	if err := os.MkdirAll(filepath.Join(s.workerDir, "build-cache"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"cache", "bin", "build-cache"} {
		if err := os.Symlink(filepath.Join(s.workerDir, d), filepath.Join(dir, d)); err != nil {
			t.Fatal(err)
		}
	}
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return upInstance{dir: dir, addr: addr, url: scheme + "://" + addr, logPath: filepath.Join(dir, "up.log")}
}

// adminKey is the admin key the instance wrote.
func (u upInstance) adminKey() string { return readTrim(filepath.Join(u.dir, "admin.key")) }

// start starts `airlock up --listen addr --data-dir dir args...` with its
// output appended to the log, and returns once it answers /healthz
// through hc and has written admin.key (within 5 minutes).
func (u upInstance) start(t *testing.T, s *stack, hc *http.Client, args ...string) *exec.Cmd {
	t.Helper()
	logf, err := os.OpenFile(u.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(s.bin, "airlock"), append([]string{"up", "--listen", u.addr, "--data-dir", u.dir}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for {
		resp, err := hc.Get(u.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 && u.adminKey() != "" {
				return cmd
			}
		}
		if ctx.Err() != nil {
			b, _ := os.ReadFile(u.logPath)
			t.Fatalf("airlock up not healthy at %s:\n%s", u.url, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// airlockCLI returns a function that runs the built airlock CLI with env
// and the given stdin, and returns its stdout and exit code (logging its
// stderr when it fails).
func airlockCLI(t *testing.T, s *stack, env []string) func(stdin string, args ...string) (string, int) {
	return func(stdin string, args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(filepath.Join(s.bin, "airlock"), args...)
		cmd.Env = env
		cmd.Stdin = strings.NewReader(stdin)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("airlock %v: %v", args, err)
		}
		if code := cmd.ProcessState.ExitCode(); code != 0 {
			t.Logf("airlock %v: exit %d: %s", args, code, errb.String())
		}
		return out.String(), cmd.ProcessState.ExitCode()
	}
}
