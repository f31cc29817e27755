package agentclient_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/model"
)

func TestHealth(t *testing.T) {
	h := startAgent(t)
	got, err := h.client.Health(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != agentapi.Version || got.PID != h.cmd.Process.Pid || got.Boot.IsZero() {
		t.Fatalf("health = %+v, want version %s pid %d", got, agentapi.Version, h.cmd.Process.Pid)
	}
}

func TestRun(t *testing.T) {
	h := startAgent(t)
	ctx := testCtx(t)
	dir := t.TempDir()
	notExec := filepath.Join(dir, "notexec")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		spec       agentapi.ProcessSpec
		stdout     string
		stderr     string
		code       int
		wantErrMsg bool
	}{
		{name: "echo", spec: agentapi.ProcessSpec{Argv: []string{"echo", "hello", "world"}}, stdout: "hello world\n"},
		{name: "exit code", spec: agentapi.ProcessSpec{Argv: []string{"sh", "-c", "exit 7"}}, code: 7},
		{name: "stderr", spec: agentapi.ProcessSpec{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}},
			stdout: "out\n", stderr: "err\n", code: 3},
		{name: "env and cwd", spec: agentapi.ProcessSpec{
			Argv: []string{"sh", "-c", `echo "$HOME|$USER|$LOGNAME|$PATH|$LANG|$FOO|$(pwd)"`},
			Env:  map[string]string{"FOO": "bar"}, Cwd: dir},
			stdout: "/root|root|root|/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin|C.UTF-8|bar|" + dir + "\n"},
		{name: "env overrides base", spec: agentapi.ProcessSpec{Argv: []string{"sh", "-c", `echo "$PATH"`},
			Env: map[string]string{"PATH": "/bin"}}, stdout: "/bin\n"},
		{name: "cwd defaults to home", spec: agentapi.ProcessSpec{Argv: []string{"pwd"}}, stdout: "/root\n"},
		{name: "stdin is /dev/null", spec: agentapi.ProcessSpec{Argv: []string{"cat"}}},
		{name: "own process group", spec: agentapi.ProcessSpec{Argv: []string{"sh", "-c", `[ "$(ps -o pgid= $$ | tr -d ' ')" = "$$" ] && echo leader`}},
			stdout: "leader\n"},
		{name: "not found", spec: agentapi.ProcessSpec{Argv: []string{"no-such-program-xyz"}}, code: 127, wantErrMsg: true},
		{name: "not found by path", spec: agentapi.ProcessSpec{Argv: []string{"/no/such/program"}}, code: 127, wantErrMsg: true},
		{name: "not executable", spec: agentapi.ProcessSpec{Argv: []string{notExec}}, code: 126, wantErrMsg: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if strings.Contains(tt.name, "process group") {
				if _, err := os.Stat("/bin/ps"); err != nil {
					t.Skip("needs ps")
				}
			}
			r := h.run(ctx, tt.spec)
			if r.stdout.String() != tt.stdout || r.stderr.String() != tt.stderr {
				t.Errorf("stdout %q stderr %q, want %q %q", r.stdout.String(), r.stderr.String(), tt.stdout, tt.stderr)
			}
			if r.exit.ExitCode != tt.code || (r.exit.Error != "") != tt.wantErrMsg {
				t.Errorf("exit = %+v, want code %d (error message: %v)", r.exit, tt.code, tt.wantErrMsg)
			}
		})
	}
}

func TestStartErrors(t *testing.T) {
	h := startAgent(t)
	ctx := testCtx(t)
	if _, err := h.client.StartProcess(ctx, agentapi.ProcessSpec{ID: "dup", User: "root", Argv: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		spec agentapi.ProcessSpec
		want error
	}{
		{"duplicate id", agentapi.ProcessSpec{ID: "dup", User: "root", Argv: []string{"true"}}, model.ErrConflict},
		{"no argv", agentapi.ProcessSpec{ID: "x1", User: "root"}, model.ErrInvalid},
		{"no id", agentapi.ProcessSpec{User: "root", Argv: []string{"true"}}, model.ErrInvalid},
		{"unknown user", agentapi.ProcessSpec{ID: "x2", User: "no-such-user-xyz", Argv: []string{"true"}}, model.ErrInvalid},
		{"missing cwd", agentapi.ProcessSpec{ID: "x3", User: "root", Cwd: "/no/such/dir", Argv: []string{"true"}}, model.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.client.StartProcess(ctx, tt.spec)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
		})
	}
	for _, id := range []string{"nope"} {
		if _, err := h.client.GetProcess(ctx, id); !errors.Is(err, model.ErrNotFound) {
			t.Errorf("GetProcess(%s) = %v, want not found", id, err)
		}
		if _, err := h.client.Output(ctx, id, 0); !errors.Is(err, model.ErrNotFound) {
			t.Errorf("Output(%s) = %v, want not found", id, err)
		}
		if err := h.client.Signal(ctx, id, "TERM"); !errors.Is(err, model.ErrNotFound) {
			t.Errorf("Signal(%s) = %v, want not found", id, err)
		}
	}
	if err := h.client.Signal(ctx, "dup", "NOSUCHSIG"); !errors.Is(err, model.ErrInvalid) {
		t.Errorf("bad signal: %v, want invalid", err)
	}
}

func TestRunAsUser(t *testing.T) {
	h := startAgent(t)
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("needs a 'nobody' user in /etc/passwd")
	}
	r := h.run(testCtx(t), agentapi.ProcessSpec{User: "nobody", Cwd: "/", Argv: []string{"sh", "-c", "id -u; id -g; echo $USER"}})
	want := u.Uid + "\n" + u.Gid + "\nnobody\n"
	if r.stdout.String() != want || r.exit.ExitCode != 0 {
		t.Fatalf("stdout %q stderr %q exit %+v, want %q", r.stdout.String(), r.stderr.String(), r.exit, want)
	}
	r = h.run(testCtx(t), agentapi.ProcessSpec{User: u.Uid, Cwd: "/", Argv: []string{"id", "-u"}})
	if r.stdout.String() != u.Uid+"\n" {
		t.Fatalf("numeric user: stdout %q, want %q", r.stdout.String(), u.Uid+"\n")
	}
}

func TestStdinRoundTrip(t *testing.T) {
	h := startAgent(t)
	ctx := testCtx(t)
	data := make([]byte, 3<<20)
	rng := rand.NewChaCha8([32]byte{1})
	_, _ = rng.Read(data)
	id := newID()
	if _, err := h.client.StartProcess(ctx, agentapi.ProcessSpec{ID: id, User: "root", Argv: []string{"cat"}, Stdin: true}); err != nil {
		t.Fatal(err)
	}
	s, err := h.client.Output(ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		if err := h.client.Stdin(ctx, id, bytes.NewReader(data[:1<<20]), false); err != nil {
			errc <- err
			return
		}
		errc <- h.client.Stdin(ctx, id, bytes.NewReader(data[1<<20:]), true)
	}()
	r := collect(t, s)
	if err := <-errc; err != nil {
		t.Fatalf("stdin: %v", err)
	}
	if !bytes.Equal(r.stdout.Bytes(), data) || r.exit.ExitCode != 0 {
		t.Fatalf("cat echoed %d bytes (equal: %v), exit %+v", r.stdout.Len(), bytes.Equal(r.stdout.Bytes(), data), r.exit)
	}
	if err := h.client.Stdin(ctx, id, strings.NewReader("late"), false); !errors.Is(err, model.ErrConflict) {
		t.Fatalf("stdin after close: %v, want conflict", err)
	}

	// CloseStdin ends cat too.
	id2 := newID()
	if _, err := h.client.StartProcess(ctx, agentapi.ProcessSpec{ID: id2, User: "root", Argv: []string{"cat"}, Stdin: true}); err != nil {
		t.Fatal(err)
	}
	if err := h.client.Stdin(ctx, id2, strings.NewReader("abc"), false); err != nil {
		t.Fatal(err)
	}
	if err := h.client.CloseStdin(ctx, id2); err != nil {
		t.Fatal(err)
	}
	s2, err := h.client.Output(ctx, id2, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r := collect(t, s2); r.stdout.String() != "abc" || r.exit.ExitCode != 0 {
		t.Fatalf("stdout %q exit %+v", r.stdout.String(), r.exit)
	}
}

func TestSignalAndTimeout(t *testing.T) {
	h := startAgent(t)
	ctx := testCtx(t)
	tests := []struct {
		name    string
		signal  string
		timeout int
		want    agentapi.Exit
	}{
		{name: "TERM", signal: "TERM", want: agentapi.Exit{ExitCode: -1, Signal: "TERM"}},
		{name: "SIGKILL", signal: "SIGKILL", want: agentapi.Exit{ExitCode: -1, Signal: "KILL"}},
		{name: "number", signal: "2", want: agentapi.Exit{ExitCode: -1, Signal: "INT"}},
		{name: "timeout", timeout: 1, want: agentapi.Exit{ExitCode: -1, Signal: "KILL", TimedOut: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := newID()
			// The sleep is a child of sh: the whole group must get the signal
			// for the output pipes to close.
			pi, s := startStarted(ctx, t, h.client, id, "echo started; sleep 1000; echo never", tt.timeout)
			// Signal once sleep runs: sh -c catches INT and only acts on it
			// after its foreground job, so an INT that arrives before sh has
			// forked sleep leaves sleep running (as a Ctrl-C would).
			var sleeps []int
			if tt.signal != "" {
				sleeps = append(sleeps, signalSleeping(ctx, t, h.client, id, pi.PID, tt.signal))
			}
			r := collect(t, s)
			if r.exit != tt.want || r.stdout.Len() != 0 {
				t.Fatalf("exit %+v stdout %q, want %+v", r.exit, r.stdout.String(), tt.want)
			}
			if left := leftOf(pi.PID, sleeps...); len(left) > 0 {
				t.Fatalf("processes of the command left alive: %+v", left)
			}
			pi, err := h.client.GetProcess(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if pi.Running || pi.ExitCode == nil || *pi.ExitCode != -1 || pi.EndedAt == nil {
				t.Fatalf("process info %+v", pi)
			}
			if err := h.client.Signal(ctx, id, "TERM"); !errors.Is(err, model.ErrConflict) {
				t.Fatalf("signal after exit: %v, want conflict", err)
			}
		})
	}
}

// TestLargeOutput writes 10 MB to stdout and stderr concurrently and checks
// both arrive complete and separated, then re-reads from offsets.
func TestLargeOutput(t *testing.T) {
	h := startAgent(t)
	ctx := testCtx(t)
	dir := t.TempDir()
	outData := make([]byte, 5<<20+123)
	errData := make([]byte, 5<<20+4567)
	rng := rand.NewChaCha8([32]byte{2})
	_, _ = rng.Read(outData)
	_, _ = rng.Read(errData)
	for name, b := range map[string][]byte{"out": outData, "err": errData} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	id := newID()
	// Many small writes from both sides, racing each other.
	script := `dd if=out bs=4096 status=none & dd if=err bs=1000 status=none >&2; wait`
	if _, err := h.client.StartProcess(ctx, agentapi.ProcessSpec{ID: id, User: "root", Cwd: dir, Argv: []string{"sh", "-c", script}}); err != nil {
		t.Fatal(err)
	}
	// Two concurrent readers of the same process.
	var wg sync.WaitGroup
	results := make([]*result, 2)
	for i := range results {
		wg.Go(func() {
			s, err := h.client.Output(ctx, id, 0)
			if err != nil {
				t.Error(err)
				return
			}
			results[i] = collect(t, s)
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for i, r := range results {
		if !bytes.Equal(r.stdout.Bytes(), outData) || !bytes.Equal(r.stderr.Bytes(), errData) || r.exit.ExitCode != 0 {
			t.Fatalf("reader %d: stdout %d/%d bytes, stderr %d/%d bytes, exit %+v", i,
				r.stdout.Len(), len(outData), r.stderr.Len(), len(errData), r.exit)
		}
	}
	combined := results[0].combined.Bytes()
	if !bytes.Equal(combined, results[1].combined.Bytes()) {
		t.Fatal("two readers saw different combined output")
	}
	pi, err := h.client.GetProcess(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if pi.OutputBytes != int64(len(combined)) {
		t.Fatalf("output_bytes %d, want %d", pi.OutputBytes, len(combined))
	}
	for _, off := range []int64{1, 65537, int64(len(combined)) / 2, int64(len(combined)) - 1, int64(len(combined))} {
		s, err := h.client.Output(ctx, id, off)
		if err != nil {
			t.Fatal(err)
		}
		r := collect(t, s)
		if !bytes.Equal(r.combined.Bytes(), combined[off:]) || r.exit.ExitCode != 0 {
			t.Fatalf("from offset %d: got %d bytes (equal %v), exit %+v", off, r.combined.Len(),
				bytes.Equal(r.combined.Bytes(), combined[off:]), r.exit)
		}
	}
}

// TestOutputOutlivesReader reads part of a process's output, drops the
// stream, lets the process finish, and reads everything later.
func TestOutputOutlivesReader(t *testing.T) {
	h := startAgent(t)
	ctx := testCtx(t)
	id := newID()
	if _, err := h.client.StartProcess(ctx, agentapi.ProcessSpec{ID: id, User: "root", Stdin: true,
		Argv: []string{"sh", "-c", "echo first; cat; echo last"}}); err != nil {
		t.Fatal(err)
	}
	s, err := h.client.Output(ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	if kind, payload, err := s.Next(); err != nil || kind != agentapi.FrameStdout || string(payload) != "first\n" {
		t.Fatalf("first frame %d %q %v", kind, payload, err)
	}
	s.Close()
	pi, err := h.client.GetProcess(ctx, id)
	if err != nil || !pi.Running || pi.PID == 0 {
		t.Fatalf("process info %+v %v, want running", pi, err)
	}
	if err := h.client.Stdin(ctx, id, strings.NewReader("middle\n"), true); err != nil {
		t.Fatal(err)
	}
	// An offset beyond the end waits for output.
	s, err = h.client.Output(ctx, id, int64(len("first\nmiddle\n")))
	if err != nil {
		t.Fatal(err)
	}
	if r := collect(t, s); r.stdout.String() != "last\n" {
		t.Fatalf("from offset: %q", r.stdout.String())
	}
	s, err = h.client.Output(ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r := collect(t, s); r.stdout.String() != "first\nmiddle\nlast\n" || r.exit.ExitCode != 0 {
		t.Fatalf("stdout %q exit %+v", r.stdout.String(), r.exit)
	}
	pi, err = h.client.GetProcess(ctx, id)
	if err != nil || pi.Running || pi.ExitCode == nil || *pi.ExitCode != 0 || pi.OutputBytes != 18 {
		t.Fatalf("process info %+v %v", pi, err)
	}
	list, err := h.client.ListProcesses(ctx)
	if err != nil || len(list) != 1 || list[0].ID != id {
		t.Fatalf("list %+v %v", list, err)
	}
}

func TestManyProcesses(t *testing.T) {
	h := startAgent(t)
	ctx := testCtx(t)
	const n = 64
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id := fmt.Sprintf("many-%d", i)
			if _, err := h.client.StartProcess(ctx, agentapi.ProcessSpec{ID: id, User: "root",
				Argv: []string{"sh", "-c", `i=0; while [ $i -lt 100 ]; do echo "$0 $i"; i=$((i+1)); done; exit $(($1 % 5))`, id, strconv.Itoa(i)}}); err != nil {
				t.Error(err)
				return
			}
			var want strings.Builder
			for j := range 100 {
				fmt.Fprintf(&want, "%s %d\n", id, j)
			}
			var readers sync.WaitGroup
			for range 2 {
				readers.Go(func() {
					s, err := h.client.Output(ctx, id, 0)
					if err != nil {
						t.Error(err)
						return
					}
					r := collect(t, s)
					if r.stdout.String() != want.String() || r.exit.ExitCode != i%5 {
						t.Errorf("%s: stdout %d bytes, exit %+v", id, r.stdout.Len(), r.exit)
					}
				})
			}
			readers.Wait()
		})
	}
	wg.Wait()
	list, err := h.client.ListProcesses(ctx)
	if err != nil || len(list) != n {
		t.Fatalf("list: %d processes, %v", len(list), err)
	}
}

// patternReader yields deterministic pseudo-random bytes.
func patternReader(seed byte, n int64) io.Reader {
	return io.LimitReader(rand.NewChaCha8([32]byte{seed}), n)
}

func TestFileContent(t *testing.T) {
	h := startAgent(t)
	ctx := testCtx(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "a", "b", "big.bin")
	const size = 100 << 20
	hw := sha256.New()
	fi, err := h.client.WriteFile(ctx, path, "0600", "root", io.TeeReader(patternReader(3, size), hw))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size != size || fi.Mode != "0600" || fi.Type != "file" || fi.UID != 0 || fi.Path != path {
		t.Fatalf("write info %+v", fi)
	}
	rc, info, err := h.client.ReadFile(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	hr := sha256.New()
	n, err := io.Copy(hr, rc)
	rc.Close()
	if err != nil || n != size || info.Size != size || info.Mode != "0600" {
		t.Fatalf("read %d bytes, %v, info %+v", n, err, info)
	}
	if !bytes.Equal(hw.Sum(nil), hr.Sum(nil)) {
		t.Fatal("sha256 of the read file differs from what was written")
	}
	// Overwrite in place with a small file; no temp files left behind.
	if _, err := h.client.WriteFile(ctx, path, "", "", strings.NewReader("small")); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != "small" {
		t.Fatalf("overwrite: %q %v", got, err)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("directory has %d entries, want 1 (temp file left?)", len(entries))
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o644 {
		t.Fatalf("default mode %v, want 0644", st.Mode().Perm())
	}
	// Empty file.
	if fi, err := h.client.WriteFile(ctx, filepath.Join(dir, "empty"), "", "", nil); err != nil || fi.Size != 0 {
		t.Fatalf("empty file: %+v %v", fi, err)
	}
}

func TestFileOps(t *testing.T) {
	h := startAgent(t)
	ctx := testCtx(t)
	dir := t.TempDir()
	p := func(s string) string { return filepath.Join(dir, s) }

	fi, err := h.client.Mkdir(ctx, agentapi.Mkdir{Path: p("x/y/z"), Mode: "0700", Owner: "root"})
	if err != nil || fi.Type != "dir" || fi.Mode != "0700" || fi.Name != "z" {
		t.Fatalf("mkdir: %+v %v", fi, err)
	}
	if _, err := h.client.Mkdir(ctx, agentapi.Mkdir{Path: p("x/y/z")}); err != nil {
		t.Fatalf("mkdir -p of an existing dir: %v", err)
	}
	for _, name := range []string{"c", "a", "b"} {
		if _, err := h.client.WriteFile(ctx, p("x/"+name), "0640", "", strings.NewReader(name+name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("a", p("x/link")); err != nil {
		t.Fatal(err)
	}
	list, err := h.client.List(ctx, p("x"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range list {
		names = append(names, e.Name+":"+e.Type)
	}
	if got := strings.Join(names, ","); got != "a:file,b:file,c:file,link:symlink,y:dir" {
		t.Fatalf("list = %s", got)
	}
	st, err := h.client.Stat(ctx, p("x/link"))
	if err != nil || st.Type != "symlink" || st.Target != "a" {
		t.Fatalf("stat symlink: %+v %v", st, err)
	}
	st, err = h.client.Stat(ctx, p("x/a"))
	if err != nil || st.Size != 2 || st.Mode != "0640" || st.Owner != "root" {
		t.Fatalf("stat file: %+v %v", st, err)
	}
	mv, err := h.client.Move(ctx, p("x/a"), p("moved/deep/a2"))
	if err != nil || mv.Path != p("moved/deep/a2") || mv.Size != 2 {
		t.Fatalf("move: %+v %v", mv, err)
	}
	if _, err := os.Stat(p("x/a")); !os.IsNotExist(err) {
		t.Fatalf("source still exists after move: %v", err)
	}
	if err := h.client.Remove(ctx, p("x/b"), false); err != nil {
		t.Fatal(err)
	}

	errTests := []struct {
		name string
		call func() error
		want error
	}{
		{"stat missing", func() error { _, err := h.client.Stat(ctx, p("nope")); return err }, model.ErrNotFound},
		{"read missing", func() error { _, _, err := h.client.ReadFile(ctx, p("nope")); return err }, model.ErrNotFound},
		{"read dir", func() error { _, _, err := h.client.ReadFile(ctx, p("x")); return err }, model.ErrInvalid},
		{"list missing", func() error { _, err := h.client.List(ctx, p("nope")); return err }, model.ErrNotFound},
		{"list file", func() error { _, err := h.client.List(ctx, p("x/c")); return err }, model.ErrInvalid},
		{"move missing", func() error { _, err := h.client.Move(ctx, p("nope"), p("n2")); return err }, model.ErrNotFound},
		{"remove missing", func() error { return h.client.Remove(ctx, p("nope"), true) }, model.ErrNotFound},
		{"remove non-empty dir", func() error { return h.client.Remove(ctx, p("x"), false) }, model.ErrConflict},
		{"mkdir over file", func() error { _, err := h.client.Mkdir(ctx, agentapi.Mkdir{Path: p("x/c")}); return err }, model.ErrConflict},
		{"mkdir under file", func() error { _, err := h.client.Mkdir(ctx, agentapi.Mkdir{Path: p("x/c/d")}); return err }, model.ErrConflict},
		{"write over dir", func() error {
			_, err := h.client.WriteFile(ctx, p("x/y"), "", "", strings.NewReader("x"))
			return err
		}, model.ErrConflict},
		{"write unknown owner", func() error {
			_, err := h.client.WriteFile(ctx, p("o"), "", "no-such-user-xyz", strings.NewReader("x"))
			return err
		}, model.ErrInvalid},
		{"bad mode", func() error { _, err := h.client.WriteFile(ctx, p("o"), "999", "", strings.NewReader("x")); return err }, model.ErrInvalid},
		{"empty path", func() error { _, err := h.client.Stat(ctx, ""); return err }, model.ErrInvalid},
		{"remove root", func() error { return h.client.Remove(ctx, "/", true) }, model.ErrInvalid},
	}
	for _, tt := range errTests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
	if err := h.client.Remove(ctx, p("x"), true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p("x")); !os.IsNotExist(err) {
		t.Fatalf("x still exists after recursive remove: %v", err)
	}
}

// TestReconnect closes every host-side connection, then a whole new
// listener: the agent keeps dialing and keeps its processes.
func TestReconnect(t *testing.T) {
	h := startAgent(t)
	ctx := testCtx(t)
	before, err := h.client.Health(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id := newID()
	if _, err := h.client.StartProcess(ctx, agentapi.ProcessSpec{ID: id, User: "root", Stdin: true, Argv: []string{"cat"}}); err != nil {
		t.Fatal(err)
	}
	if err := h.client.Stdin(ctx, id, strings.NewReader("before\n"), false); err != nil {
		t.Fatal(err)
	}
	// The agent dials a spare beside the one in use: wait for it.
	spare := <-h.conns
	h.conns <- spare
	if h.acceptedCount() < 2 {
		t.Fatalf("accepted %d connections, want a spare beside the used one", h.acceptedCount())
	}

	for round := range 3 {
		h.closeAll()
		h.client.Close()
		if round == 2 {
			// Take the socket away and bring it back.
			h.closeListener()
			os.Remove(h.sock)
			h.listen()
		}
		if err := h.client.WaitReady(ctx); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		after, err := h.client.Health(ctx)
		if err != nil || after.PID != before.PID || !after.Boot.Equal(before.Boot) {
			t.Fatalf("round %d: health %+v %v, want the same agent as %+v", round, after, err, before)
		}
	}
	if err := h.client.Stdin(ctx, id, strings.NewReader("after\n"), true); err != nil {
		t.Fatal(err)
	}
	s, err := h.client.Output(ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r := collect(t, s); r.stdout.String() != "before\nafter\n" || r.exit.ExitCode != 0 {
		t.Fatalf("stdout %q exit %+v", r.stdout.String(), r.exit)
	}
}

// TestSpareConnections checks that the agent keeps --spare unused
// connections dialed, and redials spares the host drops unused.
func TestSpareConnections(t *testing.T) {
	h := startAgent(t, "--spare", "3")
	take := func() []net.Conn {
		var cs []net.Conn
		for range 3 {
			cs = append(cs, <-h.conns)
		}
		return cs
	}
	spares := take() // dialed beside the connection WaitReady used
	for _, c := range spares {
		c.Close()
	}
	again := take()
	for _, c := range again {
		h.conns <- c
	}
	// Closing used and spare connections alike leaves the agent serving.
	h.closeAll()
	h.client.Close()
	if _, err := h.client.Health(testCtx(t)); err != nil {
		t.Fatal(err)
	}
}

// TestOutputRetention reads from an offset the agent no longer keeps.
func TestOutputRetention(t *testing.T) {
	h := startAgent(t, "--max-output", "100000")
	ctx := testCtx(t)
	id := newID()
	if _, err := h.client.StartProcess(ctx, agentapi.ProcessSpec{ID: id, User: "root", Cwd: "/",
		Argv: []string{"sh", "-c", "head -c 1000000 /dev/zero"}}); err != nil {
		t.Fatal(err)
	}
	// Read the live stream to the end first, so the output is complete.
	s, err := h.client.Output(ctx, id, 999_000)
	if err != nil {
		t.Fatal(err)
	}
	if r := collect(t, s); r.stdout.Len() != 1000 || r.errMsg != "" {
		t.Fatalf("tail: %d bytes, error %q", r.stdout.Len(), r.errMsg)
	}
	s, err = h.client.Output(ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := collect(t, s)
	if r.errMsg == "" || !strings.Contains(r.errMsg, "earliest retained offset") || r.combined.Len() != 0 {
		t.Fatalf("offset 0: error %q, %d bytes", r.errMsg, r.combined.Len())
	}
}

// TestPTY runs a process on a pseudo-terminal: it sees a terminal of the
// size asked for (and TERM), a resize reaches it, stdin is the terminal
// (Ctrl-C, byte 3, interrupts the foreground job through the line
// discipline), and its output is one stdout stream.
func TestPTY(t *testing.T) {
	h := startAgent(t)
	ctx := testCtx(t)
	id := newID()
	script := `test -t 0 && test -t 1 && echo "tty:$TERM"; stty size; read line; stty size; echo "got:$line"; ` +
		`trap 'echo interrupted; exit 9' INT; echo armed; while :; do sleep 0.1; done`
	if _, err := h.client.StartProcess(ctx, agentapi.ProcessSpec{ID: id, User: "root", Argv: []string{"/bin/bash", "-c", script},
		PTY: &agentapi.PTYSize{Cols: 100, Rows: 30}}); err != nil {
		t.Fatal(err)
	}
	s, err := h.client.Output(ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out strings.Builder
	until := func(want string) {
		t.Helper()
		for !strings.Contains(out.String(), want) {
			kind, payload, err := s.Next()
			if err != nil {
				t.Fatalf("waiting for %q in %q: %v", want, out.String(), err)
			}
			switch kind {
			case agentapi.FrameStdout:
				out.Write(payload)
			case agentapi.FrameExit:
				t.Fatalf("exited (%s) before %q; output %q", payload, want, out.String())
			default:
				t.Fatalf("frame kind %d on a PTY stream (want only stdout): %q", kind, payload)
			}
		}
	}
	until("30 100")
	if !strings.Contains(out.String(), "tty:xterm-256color") {
		t.Fatalf("no terminal (or TERM) seen: %q", out.String())
	}
	// Stdin as the worker streams it: one request open for the session.
	// A resize must not wait for it.
	pr, pw := io.Pipe()
	stdinDone := make(chan error, 1)
	go func() { stdinDone <- h.client.Stdin(ctx, id, pr, false) }()
	if _, err := pw.Write([]byte("x")); err != nil { // the stream is open and delivering
		t.Fatal(err)
	}
	if err := h.client.Resize(ctx, id, agentapi.PTYSize{Cols: 132, Rows: 43}); err != nil {
		t.Fatal(err)
	}
	if _, err := pw.Write([]byte("hello\r")); err != nil {
		t.Fatal(err)
	}
	until("43 132")
	until("got:xhello")
	until("armed")
	if _, err := pw.Write([]byte("\x03")); err != nil {
		t.Fatal(err)
	}
	until("interrupted")
	pw.Close()
	if err := <-stdinDone; err != nil {
		t.Fatalf("streamed stdin: %v", err)
	}
	for {
		kind, payload, err := s.Next()
		if err != nil {
			t.Fatalf("no exit after Ctrl-C: %v; output %q", err, out.String())
		}
		if kind == agentapi.FrameExit {
			var e agentapi.Exit
			if err := json.Unmarshal(payload, &e); err != nil || e.ExitCode != 9 {
				t.Fatalf("exit %s (%v), want code 9", payload, err)
			}
			break
		}
	}
	// Resizing a process without a terminal, or to a silly size, is refused.
	plain := newID()
	if _, err := h.client.StartProcess(ctx, agentapi.ProcessSpec{ID: plain, User: "root", Argv: []string{"sleep", "5"}}); err != nil {
		t.Fatal(err)
	}
	if err := h.client.Resize(ctx, plain, agentapi.PTYSize{Cols: 80, Rows: 24}); !errors.Is(err, model.ErrConflict) {
		t.Fatalf("resize of a process without a terminal: %v, want conflict", err)
	}
	h.client.Signal(ctx, plain, "KILL")
	if err := h.client.Resize(ctx, id, agentapi.PTYSize{Cols: 0, Rows: 24}); !errors.Is(err, model.ErrInvalid) {
		t.Fatalf("resize to 0 columns: %v, want invalid", err)
	}
	if _, err := h.client.StartProcess(ctx, agentapi.ProcessSpec{ID: newID(), User: "root", Argv: []string{"true"},
		PTY: &agentapi.PTYSize{Cols: 5000, Rows: 1}}); !errors.Is(err, model.ErrInvalid) {
		t.Fatalf("start with a 5000-column terminal: %v, want invalid", err)
	}
}
