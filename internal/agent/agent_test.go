package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/testenv"
)

func TestUserLookup(t *testing.T) {
	dir := t.TempDir()
	passwd := filepath.Join(dir, "passwd")
	group := filepath.Join(dir, "group")
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(passwd, `root:x:0:0:root:/root:/bin/bash
# a comment
user:x:1000:1000:User,,,:/home/user:/bin/bash
nohome:x:1001:1001::::
broken:x:notanumber:1:::
`)
	write(group, `root:x:0:
user:x:1000:
docker:x:999:user,other
audio:x:29: other , user
nohome:x:1001:
`)
	db := loadUsers(passwd, group)
	tests := []struct {
		in   string
		ok   bool
		want user
	}{
		{"root", true, user{Name: "root", UID: 0, GID: 0, Home: "/root", Shell: "/bin/bash", Groups: []uint32{0}}},
		{"user", true, user{Name: "user", UID: 1000, GID: 1000, Home: "/home/user", Shell: "/bin/bash", Groups: []uint32{1000, 999, 29}}},
		{"1000", true, user{Name: "user", UID: 1000, GID: 1000, Home: "/home/user", Shell: "/bin/bash", Groups: []uint32{1000, 999, 29}}},
		{"nohome", true, user{Name: "nohome", UID: 1001, GID: 1001, Home: "/", Shell: "/bin/sh", Groups: []uint32{1001}}},
		{"4242", true, user{Name: "4242", UID: 4242, GID: 4242, Home: "/", Shell: "/bin/sh", Groups: []uint32{4242}}},
		{"broken", false, user{}},
		{"nobody", false, user{}},
		{"-1", false, user{}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, ok := db.lookup(tt.in)
			if ok != tt.ok || got.Name != tt.want.Name || got.UID != tt.want.UID || got.GID != tt.want.GID ||
				got.Home != tt.want.Home || got.Shell != tt.want.Shell || !slices.Equal(got.Groups, tt.want.Groups) {
				t.Fatalf("lookup(%q) = %+v, %v; want %+v, %v", tt.in, got, ok, tt.want, tt.ok)
			}
		})
	}
	if got := db.userName(1000); got != "user" {
		t.Fatalf("userName(1000) = %q", got)
	}
	if got := db.userName(7); got != "" {
		t.Fatalf("userName(7) = %q", got)
	}
	if empty := loadUsers(filepath.Join(dir, "missing"), filepath.Join(dir, "missing")); len(empty.users) != 0 {
		t.Fatal("missing passwd file should be an empty database")
	}
}

func TestOutputLog(t *testing.T) {
	l := newOutputLog(10)
	l.append(agentapi.FrameStdout, []byte("abcd")) // 0-4
	l.append(agentapi.FrameStderr, []byte("efg"))  // 4-7
	res := l.read(2, 1<<20)
	if res.tooOld || res.done || len(res.chunks) != 2 || string(res.chunks[0].data) != "cd" ||
		res.chunks[0].kind != agentapi.FrameStdout || string(res.chunks[1].data) != "efg" || res.next != 7 {
		t.Fatalf("read(2) = %+v", res)
	}
	wait := l.read(7, 1<<20).wait
	l.append(agentapi.FrameStdout, []byte("hijk")) // 7-11: drops "abcd"
	select {
	case <-wait:
	default:
		t.Fatal("append did not wake readers")
	}
	if res := l.read(3, 1<<20); !res.tooOld || res.start != 4 {
		t.Fatalf("read(3) after drop = %+v, want tooOld with start 4", res)
	}
	if res := l.read(4, 1<<20); res.tooOld || len(res.chunks) != 2 || res.next != 11 {
		t.Fatalf("read(4) = %+v", res)
	}
	// Beyond the end: nothing yet, not done.
	if res := l.read(20, 1<<20); len(res.chunks) != 0 || res.done {
		t.Fatalf("read(20) = %+v", res)
	}
	l.finish(agentapi.Exit{ExitCode: 3})
	if res := l.read(11, 1<<20); !res.done || res.exit.ExitCode != 3 || len(res.chunks) != 0 {
		t.Fatalf("read(11) after finish = %+v", res)
	}
	if res := l.read(5, 1<<20); !res.done || len(res.chunks) != 2 || string(res.chunks[0].data) != "fg" {
		t.Fatalf("read(5) after finish must return the rest, then done: %+v", res)
	}
	// A read limit splits batches at chunk boundaries.
	if res := l.read(4, 1); len(res.chunks) != 1 || res.next != 7 || res.done {
		t.Fatalf("read(4, limit 1) = %+v", res)
	}
}

func TestOutputLogRetention(t *testing.T) {
	l := newOutputLog(1 << 20)
	var all bytes.Buffer
	for i := range 5000 {
		b := bytes.Repeat([]byte{byte(i)}, 1000)
		all.Write(b)
		l.append(agentapi.FrameStdout, b)
	}
	res := l.read(0, 1<<30)
	if !res.tooOld {
		t.Fatal("offset 0 should have been dropped")
	}
	start := res.start
	if int64(all.Len())-start > 1<<20 || int64(all.Len())-start < 1<<20-1000 {
		t.Fatalf("retained %d bytes, want about 1 MiB", int64(all.Len())-start)
	}
	res = l.read(start+1, 1<<30)
	var got bytes.Buffer
	for _, c := range res.chunks {
		got.Write(c.data)
	}
	if !bytes.Equal(got.Bytes(), all.Bytes()[start+1:]) {
		t.Fatal("retained output differs from the newest bytes written")
	}
}

func TestParseSignal(t *testing.T) {
	tests := []struct {
		in   string
		want syscall.Signal
		ok   bool
	}{
		{"TERM", syscall.SIGTERM, true},
		{"sigkill", syscall.SIGKILL, true},
		{"SIGUSR1", syscall.SIGUSR1, true},
		{"9", syscall.SIGKILL, true},
		{"0", 0, false},
		{"BOGUS", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		got, err := parseSignal(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("parseSignal(%q) = %v, %v", tt.in, got, err)
		}
	}
	if got := signalName(syscall.SIGTERM); got != "TERM" {
		t.Errorf("signalName(TERM) = %q", got)
	}
}

func TestParseMode(t *testing.T) {
	tests := []struct {
		in   string
		want fs.FileMode
		ok   bool
	}{
		{"", 0o644, true},
		{"0600", 0o600, true},
		{"755", 0o755, true},
		{"4755", 0o755 | fs.ModeSetuid, true},
		{"1777", 0o777 | fs.ModeSticky, true},
		{"10000", 0, false},
		{"9", 0, false},
		{"rwx", 0, false},
	}
	for _, tt := range tests {
		got, err := parseMode(tt.in, 0o644)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("parseMode(%q) = %v, %v", tt.in, got, err)
		}
	}
}

func TestResolve(t *testing.T) {
	a := New(Config{Home: "/home/user"})
	tests := []struct{ in, want string }{
		{"a/b", "/home/user/a/b"},
		{"/etc/../tmp/x", "/tmp/x"},
		{"../x", "/home/x"},
		{".", "/home/user"},
	}
	for _, tt := range tests {
		if got, err := a.resolve(tt.in); err != nil || got != tt.want {
			t.Errorf("resolve(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	if _, err := a.resolve(""); !errors.Is(err, errInvalid) {
		t.Errorf("resolve(\"\") = %v, want invalid", err)
	}
}

func TestLookPath(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "exe"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "plain"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		argv0, path string
		want        string
		code        int
	}{
		{"exe", dir, filepath.Join(dir, "exe"), 0},
		{"exe", "/nonexistent:" + dir, filepath.Join(dir, "exe"), 0},
		{"./exe", "", filepath.Join(dir, "exe"), 0},
		{"plain", dir, "", 126},
		{"missing", dir, "", 127},
		{"./missing", dir, "", 127},
		{dir, "", "", 126},
	}
	for _, tt := range tests {
		got, code, err := lookPath(tt.argv0, tt.path, dir)
		if code != tt.code || (tt.code == 0) != (err == nil) || (tt.code == 0 && got != tt.want) {
			t.Errorf("lookPath(%q, %q) = %q, %d, %v; want %q, %d", tt.argv0, tt.path, got, code, err, tt.want, tt.code)
		}
	}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		err    error
		status int
		code   string
	}{
		{errorf(errNotFound, "x"), http.StatusNotFound, "not_found"},
		{fmt.Errorf("wrap: %w", fs.ErrNotExist), http.StatusNotFound, "not_found"},
		{errorf(errInvalid, "x"), http.StatusBadRequest, "invalid"},
		{errorf(errConflict, "x"), http.StatusConflict, "conflict"},
		{&fs.PathError{Op: "rmdir", Path: "/x", Err: syscall.ENOTEMPTY}, http.StatusConflict, "conflict"},
		{&fs.PathError{Op: "mkdir", Path: "/x", Err: syscall.ENOTDIR}, http.StatusConflict, "conflict"},
		{errors.New("boom"), http.StatusInternalServerError, "internal"},
	}
	for _, tt := range tests {
		if status, code := classify(tt.err); status != tt.status || code != tt.code {
			t.Errorf("classify(%v) = %d %s, want %d %s", tt.err, status, code, tt.status, tt.code)
		}
	}
}

// TestInProcessWithExec runs the agent inside a process that also uses
// os/exec: when not PID 1 the reaper must only reap its own children.
func TestInProcessWithExec(t *testing.T) {
	testenv.RequireRoot(t, "processes run with an explicit uid/gid")
	a := New(Config{})
	for i := range 20 {
		p, err := a.start(agentapi.ProcessSpec{ID: fmt.Sprint(i), User: "root", Cwd: "/", Argv: []string{"sh", "-c", "echo hi; exit 4"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := exec.Command("true").Run(); err != nil {
			t.Fatalf("os/exec next to the agent: %v", err)
		}
		var out []byte
		for off := int64(0); ; {
			res := p.out.read(off, 1<<20)
			for _, c := range res.chunks {
				out = append(out, c.data...)
			}
			off = res.next
			if res.done {
				if string(out) != "hi\n" || res.exit.ExitCode != 4 {
					t.Fatalf("output %q exit %+v", out, res.exit)
				}
				break
			}
			if len(res.chunks) == 0 {
				<-res.wait
			}
		}
	}
}

// TestFinishedProcessesPruned: finished processes beyond MaxFinished, or
// beyond MaxFinishedOutput bytes of retained output, are forgotten oldest
// first when a new process starts; running ones never are.
func TestFinishedProcessesPruned(t *testing.T) {
	testenv.RequireRoot(t, "processes run with an explicit uid/gid")
	a := New(Config{MaxFinished: 3, MaxFinishedOutput: 1 << 20})
	wait := func(p *process) {
		t.Helper()
		for off := int64(0); ; {
			res := p.out.read(off, 1<<20)
			off = res.next
			if res.done {
				return
			}
			if len(res.chunks) == 0 {
				<-res.wait
			}
		}
	}
	ids := func() []string {
		a.mu.Lock()
		defer a.mu.Unlock()
		var out []string
		for id := range a.procs {
			out = append(out, id)
		}
		slices.Sort(out)
		return out
	}
	run := func(id string, argv ...string) *process {
		t.Helper()
		p, err := a.start(agentapi.ProcessSpec{ID: id, User: "root", Cwd: "/", Argv: argv})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	long := run("running", "sleep", "1000")
	defer long.signal(syscall.SIGKILL)
	for i := range 5 {
		wait(run(fmt.Sprintf("f%d", i), "true"))
	}
	// Starting f4 with f0..f3 finished left room for it: at most 3 finished.
	if got, want := ids(), []string{"f2", "f3", "f4", "running"}; !slices.Equal(got, want) {
		t.Fatalf("kept %v, want %v", got, want)
	}
	// Output bound: a process that leaves 1 MiB+ of output pushes out the
	// older ones at the next start.
	wait(run("big", "head", "-c", "1100000", "/dev/zero"))
	wait(run("next", "true"))
	if got, want := ids(), []string{"next", "running"}; !slices.Equal(got, want) {
		t.Fatalf("after a big output kept %v, want %v", got, want)
	}
	if _, err := a.proc("f2"); err == nil {
		t.Fatal("a forgotten process is still found")
	}
}
