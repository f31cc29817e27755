package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/agentapi"
)

// basePath is PATH in every process's base environment.
const basePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// readChunk is the pipe read size, and so the largest output chunk.
const readChunk = 64 << 10

// The reaper: one goroutine waits for children on every SIGCHLD and hands
// each exit status to whoever registered that pid. As PID 1 it waits for any
// child (wait4(-1)), so orphans re-parented to it are reaped too (their
// statuses are ignored); otherwise it waits only for the pids it started, so
// an Agent can live in a process that also uses os/exec. Processes are never
// waited for elsewhere (no exec.Cmd.Wait), so nothing races it.
var reaper struct {
	once    sync.Once
	mu      sync.Mutex // held across fork+register, so a pid is registered before it can be dispatched
	waiters map[int]func(syscall.WaitStatus)
}

func startReaper() {
	reaper.once.Do(func() {
		reaper.waiters = map[int]func(syscall.WaitStatus){}
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGCHLD)
		isInit := os.Getpid() == 1
		go func() {
			for {
				if isInit {
					reapAny()
				} else {
					reapOwn()
				}
				<-ch
			}
		}()
	})
}

func reapAny() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		dispatch(pid, ws)
	}
}

func reapOwn() {
	reaper.mu.Lock()
	pids := make([]int, 0, len(reaper.waiters))
	for pid := range reaper.waiters {
		pids = append(pids, pid)
	}
	reaper.mu.Unlock()
	for _, pid := range pids {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		for err == syscall.EINTR {
			got, err = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		}
		if err == nil && got == pid {
			dispatch(pid, ws)
		}
	}
}

func dispatch(pid int, ws syscall.WaitStatus) {
	reaper.mu.Lock()
	fn := reaper.waiters[pid]
	delete(reaper.waiters, pid)
	reaper.mu.Unlock()
	if fn != nil {
		fn(ws)
	}
}

// spawn forks and execs, registering onExit for the child's exit status.
func spawn(path string, argv []string, attr *syscall.ProcAttr, onExit func(syscall.WaitStatus)) (int, error) {
	reaper.mu.Lock()
	defer reaper.mu.Unlock()
	pid, err := syscall.ForkExec(path, argv, attr)
	if err != nil {
		return 0, err
	}
	reaper.waiters[pid] = onExit
	return pid, nil
}

// process is one started (or failed-to-start) process.
type process struct {
	id      string
	argv    []string
	pid     int
	started time.Time
	out     *outputLog
	log     *slog.Logger

	stdinMu sync.Mutex
	stdin   *os.File // nil: none or closed

	// Set by Exec (in-process services) before launch.
	tag     string
	env     map[string]string // the caller's environment, as asked
	cwd     string
	ptySize *Winsize // non-nil: the process runs on a terminal; stdin is its master
	// ptyOut is the terminal master's duplicate that output is drained
	// from (under mu); resizes go through it, not through stdin, whose
	// lock a streaming stdin write holds for as long as it streams.
	ptyOut *os.File
	forget func() // called once the process has finished

	pipes []uint64 // inodes of the output pipes (none on a terminal); see tree.go

	mu        sync.Mutex
	status    *syscall.WaitStatus
	signalled bool // a signal was asked for, or the timeout hit: see signal
	killing   bool // killTree is at work; the command does not finish meanwhile
	openPipes int
	timedOut  bool
	timer     *time.Timer
	finished  bool
	exit      agentapi.Exit
	ended     time.Time
}

func (p *process) info() agentapi.ProcessInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	pi := agentapi.ProcessInfo{ID: p.id, PID: p.pid, Argv: p.argv, Running: !p.finished,
		StartedAt: p.started, OutputBytes: p.out.offset()}
	if p.finished {
		code := p.exit.ExitCode
		ended := p.ended
		pi.ExitCode, pi.EndedAt = &code, &ended
	}
	return pi
}

// onExit receives the exit status from the reaper.
func (p *process) onExit(ws syscall.WaitStatus) {
	p.mu.Lock()
	p.status = &ws
	if p.timer != nil {
		p.timer.Stop()
	}
	if p.signalled && !p.finished && !p.killing {
		// The leader of a signalled command is gone: so is the command.
		// It finishes once killTree saw the last of its processes dead
		// (closing the output is not enough: a killed process closes its
		// files before it is done exiting).
		p.killing = true
		go p.killTree()
	}
	p.maybeFinishLocked()
	p.mu.Unlock()
}

// pipeClosed is called when one output pipe reaches EOF.
func (p *process) pipeClosed() {
	p.mu.Lock()
	p.openPipes--
	p.maybeFinishLocked()
	p.mu.Unlock()
}

func (p *process) maybeFinishLocked() {
	if p.finished || p.status == nil || p.openPipes > 0 || p.killing {
		return
	}
	ws := *p.status
	exit := agentapi.Exit{TimedOut: p.timedOut}
	switch {
	case ws.Exited():
		exit.ExitCode = ws.ExitStatus()
	case ws.Signaled():
		exit.ExitCode = -1
		exit.Signal = signalName(ws.Signal())
	default:
		exit.ExitCode = -1
	}
	p.finishLocked(exit)
}

func (p *process) finishLocked(exit agentapi.Exit) {
	p.finished, p.exit, p.ended = true, exit, time.Now().UTC()
	p.out.finish(exit)
	go p.closeStdin() // not under p.mu: a stdin writer may hold stdinMu
	if p.forget != nil {
		go p.forget()
	}
}

func (p *process) closeStdin() {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
}

// drain copies one pipe into the output log until EOF.
func (p *process) drain(f *os.File, kind byte) {
	defer p.pipeClosed()
	defer f.Close()
	buf := make([]byte, readChunk)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			p.out.append(kind, append([]byte(nil), buf[:n]...))
		}
		if err != nil {
			return
		}
	}
}

// signal sends sig to every process of the command (see tree.go): its
// session, whatever process group a member moved to, and any process that
// holds its output. KILL ends all of them for certain: they are killed
// again until none is left. A command that was signalled ends when its
// leader does: the processes it leaves behind are killed then, so the
// output closes and the exit is reported. (A process the command forks
// after its leader caught the signal, as sh does while it defers SIGINT
// until its foreground child ends, does not get that signal; KILL or the
// timeout still end it.)
func (p *process) signal(sig syscall.Signal) error {
	p.mu.Lock()
	if p.pid == 0 || p.finished {
		p.mu.Unlock()
		return errorf(errConflict, "process %s is not running", p.id)
	}
	p.signalled = true
	pid, leaderGone := p.pid, p.status != nil
	p.mu.Unlock()
	if sig == syscall.SIGKILL || leaderGone {
		if sig != syscall.SIGKILL {
			_ = signalTree(pid, p.openOutput, sig, true)
		}
		p.killAll()
		return nil
	}
	if err := signalTree(pid, p.openOutput, sig, false); err != nil {
		return fmt.Errorf("signal process group %d: %w", pid, err)
	}
	return nil
}

// openOutput returns the inodes of the output pipes while one is open.
func (p *process) openOutput() []uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.openPipes == 0 {
		return nil
	}
	return p.pipes
}

// killAll kills every process of the command until none is left; one call
// at a time does the work, others return at once.
func (p *process) killAll() {
	p.mu.Lock()
	if p.killing || p.pid == 0 {
		p.mu.Unlock()
		return
	}
	p.killing = true
	p.mu.Unlock()
	p.killTree()
}

// killTree does killAll's work once p.killing is set, then clears it and
// lets the command finish.
func (p *process) killTree() {
	gone := killTree(p.pid, p.openOutput)
	p.mu.Lock()
	p.killing = false
	p.maybeFinishLocked()
	p.mu.Unlock()
	if !gone {
		p.log.Warn("some processes of a killed command are still alive", "id", p.id, "after", killTreeLimit)
	}
}

// maxLogArgv bounds the argv in a log line (argv may be 256 KiB).
const maxLogArgv = 256

// LogArgv is argv for a log line (exported for the envd services).
func LogArgv(argv []string) string { return logArgv(argv) }

// logArgv is argv for a log line: quoted, cut to maxLogArgv bytes, with the
// total size when cut.
func logArgv(argv []string) string {
	var b strings.Builder
	total := 0
	for _, a := range argv {
		total += len(a) + 1
	}
	for i, a := range argv {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.Quote(a))
		if b.Len() > maxLogArgv {
			break
		}
	}
	s := b.String()
	if len(s) <= maxLogArgv {
		return s
	}
	return fmt.Sprintf("%s… (%d args, %d bytes)", strings.ToValidUTF8(s[:maxLogArgv], ""), len(argv), total)
}

func signalName(s syscall.Signal) string {
	if n := unix.SignalName(s); n != "" {
		return strings.TrimPrefix(n, "SIG")
	}
	return strconv.Itoa(int(s))
}

func parseSignal(s string) (syscall.Signal, error) {
	s = strings.TrimSpace(s)
	if n, err := strconv.Atoi(s); err == nil {
		if n <= 0 || n > 64 {
			return 0, errorf(errInvalid, "signal %d out of range", n)
		}
		return syscall.Signal(n), nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig, nil
	}
	return 0, errorf(errInvalid, "unknown signal %q", s)
}

// start validates spec and starts the process. A program that cannot be
// started still yields a process record that is finished with an Exit.Error.
func (a *Agent) start(spec agentapi.ProcessSpec) (*process, error) {
	return a.startWith(spec, func(*process) {})
}

// startWith is start with a hook that sets extra fields on the new process
// before it is launched.
func (a *Agent) startWith(spec agentapi.ProcessSpec, setup func(*process)) (*process, error) {
	if spec.ID == "" {
		return nil, errorf(errInvalid, "process id is required")
	}
	if len(spec.Argv) == 0 || spec.Argv[0] == "" {
		return nil, errorf(errInvalid, "argv is required")
	}
	if spec.TimeoutS < 0 {
		return nil, errorf(errInvalid, "timeout_s must not be negative")
	}
	if spec.PTY != nil {
		if err := spec.PTY.Validate(); err != nil {
			return nil, errorf(errInvalid, "%v", err)
		}
		spec.Stdin = true
	}
	userName := spec.User
	if userName == "" {
		userName = agentapi.DefaultUser
	}
	u, ok := a.users().lookup(userName)
	if !ok {
		return nil, errorf(errInvalid, "user %q does not exist", userName)
	}
	cwd := spec.Cwd
	if cwd == "" {
		cwd = u.Home
	} else if !filepath.IsAbs(cwd) {
		cwd = filepath.Join(u.Home, cwd)
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		return nil, errorf(errInvalid, "working directory %s is not a directory", cwd)
	}
	envMap := map[string]string{
		"HOME": u.Home, "USER": u.Name, "LOGNAME": u.Name, "SHELL": u.Shell,
		"PATH": basePath, "LANG": "C.UTF-8",
	}
	for k, v := range spec.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, errorf(errInvalid, "invalid environment variable name %q", k)
		}
		envMap[k] = v
	}
	if _, ok := envMap["TERM"]; !ok && spec.PTY != nil {
		envMap["TERM"] = "xterm-256color"
	}
	env := make([]string, 0, len(envMap))
	for k, v := range envMap {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)

	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.procs[spec.ID]; ok {
		return nil, errorf(errConflict, "process %s already exists", spec.ID)
	}
	if _, ok := a.gone[spec.ID]; ok {
		return nil, errorf(errGone, "process %s already ran and its record has been dropped; it is not run again (start a new one)", spec.ID)
	}
	a.pruneLocked()
	p := &process{id: spec.ID, argv: spec.Argv, started: time.Now().UTC(), out: newOutputLog(a.cfg.MaxOutput), log: a.log}
	if spec.PTY != nil {
		p.ptySize = &Winsize{Rows: uint16(spec.PTY.Rows), Cols: uint16(spec.PTY.Cols)}
	}
	setup(p)
	a.procs[spec.ID] = p

	fail := func(code int, err error) (*process, error) {
		p.mu.Lock()
		p.finishLocked(agentapi.Exit{ExitCode: code, Error: err.Error()})
		p.mu.Unlock()
		return p, nil
	}
	path, code, err := lookPath(spec.Argv[0], envMap["PATH"], cwd)
	if err != nil {
		return fail(code, err)
	}
	if err := a.launch(p, spec, u, path, env, cwd); err != nil {
		code := 126
		if errors.Is(err, fs.ErrNotExist) {
			code = 127
		}
		return fail(code, err)
	}
	return p, nil
}

// pruneLocked makes room for a new process: it forgets the oldest finished
// processes until fewer than MaxFinished are kept and their retained output
// is at most MaxFinishedOutput. a.mu is held. A reader attached to a forgotten process
// keeps its output until it is done.
func (a *Agent) pruneLocked() {
	type fin struct {
		id    string
		ended time.Time
		bytes int64
	}
	var done []fin
	var total int64
	for id, p := range a.procs {
		p.mu.Lock()
		if p.finished {
			n := p.out.retained()
			done = append(done, fin{id, p.ended, n})
			total += n
		}
		p.mu.Unlock()
	}
	if len(done) < a.cfg.MaxFinished && total <= a.cfg.MaxFinishedOutput {
		return
	}
	sort.Slice(done, func(i, j int) bool { return done[i].ended.Before(done[j].ended) })
	for _, f := range done {
		if len(done) < a.cfg.MaxFinished && total <= a.cfg.MaxFinishedOutput {
			break
		}
		delete(a.procs, f.id)
		a.buryLocked(f.id)
		done = done[1:]
		total -= f.bytes
	}
}

// buryLocked remembers the id of a forgotten process, dropping the oldest
// remembered one when MaxTombstones are kept. a.mu is held.
func (a *Agent) buryLocked(id string) {
	if _, ok := a.gone[id]; ok {
		return
	}
	if len(a.goneOrder) < a.cfg.MaxTombstones {
		a.goneOrder = append(a.goneOrder, id)
	} else {
		delete(a.gone, a.goneOrder[a.goneNext])
		a.goneOrder[a.goneNext] = id
		a.goneNext = (a.goneNext + 1) % len(a.goneOrder)
	}
	a.gone[id] = struct{}{}
}

// launch creates the pipes and forks the process.
func (a *Agent) launch(p *process, spec agentapi.ProcessSpec, u user, path string, env []string, cwd string) error {
	if p.ptySize != nil {
		return a.launchPTY(p, spec, u, path, env, cwd)
	}
	var closeAfter []*os.File
	defer func() {
		for _, f := range closeAfter {
			f.Close()
		}
	}()
	var stdinR, stdinW *os.File
	var err error
	if spec.Stdin {
		if stdinR, stdinW, err = os.Pipe(); err != nil {
			return fmt.Errorf("create stdin pipe: %w", err)
		}
	} else if stdinR, err = os.Open(os.DevNull); err != nil {
		return fmt.Errorf("open %s: %w", os.DevNull, err)
	}
	closeAfter = append(closeAfter, stdinR)
	outR, outW, err := os.Pipe()
	if err != nil {
		if stdinW != nil {
			stdinW.Close()
		}
		return fmt.Errorf("create stdout pipe: %w", err)
	}
	closeAfter = append(closeAfter, outW)
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		if stdinW != nil {
			stdinW.Close()
		}
		return fmt.Errorf("create stderr pipe: %w", err)
	}
	closeAfter = append(closeAfter, errW)

	// Its own session: see tree.go.
	sys := &syscall.SysProcAttr{Setsid: true}
	if os.Getuid() == 0 {
		sys.Credential = &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(u.GID), Groups: u.Groups}
	} else if u.UID != os.Getuid() {
		outR.Close()
		errR.Close()
		if stdinW != nil {
			stdinW.Close()
		}
		return fmt.Errorf("run as uid %d: the agent is not root", u.UID)
	}
	attr := &syscall.ProcAttr{
		Dir:   cwd,
		Env:   env,
		Files: []uintptr{stdinR.Fd(), outW.Fd(), errW.Fd()},
		Sys:   sys,
	}
	p.mu.Lock() // so onExit cannot run before pid and pipes are set up
	pid, err := spawn(path, spec.Argv, attr, p.onExit)
	if err != nil {
		p.mu.Unlock()
		outR.Close()
		errR.Close()
		if stdinW != nil {
			stdinW.Close()
		}
		return fmt.Errorf("start %s: %w", spec.Argv[0], err)
	}
	p.pid = pid
	p.openPipes = 2
	p.pipes = []uint64{pipeInode(outR), pipeInode(errR)}
	p.stdin = stdinW
	if spec.TimeoutS > 0 {
		p.timer = time.AfterFunc(time.Duration(spec.TimeoutS)*time.Second, func() {
			p.mu.Lock()
			if p.status != nil || p.finished {
				p.mu.Unlock()
				return
			}
			p.timedOut, p.signalled = true, true
			p.mu.Unlock()
			p.killAll()
		})
	}
	p.mu.Unlock()
	go p.drain(outR, agentapi.FrameStdout)
	go p.drain(errR, agentapi.FrameStderr)
	return nil
}

// lookPath resolves argv0 like a shell would, returning 127 (not found) or
// 126 (not executable) on failure.
func lookPath(argv0, pathEnv, cwd string) (string, int, error) {
	check := func(p string) (int, error) {
		fi, err := os.Stat(p)
		if err != nil {
			return 127, fmt.Errorf("%s: %w", argv0, err)
		}
		if fi.IsDir() || fi.Mode()&0o111 == 0 {
			return 126, fmt.Errorf("%s: permission denied", argv0)
		}
		return 0, nil
	}
	if strings.Contains(argv0, "/") {
		p := argv0
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		code, err := check(p)
		return p, code, err
	}
	code := 127
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(cwd, dir)
		}
		p := filepath.Join(dir, argv0)
		c, err := check(p)
		if err == nil {
			return p, 0, nil
		}
		if c == 126 {
			code = 126
		}
	}
	if code == 126 {
		return "", 126, fmt.Errorf("%s: permission denied", argv0)
	}
	return "", 127, fmt.Errorf("%s: command not found", argv0)
}

func (a *Agent) proc(id string) (*process, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p, ok := a.procs[id]
	if !ok {
		if _, ok := a.gone[id]; ok {
			return nil, errorf(errGone, "process %s has finished and its record and output have been dropped", id)
		}
		return nil, errorf(errNotFound, "process %s not found", id)
	}
	return p, nil
}

func (a *Agent) handleStart(w http.ResponseWriter, r *http.Request) {
	var spec agentapi.ProcessSpec
	if err := readJSON(r, &spec); err != nil {
		writeError(w, err)
		return
	}
	p, err := a.start(spec)
	if err != nil {
		writeError(w, err)
		return
	}
	// Debug, and argv cut short: guest code starts commands at will, and
	// the agent's log is a file on the host.
	a.log.Debug("process started", "id", p.id, "pid", p.pid, "argv", logArgv(p.argv))
	writeJSON(w, http.StatusCreated, p.info())
}

func (a *Agent) handleList(w http.ResponseWriter, r *http.Request) {
	limit, err := pageLimit(r)
	if err != nil {
		writeError(w, err)
		return
	}
	var after processCursor
	if c := r.URL.Query().Get("after"); c != "" {
		if after, err = parseProcessCursor(c); err != nil {
			writeError(w, err)
			return
		}
	}
	a.mu.Lock()
	ps := make([]*process, 0, len(a.procs))
	for _, p := range a.procs {
		if after.id == "" || after.before(p.started, p.id) {
			ps = append(ps, p)
		}
	}
	a.mu.Unlock()
	sort.Slice(ps, func(i, j int) bool {
		if !ps[i].started.Equal(ps[j].started) {
			return ps[i].started.Before(ps[j].started)
		}
		return ps[i].id < ps[j].id
	})
	if len(ps) > limit+1 {
		ps = ps[:limit+1] // one more tells whether a next page exists
	}
	out := make([]agentapi.ProcessInfo, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.info())
	}
	writePage(w, out, limit, func(pi agentapi.ProcessInfo) string {
		return strconv.FormatInt(pi.StartedAt.UnixNano(), 10) + ":" + pi.ID
	})
}

// processCursor is a position in the process list: (start time, id).
type processCursor struct {
	started int64
	id      string
}

func parseProcessCursor(s string) (processCursor, error) {
	ns, id, ok := strings.Cut(s, ":")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || id == "" {
		return processCursor{}, errorf(errInvalid, "cursor %q is not one this agent handed out", s)
	}
	return processCursor{started: n, id: id}, nil
}

// before reports whether the cursor sorts before the process (started, id).
func (c processCursor) before(started time.Time, id string) bool {
	n := started.UnixNano()
	return c.started < n || (c.started == n && c.id < id)
}

func (a *Agent) handleGet(w http.ResponseWriter, r *http.Request) {
	p, err := a.proc(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, p.info())
}

func (a *Agent) handleOutput(w http.ResponseWriter, r *http.Request) {
	p, err := a.proc(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	var offset int64
	if s := r.URL.Query().Get("offset"); s != "" {
		if offset, err = strconv.ParseInt(s, 10, 64); err != nil || offset < 0 {
			writeError(w, errorf(errInvalid, "offset %q is not a non-negative integer", s))
			return
		}
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush() // send the headers now: output may take a while
	bw := bufio.NewWriterSize(w, 256<<10)
	for {
		res := p.out.read(offset, 1<<20)
		if res.tooOld {
			_ = agentapi.WriteFrame(bw, agentapi.FrameError, fmt.Appendf(nil,
				`{"message":"output at offset %d was dropped; the earliest retained offset is %d"}`, offset, res.start))
			_ = bw.Flush()
			return
		}
		for _, c := range res.chunks {
			kind := c.kind
			if kind == OutputPTY {
				kind = agentapi.FrameStdout // a terminal's output is one stream
			}
			if err := agentapi.WriteFrame(bw, kind, c.data); err != nil {
				return
			}
		}
		offset = res.next
		if res.done {
			payload, _ := json.Marshal(res.exit)
			_ = agentapi.WriteFrame(bw, agentapi.FrameExit, payload)
			_ = bw.Flush()
			_ = rc.Flush()
			return
		}
		if len(res.chunks) > 0 {
			if bw.Flush() != nil || rc.Flush() != nil {
				return
			}
			continue
		}
		select {
		case <-res.wait:
		case <-r.Context().Done():
			return
		}
	}
}

func (a *Agent) handleStdin(w http.ResponseWriter, r *http.Request) {
	p, err := a.proc(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	closeAfter := r.URL.Query().Get("close") == "1"
	if err := p.writeStdin(r.Context(), r.Body, closeAfter); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// writeStdin streams body into the process's stdin.
func (p *process) writeStdin(ctx context.Context, body io.Reader, closeAfter bool) error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	f := p.stdin
	if f == nil {
		return errorf(errConflict, "process %s has no open stdin", p.id)
	}
	stop := context.AfterFunc(ctx, func() { _ = f.SetWriteDeadline(time.Now()) })
	defer func() {
		if stop() {
			return
		}
		_ = f.SetWriteDeadline(time.Time{})
	}()
	buf := make([]byte, 256<<10)
	_, err := io.CopyBuffer(struct{ io.Writer }{f}, struct{ io.Reader }{body}, buf)
	if err != nil {
		if errors.Is(err, syscall.EPIPE) || errors.Is(err, os.ErrClosed) {
			return errorf(errConflict, "process %s closed its stdin", p.id)
		}
		return fmt.Errorf("write stdin of process %s: %w", p.id, err)
	}
	if closeAfter {
		p.stdin = nil
		if err := f.Close(); err != nil {
			return fmt.Errorf("close stdin of process %s: %w", p.id, err)
		}
	}
	return nil
}

func (a *Agent) handleCloseStdin(w http.ResponseWriter, r *http.Request) {
	p, err := a.proc(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	p.closeStdin()
	w.WriteHeader(http.StatusNoContent)
}

func (a *Agent) handleSignal(w http.ResponseWriter, r *http.Request) {
	p, err := a.proc(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	var s agentapi.Signal
	if err := readJSON(r, &s); err != nil {
		writeError(w, err)
		return
	}
	sig, err := parseSignal(s.Signal)
	if err != nil {
		writeError(w, err)
		return
	}
	if err := p.signal(sig); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleResize sets the terminal size of a process started with a PTY.
func (a *Agent) handleResize(w http.ResponseWriter, r *http.Request) {
	p, err := a.proc(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	var s agentapi.PTYSize
	if err := readJSON(r, &s); err != nil {
		writeError(w, err)
		return
	}
	if err := s.Validate(); err != nil {
		writeError(w, errorf(errInvalid, "%v", err))
		return
	}
	if err := (&Proc{p: p}).Resize(Winsize{Rows: uint16(s.Rows), Cols: uint16(s.Cols)}); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
