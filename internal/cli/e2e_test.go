package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// liveEnv runs the CLI against a running installation (e.g. `airlock up`)
// named by AIRLOCK_TEST_URL and AIRLOCK_TEST_API_KEY: exec and cp need a
// real worker, agent and runtime, which only a whole installation has.
type liveEnv struct {
	t        *testing.T
	url, key string
}

func newLiveEnv(t *testing.T) *liveEnv {
	url, key := os.Getenv("AIRLOCK_TEST_URL"), os.Getenv("AIRLOCK_TEST_API_KEY")
	if url == "" || key == "" {
		t.Skip("needs a running installation: set AIRLOCK_TEST_URL and AIRLOCK_TEST_API_KEY (e.g. to an `airlock up` and its admin.key)")
	}
	return &liveEnv{t: t, url: url, key: key}
}

type invocation struct {
	args     []string
	stdin    string
	terminal bool
	signals  chan os.Signal
}

func (e *liveEnv) run(inv invocation) (code int, stdout, stderr string) {
	e.t.Helper()
	var out, errb bytes.Buffer
	env := map[string]string{"AIRLOCK_URL": e.url, "AIRLOCK_API_KEY": e.key}
	// Not t.Context(): cleanups run after it is cancelled and must still
	// delete what the test created.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	code = Main(ctx, inv.args, Env{
		Stdin: strings.NewReader(inv.stdin), Stdout: &out, Stderr: &errb,
		Getenv: func(k string) string { return env[k] }, StdinIsTerminal: inv.terminal, Signals: inv.signals,
	})
	return code, out.String(), errb.String()
}

func (e *liveEnv) must(args ...string) string {
	e.t.Helper()
	code, out, errOut := e.run(invocation{args: args})
	if code != 0 {
		e.t.Fatalf("airlock %s: exit %d, stderr %q", strings.Join(args, " "), code, errOut)
	}
	return out
}

func TestLiveExecAndCp(t *testing.T) {
	e := newLiveEnv(t)
	id := strings.TrimSpace(e.must("sandbox", "create"))
	t.Cleanup(func() { e.run(invocation{args: []string{"sandbox", "rm", id}}) })

	t.Run("exec", func(t *testing.T) {
		tests := []struct {
			name                string
			inv                 invocation
			wantCode            int
			wantStdout, wantErr string
		}{
			{name: "stdout", inv: invocation{args: []string{"exec", id, "--", "sh", "-c", "echo out; echo err >&2"}}, wantStdout: "out\n", wantErr: "err\n"},
			{name: "exit code", inv: invocation{args: []string{"exec", id, "--", "sh", "-c", "exit 7"}}, wantCode: 7},
			{name: "killed by a signal", inv: invocation{args: []string{"exec", id, "--", "sh", "-c", "kill -9 $$"}}, wantCode: 137},
			{name: "piped stdin", inv: invocation{args: []string{"exec", id, "--", "wc", "-c"}, stdin: "hello"}, wantStdout: "5\n"},
			{name: "terminal stdin is not sent", inv: invocation{args: []string{"exec", id, "--", "cat"}, stdin: "typed", terminal: true}, wantStdout: ""},
			{name: "-i sends terminal stdin", inv: invocation{args: []string{"exec", "-i", id, "--", "cat"}, stdin: "typed", terminal: true}, wantStdout: "typed"},
			{name: "env cwd user", inv: invocation{args: []string{"exec", "--env", "X=42", "--cwd", "/tmp", id, "--", "sh", "-c", "echo $X $(pwd) $(id -un)"}}, wantStdout: "42 /tmp user\n"},
			{name: "timeout", inv: invocation{args: []string{"exec", "--timeout", "1", id, "--", "sleep", "30"}}, wantCode: 137, wantErr: "timed out"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				code, out, errOut := e.run(tt.inv)
				if code != tt.wantCode || out != tt.wantStdout || !strings.Contains(errOut, tt.wantErr) {
					t.Errorf("exit %d stdout %q stderr %q; want %d %q %q", code, out, errOut, tt.wantCode, tt.wantStdout, tt.wantErr)
				}
			})
		}
	})

	t.Run("exec forwards interrupts", func(t *testing.T) {
		sigs := make(chan os.Signal, 1)
		go func() { time.Sleep(2 * time.Second); sigs <- syscall.SIGTERM }()
		code, _, errOut := e.run(invocation{args: []string{"exec", id, "--", "sleep", "60"}, signals: sigs})
		if code != 128+int(syscall.SIGTERM) {
			t.Errorf("exit %d (stderr %q), want %d", code, errOut, 128+int(syscall.SIGTERM))
		}
	})

	t.Run("exec -d", func(t *testing.T) {
		cmdID := strings.TrimSpace(e.must("exec", "-d", id, "--", "sh", "-c", "sleep 1; echo done > /tmp/detached"))
		if cmdID == "" {
			t.Fatal("exec -d printed no command id")
		}
		time.Sleep(3 * time.Second)
		if out := e.must("exec", id, "--", "cat", "/tmp/detached"); out != "done\n" {
			t.Errorf("detached command wrote %q", out)
		}
	})

	t.Run("cp", func(t *testing.T) {
		dir := t.TempDir()
		src := filepath.Join(dir, "blob")
		data := make([]byte, 3<<20+17)
		rand.Read(data)
		os.WriteFile(src, data, 0o750)
		os.Chmod(src, 0o750)
		e.must("cp", src, id+":/home/user/")
		if out := e.must("exec", id, "--", "stat", "-c", "%a %U", "/home/user/blob"); out != "750 user\n" {
			t.Errorf("uploaded file mode/owner %q, want 750 user", out)
		}
		back := filepath.Join(dir, "back")
		e.must("cp", id+":/home/user/blob", back)
		got, _ := os.ReadFile(back)
		if !bytes.Equal(got, data) {
			t.Errorf("round trip differs: %d bytes back, want %d", len(got), len(data))
		}
		if st, _ := os.Stat(back); st.Mode().Perm() != 0o750 {
			t.Errorf("downloaded mode %v", st.Mode().Perm())
		}
		// "-" is stdin and stdout.
		if code, _, errOut := e.run(invocation{args: []string{"cp", "-", id + ":/tmp/piped"}, stdin: "via stdin"}); code != 0 {
			t.Fatalf("cp - : %d %q", code, errOut)
		}
		if out := e.must("cp", id+":/tmp/piped", "-"); out != "via stdin" {
			t.Errorf("cp to - printed %q", out)
		}
		if code, _, errOut := e.run(invocation{args: []string{"cp", id + ":/nonexistent", back}}); code != ExitError || !strings.Contains(errOut, "not found") && !strings.Contains(errOut, "no such") {
			t.Errorf("cp of a missing file: exit %d, %q", code, errOut)
		}
	})
}
