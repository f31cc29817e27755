package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/agentapi"
)

// This file is the in-process API of the agent's process table and file
// code, used by services that share the agent's process (the envd
// services in internal/agent/envd). Processes started here live in the same
// table as those started over agentapi, and share the reaper.

// Error kinds returned by the in-process API (match with errors.Is).
var (
	ErrNotFound = errNotFound
	ErrInvalid  = errInvalid
	ErrConflict = errConflict
)

// Output kinds of Batch chunks.
const (
	OutputStdout      = agentapi.FrameStdout
	OutputStderr      = agentapi.FrameStderr
	OutputPTY    byte = 0x40
)

// Winsize is a terminal size.
type Winsize struct{ Rows, Cols uint16 }

// ExecSpec starts a process for an in-process service.
type ExecSpec struct {
	Argv  []string          // Argv[0] is looked up in PATH
	Env   map[string]string // merged over the base environment
	Cwd   string            // default: the user's home
	User  string            // default agentapi.DefaultUser
	Stdin bool              // keep a stdin pipe open (always true with PTY)
	PTY   *Winsize          // run on a new terminal of this size
	Tag   string
	// ConfigEnv is the environment Proc.Env reports (default Env), e.g. the
	// caller's own variables without those merged in from elsewhere.
	ConfigEnv map[string]string
}

// Proc is a handle on one process in the agent's table.
type Proc struct{ p *process }

// Handle mounts h on the agent's mux (e.g. "/envd/").
func (a *Agent) Handle(pattern string, h http.Handler) { a.mux.Handle(pattern, h) }

var execSeq atomic.Uint64

// Exec starts a process. It stays in the process table until it has
// finished. A program that cannot be started yields a finished Proc whose
// PID is 0 and whose Exit has an Error.
func (a *Agent) Exec(spec ExecSpec) (*Proc, error) {
	id := "exec-" + strconv.FormatUint(execSeq.Add(1), 10)
	as := agentapi.ProcessSpec{ID: id, Argv: spec.Argv, Env: spec.Env, Cwd: spec.Cwd, User: spec.User,
		Stdin: spec.Stdin || spec.PTY != nil}
	p, err := a.startWith(as, func(p *process) {
		p.tag, p.env, p.cwd = spec.Tag, spec.Env, spec.Cwd
		if spec.ConfigEnv != nil {
			p.env = spec.ConfigEnv
		}
		if spec.PTY != nil {
			ws := *spec.PTY
			p.ptySize = &ws
		}
		p.forget = func() {
			a.mu.Lock()
			if a.procs[id] == p {
				delete(a.procs, id)
			}
			a.mu.Unlock()
		}
	})
	if err != nil {
		return nil, err
	}
	return &Proc{p: p}, nil
}

// Procs returns the running processes, oldest first.
func (a *Agent) Procs() []*Proc {
	a.mu.Lock()
	ps := make([]*process, 0, len(a.procs))
	for _, p := range a.procs {
		ps = append(ps, p)
	}
	a.mu.Unlock()
	sort.Slice(ps, func(i, j int) bool { return ps[i].started.Before(ps[j].started) })
	var out []*Proc
	for _, p := range ps {
		if p.running() {
			out = append(out, &Proc{p: p})
		}
	}
	return out
}

// FindPID returns the running process with pid.
func (a *Agent) FindPID(pid int) (*Proc, bool) {
	for _, p := range a.Procs() {
		if p.p.pid == pid {
			return p, true
		}
	}
	return nil, false
}

// FindTag returns the newest running process started with tag.
func (a *Agent) FindTag(tag string) (*Proc, bool) {
	ps := a.Procs()
	for i := len(ps) - 1; i >= 0; i-- {
		if tag != "" && ps[i].p.tag == tag {
			return ps[i], true
		}
	}
	return nil, false
}

func (p *process) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid != 0 && !p.finished
}

// PID is the process id (0 if it could not be started).
func (p *Proc) PID() int { return p.p.pid }

// Argv, Env, Cwd and Tag are what the process was started with.
func (p *Proc) Argv() []string         { return p.p.argv }
func (p *Proc) Env() map[string]string { return p.p.env }
func (p *Proc) Cwd() string            { return p.p.cwd }
func (p *Proc) Tag() string            { return p.p.tag }

// IsPTY tells whether the process runs on a terminal.
func (p *Proc) IsPTY() bool { return p.p.ptySize != nil }

// Offset is the combined output offset reached so far.
func (p *Proc) Offset() int64 { return p.p.out.offset() }

// Chunk is one piece of output.
type Chunk struct {
	Kind byte // OutputStdout, OutputStderr or OutputPTY
	Data []byte
}

// Batch is what Read returns.
type Batch struct {
	Chunks []Chunk
	Next   int64           // offset after Chunks
	Done   bool            // the process finished and no output is left after Next
	Exit   agentapi.Exit   // when Done
	Wait   <-chan struct{} // closed when there is more to read
}

// Read returns the output from offset (about 1 MiB at most). An offset
// older than the retained output starts at the oldest retained byte.
func (p *Proc) Read(offset int64) Batch {
	res := p.p.out.read(offset, 1<<20)
	if res.tooOld {
		res = p.p.out.read(res.start, 1<<20)
	}
	b := Batch{Next: res.next, Done: res.done, Exit: res.exit, Wait: res.wait}
	for _, c := range res.chunks {
		b.Chunks = append(b.Chunks, Chunk{Kind: c.kind, Data: c.data})
	}
	return b
}

// WriteInput writes data to the process's stdin (its terminal for a PTY).
func (p *Proc) WriteInput(ctx context.Context, data []byte) error {
	return p.p.writeStdin(ctx, bytes.NewReader(data), false)
}

// CloseStdin closes the stdin pipe (a no-op when there is none).
func (p *Proc) CloseStdin() { p.p.closeStdin() }

// Signal sends sig to the process's group.
func (p *Proc) Signal(sig syscall.Signal) error { return p.p.signal(sig) }

// Resize sets the terminal size of a PTY process.
func (p *Proc) Resize(ws Winsize) error {
	if p.p.ptySize == nil {
		return errorf(errConflict, "process %d has no terminal", p.p.pid)
	}
	p.p.mu.Lock()
	f, finished := p.p.ptyOut, p.p.finished
	p.p.mu.Unlock()
	if f == nil || finished {
		return errorf(errConflict, "process %d has finished", p.p.pid)
	}
	if err := setWinsize(f, ws); err != nil {
		if errors.Is(err, os.ErrClosed) {
			return errorf(errConflict, "process %d has finished", p.p.pid)
		}
		return err
	}
	return nil
}

func setWinsize(f *os.File, ws Winsize) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("set terminal size: %w", err)
	}
	var ioErr error
	if err := rc.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: ws.Rows, Col: ws.Cols})
	}); err != nil {
		return fmt.Errorf("set terminal size: %w", err)
	}
	if ioErr != nil {
		return fmt.Errorf("set terminal size: %w", ioErr)
	}
	return nil
}

// launchPTY starts the process as a session leader on a new terminal; the
// master is the process's stdin (input, resize) and a duplicate of it is
// drained as OutputPTY.
func (a *Agent) launchPTY(p *process, spec agentapi.ProcessSpec, u user, path string, env []string, cwd string) error {
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return fmt.Errorf("open /dev/ptmx: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			master.Close()
		}
	}()
	rc, err := master.SyscallConn()
	if err != nil {
		return fmt.Errorf("pty: %w", err)
	}
	var n, readFD int
	var ctlErr error
	if err := rc.Control(func(fd uintptr) {
		if ctlErr = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); ctlErr != nil {
			return
		}
		if n, ctlErr = unix.IoctlGetInt(int(fd), unix.TIOCGPTN); ctlErr != nil {
			return
		}
		readFD, ctlErr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil || ctlErr != nil {
		return fmt.Errorf("pty: unlock and name: %w", errors.Join(err, ctlErr))
	}
	reader := os.NewFile(uintptr(readFD), "/dev/ptmx")
	defer func() {
		if !ok {
			reader.Close()
		}
	}()
	if err := setWinsize(master, *p.ptySize); err != nil {
		return err
	}
	slaveName := "/dev/pts/" + strconv.Itoa(n)
	slave, err := os.OpenFile(slaveName, os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", slaveName, err)
	}
	defer slave.Close()
	sys := &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if os.Getuid() == 0 {
		sys.Credential = &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(u.GID), Groups: u.Groups}
		_ = os.Chown(slaveName, u.UID, u.GID)
	} else if u.UID != os.Getuid() {
		return fmt.Errorf("run as uid %d: the agent is not root", u.UID)
	}
	fd := slave.Fd()
	attr := &syscall.ProcAttr{Dir: cwd, Env: env, Files: []uintptr{fd, fd, fd}, Sys: sys}
	p.mu.Lock()
	pid, err := spawn(path, spec.Argv, attr, p.onExit)
	if err != nil {
		p.mu.Unlock()
		return fmt.Errorf("start %s: %w", spec.Argv[0], err)
	}
	p.pid = pid
	p.openPipes = 1
	p.stdin = master
	p.ptyOut = reader
	p.mu.Unlock()
	ok = true
	go p.drain(reader, OutputPTY)
	return nil
}

// User is an account of the sandbox.
type User struct {
	Name     string
	UID, GID int
	Home     string
}

// LookupUser finds a user by name or uid.
func (a *Agent) LookupUser(name string) (User, bool) {
	u, ok := a.users().lookup(name)
	return User{Name: u.Name, UID: u.UID, GID: u.GID, Home: u.Home}, ok
}

// OwnerNames returns the user and group names of uid and gid, or the
// numbers when they have no names.
func (a *Agent) OwnerNames(uid, gid int) (string, string) {
	db := a.users()
	owner, group := db.userName(uid), ""
	for _, g := range db.groups {
		if g.gid == gid {
			group = g.name
			break
		}
	}
	if owner == "" {
		owner = strconv.Itoa(uid)
	}
	if group == "" {
		group = strconv.Itoa(gid)
	}
	return owner, group
}

// MkdirAll creates dir and its missing parents (mode 0755), owned by the
// named user.
func (a *Agent) MkdirAll(dir, owner string) error {
	db := a.users()
	u, chown, err := a.owner(db, owner)
	if err != nil {
		return err
	}
	return mkdirAll(dir, 0o755, u, chown)
}

// WriteFile replaces the file at the absolute path with body (written to a
// temporary file and renamed), creating parents; new files and directories
// belong to owner.
func (a *Agent) WriteFile(path string, body io.Reader, owner string) error {
	r := &http.Request{Body: io.NopCloser(body), ContentLength: -1}
	_, err := a.writeFile(r, path, "", owner)
	return err
}

// Move renames from to to (absolute paths), across filesystems too,
// creating the parents of to.
func (a *Agent) Move(from, to string) error {
	_, err := a.move(agentapi.Move{From: from, To: to})
	return err
}

// RemoveAll removes path and, for a directory, everything in it, following
// no symlink a non-root user made in its directories (see safepath.go). A
// path that does not exist is not an error.
func (a *Agent) RemoveAll(path string) error {
	dir, base, err := walker{}.openParent(filepath.Clean(path))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	defer dir.Close()
	if err := removeAt(dir, base, true); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
