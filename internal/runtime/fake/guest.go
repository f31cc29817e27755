package fake

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
)

// guest is one fake sandbox's inside: its filesystem, hostname and
// process table, served as the agentapi contract by handler.
type guest struct {
	mu       sync.Mutex
	fs       *guestFS
	hostname string
	boot     time.Time
	nextPID  int
	procs    map[string]*proc
	// thawed is closed while the guest runs; a paused guest holds a fresh
	// open channel that Resume closes.
	thawed chan struct{}
	paused bool
	// ctx ends when the guest stops (Delete, or a checkpoint that stops it).
	ctx  context.Context
	stop context.CancelFunc
}

func newGuest(fsys *guestFS, hostname string, nextPID int) *guest {
	ctx, stop := context.WithCancel(context.Background())
	thawed := make(chan struct{})
	close(thawed)
	return &guest{fs: fsys, hostname: hostname, boot: time.Now(), nextPID: nextPID, procs: map[string]*proc{}, thawed: thawed, ctx: ctx, stop: stop}
}

// proc is one process: a program run in its own goroutine, its combined
// output kept whole.
type proc struct {
	info    agentapi.ProcessInfo
	chunks  []chunk
	size    int64
	exit    *agentapi.Exit
	changed chan struct{} // closed and replaced on every output or exit
	cancel  context.CancelFunc
	signal  string
}

type chunk struct {
	kind byte
	data []byte
}

// pause freezes the guest: requests wait until resume.
func (g *guest) pause() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.paused {
		g.paused = true
		g.thawed = make(chan struct{})
	}
}

func (g *guest) resume() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.paused {
		g.paused = false
		close(g.thawed)
	}
}

// wait blocks while the guest is paused; false once it stopped or ctx ended.
func (g *guest) wait(ctx context.Context) bool {
	g.mu.Lock()
	th := g.thawed
	g.mu.Unlock()
	select {
	case <-th:
		return g.ctx.Err() == nil
	case <-ctx.Done():
		return false
	case <-g.ctx.Done():
		return false
	}
}

func userName(uid int) string {
	if uid == 0 {
		return "root"
	}
	return agentapi.DefaultUser
}

func userID(name string) (int, error) {
	switch name {
	case "root":
		return 0, nil
	case "", agentapi.DefaultUser:
		return agentapi.DefaultUID, nil
	}
	return 0, errorf(errInvalid, "unknown user %q (the fake runtime knows root and %s)", name, agentapi.DefaultUser)
}

func (g *guest) resolve(p string) string {
	if !strings.HasPrefix(p, "/") {
		p = path.Join(agentapi.DefaultHome, p)
	}
	return clean(p)
}

// handler serves the agentapi endpoints (see internal/agentapi) of g.
func (g *guest) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, agentapi.Health{Version: agentapi.Version, PID: 1, Boot: g.boot})
	})
	mux.HandleFunc("POST /processes", g.startProcess)
	mux.HandleFunc("GET /processes", g.listProcesses)
	mux.HandleFunc("GET /processes/{id}", func(w http.ResponseWriter, r *http.Request) {
		p, err := g.proc(r.PathValue("id"))
		if err != nil {
			writeError(w, err)
			return
		}
		g.mu.Lock()
		info := p.info
		g.mu.Unlock()
		writeJSON(w, http.StatusOK, info)
	})
	mux.HandleFunc("GET /processes/{id}/output", g.output)
	mux.HandleFunc("POST /processes/{id}/stdin", func(w http.ResponseWriter, r *http.Request) {
		if _, err := g.proc(r.PathValue("id")); err != nil {
			writeError(w, err)
			return
		}
		io.Copy(io.Discard, r.Body) // the fake's programs read no stdin
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /processes/{id}/close-stdin", func(w http.ResponseWriter, r *http.Request) {
		if _, err := g.proc(r.PathValue("id")); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /processes/{id}/signal", g.signal)
	mux.HandleFunc("GET /files/content", g.readFile)
	mux.HandleFunc("PUT /files/content", g.writeFile)
	mux.HandleFunc("GET /files/stat", func(w http.ResponseWriter, r *http.Request) {
		p := g.resolve(r.URL.Query().Get("path"))
		g.mu.Lock()
		fi, err := g.stat(p)
		g.mu.Unlock()
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, fi)
	})
	mux.HandleFunc("GET /files/list", g.listFiles)
	mux.HandleFunc("POST /files/mkdir", g.mkdir)
	mux.HandleFunc("POST /files/move", g.move)
	mux.HandleFunc("DELETE /files", func(w http.ResponseWriter, r *http.Request) {
		p := g.resolve(r.URL.Query().Get("path"))
		g.mu.Lock()
		err := g.fs.remove(p, r.URL.Query().Get("recursive") == "1")
		g.mu.Unlock()
		if err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errorf(errNotFound, "%s %s: not served by the fake runtime's agent (no envd, no port proxy)", r.Method, r.URL.Path))
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.wait(r.Context()) {
			writeError(w, errors.New("the sandbox stopped"))
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	status, code := http.StatusInternalServerError, "internal"
	switch {
	case errors.Is(err, errNotFound):
		status, code = http.StatusNotFound, "not_found"
	case errors.Is(err, errInvalid):
		status, code = http.StatusBadRequest, "invalid"
	case errors.Is(err, errConflict):
		status, code = http.StatusConflict, "conflict"
	}
	var body agentapi.Error
	body.Error.Code, body.Error.Message = code, err.Error()
	writeJSON(w, status, body)
}

func readJSON(r *http.Request, v any) error {
	if err := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<20)).Decode(v); err != nil {
		return errorf(errInvalid, "decode request body: %v", err)
	}
	return nil
}

func parseMode(s string, def fs.FileMode) (fs.FileMode, error) {
	if s == "" {
		return def, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, errorf(errInvalid, "mode %q is not octal permission bits", s)
	}
	return fs.FileMode(m), nil
}

// stat describes p; callers hold g.mu.
func (g *guest) stat(p string) (agentapi.FileInfo, error) {
	e, err := g.fs.lookup(p)
	if err != nil {
		return agentapi.FileInfo{}, err
	}
	fi := agentapi.FileInfo{Path: p, Name: path.Base(p), Type: "file", Mode: fmt.Sprintf("%04o", e.Mode), UID: e.UID, GID: e.UID, Owner: userName(e.UID), ModTime: e.MTime}
	switch {
	case e.link != "":
		fi.Type, fi.Target = "symlink", e.link
	case e.Dir:
		fi.Type = "dir"
	default:
		if e.fromLower {
			b, _ := g.fs.read(p)
			fi.Size = int64(len(b))
		} else {
			fi.Size = int64(len(e.Data))
		}
	}
	return fi, nil
}

func (g *guest) readFile(w http.ResponseWriter, r *http.Request) {
	p := g.resolve(r.URL.Query().Get("path"))
	g.mu.Lock()
	b, err := g.fs.read(p)
	fi, serr := g.stat(p)
	g.mu.Unlock()
	if err = errors.Join(err, serr); err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("X-Airlock-Mode", fi.Mode)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.Write(b)
}

func (g *guest) writeFile(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p := g.resolve(q.Get("path"))
	mode, err := parseMode(q.Get("mode"), 0o644)
	if err != nil {
		writeError(w, err)
		return
	}
	uid, err := userID(q.Get("owner"))
	if err != nil {
		writeError(w, err)
		return
	}
	data, err := io.ReadAll(r.Body)
	if err != nil {
		writeError(w, fmt.Errorf("read body: %w", err))
		return
	}
	g.mu.Lock()
	err = g.fs.mkdirAll(path.Dir(p), 0o755, uid)
	if err == nil {
		err = g.fs.write(p, data, mode, uid)
	}
	var fi agentapi.FileInfo
	if err == nil {
		fi, err = g.stat(p)
	}
	g.mu.Unlock()
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, fi)
}

func (g *guest) listFiles(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p := g.resolve(q.Get("path"))
	limit, _ := strconv.Atoi(q.Get("limit"))
	if limit <= 0 || limit > agentapi.MaxPageEntries {
		limit = agentapi.MaxPageEntries
	}
	after := q.Get("after")
	g.mu.Lock()
	defer g.mu.Unlock()
	names, err := g.fs.list(p)
	if err != nil {
		writeError(w, err)
		return
	}
	out := []agentapi.FileInfo{}
	for _, n := range names {
		if after != "" && n <= after {
			continue
		}
		if len(out) == limit {
			w.Header().Set(agentapi.NextCursorHeader, out[len(out)-1].Name)
			break
		}
		fi, err := g.stat(path.Join(p, n))
		if err == nil {
			out = append(out, fi)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (g *guest) mkdir(w http.ResponseWriter, r *http.Request) {
	var req agentapi.Mkdir
	if err := readJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	mode, err := parseMode(req.Mode, 0o755)
	if err != nil {
		writeError(w, err)
		return
	}
	uid, err := userID(req.Owner)
	if err != nil {
		writeError(w, err)
		return
	}
	p := g.resolve(req.Path)
	g.mu.Lock()
	err = g.fs.mkdirAll(p, mode, uid)
	var fi agentapi.FileInfo
	if err == nil {
		fi, err = g.stat(p)
	}
	g.mu.Unlock()
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, fi)
}

func (g *guest) move(w http.ResponseWriter, r *http.Request) {
	var req agentapi.Move
	if err := readJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	to := g.resolve(req.To)
	g.mu.Lock()
	err := g.fs.move(g.resolve(req.From), to)
	var fi agentapi.FileInfo
	if err == nil {
		fi, err = g.stat(to)
	}
	g.mu.Unlock()
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, fi)
}

func (g *guest) proc(id string) (*proc, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p, ok := g.procs[id]
	if !ok {
		return nil, errorf(errNotFound, "process %q not found", id)
	}
	return p, nil
}

func (g *guest) startProcess(w http.ResponseWriter, r *http.Request) {
	var spec agentapi.ProcessSpec
	if err := readJSON(r, &spec); err != nil {
		writeError(w, err)
		return
	}
	if spec.ID == "" || len(spec.Argv) == 0 {
		writeError(w, errorf(errInvalid, "a process needs an id and an argv"))
		return
	}
	uid, err := userID(spec.User)
	if err != nil {
		writeError(w, err)
		return
	}
	cwd := agentapi.DefaultHome
	if uid == 0 {
		cwd = "/root"
	}
	if spec.Cwd != "" {
		cwd = g.resolve(spec.Cwd)
	}
	ctx, cancel := context.WithCancel(g.ctx)
	if spec.TimeoutS > 0 {
		ctx, cancel = context.WithTimeout(g.ctx, time.Duration(spec.TimeoutS)*time.Second)
	}
	g.mu.Lock()
	if _, dup := g.procs[spec.ID]; dup {
		g.mu.Unlock()
		cancel()
		writeError(w, errorf(errConflict, "process %q exists", spec.ID))
		return
	}
	p := &proc{info: agentapi.ProcessInfo{ID: spec.ID, PID: g.nextPID, Argv: slices.Clone(spec.Argv), Running: true, StartedAt: time.Now()},
		changed: make(chan struct{}), cancel: cancel}
	g.nextPID++
	g.procs[spec.ID] = p
	info := p.info
	g.mu.Unlock()

	prog, ok := lookupProgram(spec.Argv[0])
	go func() {
		defer cancel()
		exit := agentapi.Exit{}
		switch {
		case !ok:
			exit.ExitCode, exit.Error = -1, fmt.Sprintf("exec %s: not found (runtime/fake runs only its built-in programs)", spec.Argv[0])
		case !g.wait(ctx): // the sandbox stopped while paused
			exit.ExitCode, exit.Signal = -1, "KILL"
		default:
			e := &env{ctx: ctx, g: g, uid: uid, cwd: cwd, stdout: &procWriter{g, p, agentapi.FrameStdout}, stderr: &procWriter{g, p, agentapi.FrameStderr}}
			exit.ExitCode = prog(e, spec.Argv[1:])
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		switch {
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			exit = agentapi.Exit{ExitCode: -1, Signal: "KILL", TimedOut: true}
		case p.signal != "":
			exit = agentapi.Exit{ExitCode: -1, Signal: p.signal}
		}
		now := time.Now()
		p.exit = &exit
		p.info.Running, p.info.EndedAt = false, &now
		code := exit.ExitCode
		p.info.ExitCode = &code
		close(p.changed)
		p.changed = make(chan struct{})
	}()
	writeJSON(w, http.StatusCreated, info)
}

// procWriter appends a program's output to its process.
type procWriter struct {
	g    *guest
	p    *proc
	kind byte
}

func (w *procWriter) Write(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	w.g.mu.Lock()
	defer w.g.mu.Unlock()
	w.p.chunks = append(w.p.chunks, chunk{w.kind, bytes.Clone(b)})
	w.p.size += int64(len(b))
	w.p.info.OutputBytes = w.p.size
	close(w.p.changed)
	w.p.changed = make(chan struct{})
	return len(b), nil
}

func (g *guest) listProcesses(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	out := make([]agentapi.ProcessInfo, 0, len(g.procs))
	for _, p := range g.procs {
		out = append(out, p.info)
	}
	g.mu.Unlock()
	slices.SortFunc(out, func(a, b agentapi.ProcessInfo) int { return strings.Compare(a.ID, b.ID) })
	writeJSON(w, http.StatusOK, out)
}

// output streams frames from combined output offset: the kept output,
// then live output, then FrameExit.
func (g *guest) output(w http.ResponseWriter, r *http.Request) {
	p, err := g.proc(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	off, _ := strconv.ParseInt(r.URL.Query().Get("offset"), 10, 64)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	sent := 0 // chunks sent
	var pos int64
	for {
		g.mu.Lock()
		chunks := p.chunks[sent:]
		exit := p.exit
		changed := p.changed
		g.mu.Unlock()
		for _, c := range chunks {
			d := c.data
			if pos+int64(len(d)) <= off {
				pos += int64(len(d))
				continue
			}
			if pos < off {
				d = d[off-pos:]
			}
			pos += int64(len(c.data))
			if agentapi.WriteFrame(w, c.kind, d) != nil {
				return
			}
		}
		sent += len(chunks)
		if exit != nil && len(chunks) == 0 {
			b, _ := json.Marshal(exit)
			agentapi.WriteFrame(w, agentapi.FrameExit, b)
			return
		}
		if fl != nil {
			fl.Flush()
		}
		if exit != nil {
			continue // send what came before the exit first
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		}
	}
}

func (g *guest) signal(w http.ResponseWriter, r *http.Request) {
	p, err := g.proc(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	var s agentapi.Signal
	if err := readJSON(r, &s); err != nil {
		writeError(w, err)
		return
	}
	sig := strings.TrimPrefix(strings.ToUpper(s.Signal), "SIG")
	switch sig {
	case "KILL", "TERM", "INT", "HUP", "QUIT":
	default:
		writeError(w, errorf(errInvalid, "signal %q: the fake runtime's processes take KILL, TERM, INT, HUP and QUIT", s.Signal))
		return
	}
	g.mu.Lock()
	if p.exit == nil {
		p.signal = sig
	}
	g.mu.Unlock()
	p.cancel()
	w.WriteHeader(http.StatusNoContent)
}
