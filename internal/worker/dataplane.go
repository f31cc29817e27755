package worker

// The data plane: what clients reach directly on the worker, never through
// the server. Every route but /healthz needs a data-plane token (header
// "Authorization: Bearer <token>" or ?token=) signed by the server for the
// sandbox in the path.
//
//	GET    /healthz                                          → 200
//	GET    /v1/sandboxes/{sid}/commands/{cid}/attach?offset=N  WebSocket (scope command)
//	GET    /v1/sandboxes/{sid}/commands?limit=&cursor=       → {"commands": [agentapi.ProcessInfo], "next_cursor"} (scope files)
//	GET    /v1/sandboxes/{sid}/files/content?path=P          → raw bytes, Content-Length, X-Airlock-Mode
//	PUT    /v1/sandboxes/{sid}/files/content?path=P&mode=&owner=  raw body → agentapi.FileInfo
//	GET    /v1/sandboxes/{sid}/files/stat?path=P             → agentapi.FileInfo
//	GET    /v1/sandboxes/{sid}/files/list?path=P&limit=&cursor= → {"entries": [agentapi.FileInfo], "next_cursor"}
//	POST   /v1/sandboxes/{sid}/files/mkdir  agentapi.Mkdir   → agentapi.FileInfo
//	POST   /v1/sandboxes/{sid}/files/move   agentapi.Move    → agentapi.FileInfo
//	DELETE /v1/sandboxes/{sid}/files?path=P&recursive=1      → 204
//
// The two lists answer one page each (at most agentapi.MaxPageEntries
// entries, fewer with ?limit=N, and about agentapi.MaxPageBytes): when more
// remain, next_cursor is set and ?cursor=<it> asks for the next page. The
// worker holds one page of what the guest says at a time.
//
// Errors are {"error":{"code","message"}} with the HTTP status from
// writeError, the one place model errors become wire codes.
//
// Attach protocol: each WebSocket message is one binary frame, a kind byte
// (agentapi.Frame*) then the payload. The worker sends FrameStarted (JSON
// ProcessInfo) on every attach, then the output from the combined offset N
// (FrameStdout, FrameStderr), then FrameExit (JSON Exit) and a normal
// close; FrameError (JSON {"message"}) ends the stream on failure. The
// client sends FrameStdin, FrameStdinClose, FrameSignal (JSON Signal) and
// FrameResize (JSON PTYSize, for a PTY command).
// The first attach starts the process; a dropped attachment leaves it
// running. An attach of a command that already ran but whose record the
// agent dropped (after MaxFinished newer ones, or a rollback to a
// checkpoint from before it) answers 410 Gone and never runs it again.
//
// A request for a paused or suspended sandbox asks the server to wake it
// and waits until it runs (at most WakeWaitTimeout); one for a sandbox in
// transition (starting, suspending, waking) waits until it settles. A
// refused wake fails the request with the server's message (409). An
// attachment open when its sandbox is suspended ends with close code 1013
// (try again later) and no error frame: re-attaching from the offset
// reached waits for the wake and continues the output.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/httperr"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/tracing"
	"github.com/airlock/airlock/internal/workerapi"
)

// copyBufSize is the buffer for streaming file bodies.
const copyBufSize = 1 << 20

var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

// Handler returns the data-plane HTTP handler.
func (w *Worker) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(rw, `{"status":"ok"}`)
	})
	mux.HandleFunc(workerapi.RouteAttach, w.handleAttach)
	mux.HandleFunc(workerapi.RouteListCommands, w.files(w.handleListCommands))
	mux.HandleFunc(workerapi.RouteNetworkLog, w.handleNetworkLog) // netlog.go
	mux.HandleFunc("GET /v1/sandboxes/{sid}/files/content", w.files(w.handleRead))
	mux.HandleFunc("PUT /v1/sandboxes/{sid}/files/content", w.files(w.handleWrite))
	mux.HandleFunc("GET /v1/sandboxes/{sid}/files/stat", w.files(w.handleStat))
	mux.HandleFunc("GET /v1/sandboxes/{sid}/files/list", w.files(w.handleList))
	mux.HandleFunc("POST /v1/sandboxes/{sid}/files/mkdir", w.files(w.handleMkdir))
	mux.HandleFunc("POST /v1/sandboxes/{sid}/files/move", w.files(w.handleMove))
	mux.HandleFunc("DELETE /v1/sandboxes/{sid}/files", w.files(w.handleRemove))
	mux.HandleFunc("OPTIONS /v1/sandboxes/{sid}/files", corsPreflight)
	mux.HandleFunc("OPTIONS /v1/sandboxes/{sid}/files/{op}", corsPreflight)
	mux.HandleFunc("OPTIONS /v1/sandboxes/{sid}/commands", corsPreflight)
	mux.HandleFunc(workerapi.RouteBuild, w.handleBuild)                   // build.go
	mux.HandleFunc(workerapi.RouteTemplateImport, w.handleTemplateImport) // build.go
	w.snapshotHandlers(mux)                                               // snapshots.go
	w.registerE2B(mux)                                                    // E2B envd and sandbox ports (envd.go)
	mux.HandleFunc("/", func(rw http.ResponseWriter, r *http.Request) {
		writeError(rw, model.Errorf(model.ErrNotFound, "no route %s %s", r.Method, r.URL.Path))
	})
	// Server spans named by route, continuing the caller's trace (the
	// server's data-plane calls send it); no-op without tracing.
	return tracing.Middleware(w.cfg.Tracer, true, mux)
}

// authorize verifies the request's token for the path's sandbox and scope.
func (w *Worker) authorize(r *http.Request, scope string) (token.Claims, error) {
	kp := w.key.Load()
	if kp == nil {
		return token.Claims{}, model.Errorf(model.ErrUnavailable, "worker is not registered with a server yet")
	}
	tok := r.URL.Query().Get("token")
	if t, ok := protocolToken(r); ok {
		tok = t
	}
	if h := r.Header.Get("Authorization"); h != "" {
		if t, ok := strings.CutPrefix(h, "Bearer "); ok {
			tok = strings.TrimSpace(t)
		}
	}
	if tok == "" {
		return token.Claims{}, model.Errorf(model.ErrUnauthorized, "missing data-plane token (Authorization: Bearer, ?token=, or the WebSocket subprotocol "+TokenProtocolPrefix+"<token>)")
	}
	c, err := token.Verify(*kp, tok, time.Now())
	if err != nil {
		return token.Claims{}, model.Errorf(model.ErrUnauthorized, "data-plane token is invalid or expired; ask the server for a new one")
	}
	if c.SandboxID != r.PathValue("sid") {
		return token.Claims{}, model.Errorf(model.ErrForbidden, "token is for another sandbox")
	}
	if c.Scope != scope {
		return token.Claims{}, model.Errorf(model.ErrForbidden, "token scope %q does not allow this (needs %q)", c.Scope, scope)
	}
	return c, nil
}

// WebSocket subprotocols of the attach route: a browser offers
// AttachProtocol and TokenProtocolPrefix+token (RFC 6455 subprotocols are
// HTTP tokens; a data-plane token, "v1.<base64url>.<base64url>", is one),
// and the worker selects AttachProtocol.
const (
	AttachProtocol      = "airlock.v1"
	TokenProtocolPrefix = "airlock.token."
)

// protocolToken returns the token a WebSocket handshake carries in
// Sec-WebSocket-Protocol as TokenProtocolPrefix+token.
func protocolToken(r *http.Request) (string, bool) {
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(h, ",") {
			if t, ok := strings.CutPrefix(strings.TrimSpace(p), TokenProtocolPrefix); ok && t != "" {
				return t, true
			}
		}
	}
	return "", false
}

// corsFiles lets pages of any origin read the answers of the files routes
// and the commands list. It is safe to open to every origin because these
// routes authorize by the bearer token in Authorization alone: the worker
// sets and reads no cookie, so a page gets nothing it could not get with
// the token anyway (credentials mode stays off: no
// Access-Control-Allow-Credentials).
func corsFiles(rw http.ResponseWriter) {
	h := rw.Header()
	h.Set("Access-Control-Allow-Origin", "*")
	h.Set("Access-Control-Expose-Headers", "Content-Length, Content-Type, X-Airlock-Mode")
}

// corsPreflight answers a browser's preflight of the files routes.
func corsPreflight(rw http.ResponseWriter, r *http.Request) {
	corsFiles(rw)
	h := rw.Header()
	h.Set("Access-Control-Allow-Methods", "GET, PUT, POST, DELETE")
	h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type")
	h.Set("Access-Control-Max-Age", "600")
	rw.WriteHeader(http.StatusNoContent)
}

type filesHandler func(rw http.ResponseWriter, r *http.Request, ac *agentclient.Client) error

// files wraps a files-scoped handler: authorization, agent lookup, errors.
func (w *Worker) files(h filesHandler) http.HandlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) {
		corsFiles(rw)
		if _, err := w.authorize(r, token.ScopeFiles); err != nil {
			writeError(rw, err)
			return
		}
		sid := r.PathValue("sid")
		ac, _, err := w.awaitAgent(r.Context(), sid)
		if err != nil {
			writeError(rw, err)
			return
		}
		defer w.touch(sid) // long transfers count until they end
		if err := h(rw, r, ac); err != nil {
			w.log.Debug("data plane request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			writeError(rw, err)
		}
	}
}

// errHeadersSent marks an error after the response started: nothing to write.
var errHeadersSent = errors.New("response already started")

// writeError answers a data-plane request's error (internal/httperr); a
// transport failure talking to the agent is unavailable.
func writeError(rw http.ResponseWriter, err error) {
	if errors.Is(err, errHeadersSent) {
		return
	}
	if httperr.Kind(err) == nil && isUnreachable(err) {
		err = model.Errorf(model.ErrUnavailable, "%w", err)
	}
	httperr.Write(rw, err)
}

// isUnreachable reports a transport failure talking to the agent.
func isUnreachable(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, net.ErrClosed)
}

func writeJSON(rw http.ResponseWriter, status int, v any) {
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(status)
	_ = json.NewEncoder(rw).Encode(v)
}

func pathParam(r *http.Request) (string, error) {
	p := r.URL.Query().Get("path")
	if p == "" {
		return "", model.Errorf(model.ErrInvalid, "path is required")
	}
	return p, nil
}

// pageParams reads ?limit= and ?cursor= of a list request.
func pageParams(r *http.Request) (limit int, cursor string, err error) {
	q := r.URL.Query()
	if s := q.Get("limit"); s != "" {
		if limit, err = strconv.Atoi(s); err != nil || limit <= 0 {
			return 0, "", model.Errorf(model.ErrInvalid, "limit must be a positive integer (at most %d entries are answered at once)", agentapi.MaxPageEntries)
		}
	}
	return limit, q.Get("cursor"), nil
}

func (w *Worker) handleListCommands(rw http.ResponseWriter, r *http.Request, ac *agentclient.Client) error {
	limit, cursor, err := pageParams(r)
	if err != nil {
		return err
	}
	ps, next, err := ac.ListProcessesPage(r.Context(), limit, cursor)
	if err != nil {
		return fmt.Errorf("list processes: %w", err)
	}
	if ps == nil {
		ps = []agentapi.ProcessInfo{}
	}
	writeJSON(rw, http.StatusOK, listCommandsPage{Commands: ps, NextCursor: next})
	return nil
}

type listCommandsPage struct {
	Commands   []agentapi.ProcessInfo `json:"commands"`
	NextCursor string                 `json:"next_cursor,omitempty"`
}

type listEntriesPage struct {
	Entries    []agentapi.FileInfo `json:"entries"`
	NextCursor string              `json:"next_cursor,omitempty"`
}

func (w *Worker) handleRead(rw http.ResponseWriter, r *http.Request, ac *agentclient.Client) error {
	p, err := pathParam(r)
	if err != nil {
		return err
	}
	f, fi, err := ac.ReadFile(r.Context(), p)
	if err != nil {
		return fmt.Errorf("read %s: %w", p, err)
	}
	defer f.Close()
	h := rw.Header()
	h.Set("Content-Type", "application/octet-stream")
	if fi.Size >= 0 {
		h.Set("Content-Length", strconv.FormatInt(fi.Size, 10))
	}
	if fi.Mode != "" {
		h.Set("X-Airlock-Mode", fi.Mode)
	}
	rw.WriteHeader(http.StatusOK)
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	// Hide ReaderFrom/WriterTo so the large buffer is used (the response's
	// ReadFrom would copy in 32 KiB pieces).
	n, err := io.CopyBuffer(struct{ io.Writer }{rw}, struct{ io.Reader }{f}, *bp)
	w.observer().DataPlane("file", "out", n)
	if err != nil {
		w.log.Debug("stream file", "path", p, "err", err)
	}
	return nil
}

func (w *Worker) handleWrite(rw http.ResponseWriter, r *http.Request, ac *agentclient.Client) error {
	p, err := pathParam(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	body := &countReader{r: r.Body}
	fi, err := ac.WriteFile(r.Context(), p, q.Get("mode"), q.Get("owner"), fillReader{body})
	w.observer().DataPlane("file", "in", body.n)
	if err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	writeJSON(rw, http.StatusOK, fi)
	return nil
}

// fillReader fills the caller's buffer before returning, so that the agent
// gets few large DATA frames (each one costs a guest syscall) instead of one
// per TCP read. A file upload is committed at its end anyway, so waiting for
// a full buffer delays nothing that matters.
type fillReader struct{ r io.Reader }

func (f fillReader) Read(p []byte) (int, error) {
	// Not io.ReadFull: it would turn a body cut short (io.ErrUnexpectedEOF
	// from net/http) into something that looks like a clean end.
	n := 0
	for n < len(p) {
		m, err := f.r.Read(p[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (w *Worker) handleStat(rw http.ResponseWriter, r *http.Request, ac *agentclient.Client) error {
	p, err := pathParam(r)
	if err != nil {
		return err
	}
	fi, err := ac.Stat(r.Context(), p)
	if err != nil {
		return fmt.Errorf("stat %s: %w", p, err)
	}
	writeJSON(rw, http.StatusOK, fi)
	return nil
}

func (w *Worker) handleList(rw http.ResponseWriter, r *http.Request, ac *agentclient.Client) error {
	p, err := pathParam(r)
	if err != nil {
		return err
	}
	limit, cursor, err := pageParams(r)
	if err != nil {
		return err
	}
	es, next, err := ac.ListPage(r.Context(), p, limit, cursor)
	if err != nil {
		return fmt.Errorf("list %s: %w", p, err)
	}
	if es == nil {
		es = []agentapi.FileInfo{}
	}
	writeJSON(rw, http.StatusOK, listEntriesPage{Entries: es, NextCursor: next})
	return nil
}

func decodeBody(r *http.Request, v any) error {
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(v); err != nil {
		return model.Errorf(model.ErrInvalid, "decode request body: %v", err)
	}
	return nil
}

func (w *Worker) handleMkdir(rw http.ResponseWriter, r *http.Request, ac *agentclient.Client) error {
	var m agentapi.Mkdir
	if err := decodeBody(r, &m); err != nil {
		return err
	}
	fi, err := ac.Mkdir(r.Context(), m)
	if err != nil {
		return fmt.Errorf("mkdir %s: %w", m.Path, err)
	}
	writeJSON(rw, http.StatusOK, fi)
	return nil
}

func (w *Worker) handleMove(rw http.ResponseWriter, r *http.Request, ac *agentclient.Client) error {
	var m agentapi.Move
	if err := decodeBody(r, &m); err != nil {
		return err
	}
	fi, err := ac.Move(r.Context(), m.From, m.To)
	if err != nil {
		return fmt.Errorf("move %s to %s: %w", m.From, m.To, err)
	}
	writeJSON(rw, http.StatusOK, fi)
	return nil
}

func (w *Worker) handleRemove(rw http.ResponseWriter, r *http.Request, ac *agentclient.Client) error {
	p, err := pathParam(r)
	if err != nil {
		return err
	}
	rec := r.URL.Query().Get("recursive")
	if err := ac.Remove(r.Context(), p, rec == "1" || rec == "true"); err != nil {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	rw.WriteHeader(http.StatusNoContent)
	return nil
}

// ---- attach ----

func (w *Worker) handleAttach(rw http.ResponseWriter, r *http.Request) {
	claims, err := w.authorize(r, token.ScopeCommand)
	if err != nil {
		writeError(rw, err)
		return
	}
	sid, cid := r.PathValue("sid"), r.PathValue("cid")
	if claims.Command == nil || claims.Command.ID != cid {
		writeError(rw, model.Errorf(model.ErrForbidden, "token is for another command"))
		return
	}
	var offset int64
	if s := r.URL.Query().Get("offset"); s != "" {
		if offset, err = strconv.ParseInt(s, 10, 64); err != nil || offset < 0 {
			writeError(rw, model.Errorf(model.ErrInvalid, "offset must be a non-negative integer"))
			return
		}
	}
	ac, env, err := w.awaitAgent(r.Context(), sid)
	if err == nil && claims.Command.SandboxEnv != "" && model.EnvDigest(env) != claims.Command.SandboxEnv {
		env, err = w.awaitEnv(r.Context(), sid, claims.Command.SandboxEnv)
	}
	if err != nil {
		writeError(rw, err)
		return
	}
	info, err := w.ensureProcess(r.Context(), ac, sid, *claims.Command, env)
	if err != nil {
		writeError(rw, err)
		return
	}
	conn, err := websocket.Accept(rw, r, &websocket.AcceptOptions{
		// Any origin: the token authorizes, no cookie exists (see corsFiles).
		InsecureSkipVerify: true,
		Subprotocols:       []string{AttachProtocol},
	})
	if err != nil {
		w.log.Debug("websocket accept", "err", err)
		return
	}
	conn.SetReadLimit(agentapi.MaxFramePayload + 1)
	defer conn.CloseNow()
	w.attaches.Add(1)
	defer w.attaches.Done()
	w.attach(r.Context(), conn, ac, sid, cid, info, offset)
}

// MaxStartedCommands bounds the ids of started commands the worker keeps
// per sandbox (oldest dropped first); see startedCommands.
const MaxStartedCommands = 8192

// startedCommands is the worker's own record of the commands it started in
// each sandbox. The agent remembers the ids of the processes it forgot
// (tombstones), but its memory is the guest's: a rollback to a checkpoint
// taken before a command started brings back an agent that never heard of
// it, and a late attach with that command's token would run it again. With
// this record such an attach gets 410 Gone. It lives as long as the worker
// process (a worker restart forgets it; the agent's tombstones remain).
type startedCommands struct {
	mu  sync.Mutex
	sbs map[string]*cmdRing
}

type cmdRing struct {
	ids  map[string]struct{}
	ring []string
	next int
}

func (w *Worker) started() *startedCommands { return &w.cmds }

func (s *startedCommands) has(sid, cid string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.sbs[sid]
	if r == nil {
		return false
	}
	_, ok := r.ids[cid]
	return ok
}

// add records cid as started in sid; live lists the sandboxes the worker
// still has, so that the records of deleted ones are dropped.
func (s *startedCommands) add(sid, cid string, live func() map[string]bool) {
	s.mu.Lock()
	n := len(s.sbs)
	s.mu.Unlock()
	var keep map[string]bool
	if n > 64 {
		keep = live()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if keep != nil && len(s.sbs) > 2*len(keep)+32 {
		for id := range s.sbs {
			if !keep[id] && id != sid {
				delete(s.sbs, id)
			}
		}
	}
	r := s.sbs[sid]
	if r == nil {
		if s.sbs == nil {
			s.sbs = map[string]*cmdRing{}
		}
		r = &cmdRing{ids: map[string]struct{}{}}
		s.sbs[sid] = r
	}
	if _, ok := r.ids[cid]; ok {
		return
	}
	if len(r.ring) < MaxStartedCommands {
		r.ring = append(r.ring, cid)
	} else {
		delete(r.ids, r.ring[r.next])
		r.ring[r.next] = cid
		r.next = (r.next + 1) % len(r.ring)
	}
	r.ids[cid] = struct{}{}
}

func (w *Worker) liveSandboxes() map[string]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]bool, len(w.sandboxes))
	for id := range w.sandboxes {
		out[id] = true
	}
	return out
}

// errCommandGone is the attach answer for a command that already ran.
func errCommandGone(sid, cid string) error {
	return model.Errorf(agentclient.ErrGone, "command %s already ran in sandbox %s and its record has been dropped "+
		"(too many newer commands, or the sandbox was rolled back); it is not run again: create a new command", cid, sid)
}

// ensureProcess starts the command on its first attach and returns its info.
// Starting first saves a round trip on the common path (the first attach);
// a re-attach gets a conflict and reads the existing process instead. A
// command the worker or the agent knows to have run, but that the agent no
// longer has, is never started again: the attach gets 410 Gone.
func (w *Worker) ensureProcess(ctx context.Context, ac *agentclient.Client, sid string, c model.CommandSpec, sandboxEnv map[string]string) (agentapi.ProcessInfo, error) {
	rec := w.started()
	if rec.has(sid, c.ID) {
		info, err := ac.GetProcess(ctx, c.ID)
		if errors.Is(err, model.ErrNotFound) {
			return info, errCommandGone(sid, c.ID)
		}
		if err != nil {
			return info, fmt.Errorf("process %s: %w", c.ID, err)
		}
		return info, nil
	}
	// Env layers, lowest first: the template's, the egress CA's, the
	// sandbox's, the command's.
	c, env := withTemplateDefaults(w.sandboxTemplateConfig(sid), c, w.withCAEnv(sid, sandboxEnv))
	info, err := startProcess(ctx, ac, c, env)
	if errors.Is(err, agentclient.ErrGone) {
		return info, errCommandGone(sid, c.ID)
	}
	if err == nil {
		rec.add(sid, c.ID, w.liveSandboxes)
	}
	return info, err
}

func startProcess(ctx context.Context, ac *agentclient.Client, c model.CommandSpec, sandboxEnv map[string]string) (agentapi.ProcessInfo, error) {
	env := make(map[string]string, len(sandboxEnv)+len(c.Env))
	for k, v := range sandboxEnv {
		env[k] = v
	}
	for k, v := range c.Env {
		env[k] = v
	}
	spec := agentapi.ProcessSpec{
		ID: c.ID, Argv: c.Argv, Env: env, Cwd: c.Cwd, User: c.User, Stdin: c.Stdin, TimeoutS: c.TimeoutS,
	}
	if c.PTY != nil {
		spec.PTY = &agentapi.PTYSize{Cols: c.PTY.Cols, Rows: c.PTY.Rows}
	}
	info, err := ac.StartProcess(ctx, spec)
	if errors.Is(err, model.ErrConflict) { // a re-attach, or a concurrent first attach won
		info, err = ac.GetProcess(ctx, c.ID)
	}
	if err != nil {
		return info, fmt.Errorf("start process %s: %w", c.ID, err)
	}
	return info, nil
}

// attach pumps output frames to the client and client frames to the agent
// until the process exits or either side goes away.
func (w *Worker) attach(ctx context.Context, conn *websocket.Conn, ac *agentclient.Client, sid, cid string, info agentapi.ProcessInfo, offset int64) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	log := w.log.With("command", cid)

	// An attached command is activity for as long as it stays attached.
	go func() {
		t := time.NewTicker(ActivityInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				w.touch(sid)
				return
			case <-t.C:
				w.touch(sid)
			}
		}
	}()

	// Client → agent. Stdin bytes go through one streaming request per
	// attachment, so their order is kept; the pipe gives backpressure.
	inDone := make(chan struct{})
	go func() {
		defer close(inDone)
		defer cancel() // the client went away or misbehaved: stop the output pump
		w.pumpInput(ctx, conn, ac, cid, log)
	}()

	started, _ := json.Marshal(info)
	if err := writeFrame(ctx, conn, agentapi.FrameStarted, started); err != nil {
		return
	}
	out, err := ac.Output(ctx, cid, offset)
	if err != nil {
		sendError(ctx, conn, fmt.Errorf("open output: %w", err))
		return
	}
	defer out.Close()
	for {
		kind, payload, err := out.Next()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if w.leftRunning(sid, ac) {
				// Suspended (or otherwise moved on) under the attachment: the
				// client re-attaches and its request waits for the wake.
				log.Debug("output stream ended by a lifecycle change", "err", err)
				conn.Close(websocket.StatusTryAgainLater, "sandbox is being suspended; attach again from the offset reached")
				return
			}
			sendError(ctx, conn, fmt.Errorf("read output: %w", err))
			return
		}
		if err := writeFrame(ctx, conn, kind, payload); err != nil {
			return
		}
		if kind == agentapi.FrameStdout || kind == agentapi.FrameStderr {
			w.observer().DataPlane("command", "out", int64(len(payload)))
		}
		if kind == agentapi.FrameExit || kind == agentapi.FrameError {
			conn.Close(websocket.StatusNormalClosure, "")
			cancel() // unblocks a stdin write the process never read
			<-inDone
			return
		}
	}
}

// leftRunning reports whether sandbox sid is no longer the running sandbox
// whose agent is ac: it is suspending, suspended, waking, or was woken
// with a new agent client.
func (w *Worker) leftRunning(sid string, ac *agentclient.Client) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	sb := w.sandboxes[sid]
	if sb == nil {
		return false
	}
	switch sb.state {
	case model.StateSuspending, model.StateSuspended, model.StateWaking:
		return true
	case model.StateRunning, model.StatePaused:
		return sb.agent != ac
	}
	return false
}

func (w *Worker) pumpInput(ctx context.Context, conn *websocket.Conn, ac *agentclient.Client, cid string, log interface {
	Debug(string, ...any)
}) {
	var (
		pw       *io.PipeWriter
		stdinErr chan error
	)
	stopStdin := func(err error) error {
		if pw == nil {
			return nil
		}
		pw.CloseWithError(err)
		e := <-stdinErr
		pw, stdinErr = nil, nil
		return e
	}
	defer func() { _ = stopStdin(context.Canceled) }()
	for {
		typ, msg, err := conn.Read(ctx)
		if err != nil {
			return
		}
		if typ != websocket.MessageBinary || len(msg) == 0 {
			continue
		}
		switch msg[0] {
		case agentapi.FrameStdin:
			w.observer().DataPlane("command", "in", int64(len(msg)-1))
			if pw == nil {
				pr, npw := io.Pipe()
				pw, stdinErr = npw, make(chan error, 1)
				go func(ch chan error) {
					err := ac.Stdin(ctx, cid, pr, false)
					pr.CloseWithError(err)
					ch <- err
				}(stdinErr)
			}
			if _, err := pw.Write(msg[1:]); err != nil {
				log.Debug("stdin", "err", stopStdin(err))
			}
		case agentapi.FrameStdinClose:
			// Deliver every byte sent so far, then close.
			if err := stopStdin(nil); err != nil {
				log.Debug("stdin", "err", err)
			}
			if err := ac.CloseStdin(ctx, cid); err != nil {
				log.Debug("close stdin", "err", err)
			}
		case agentapi.FrameSignal:
			var s agentapi.Signal
			if err := json.Unmarshal(msg[1:], &s); err != nil {
				log.Debug("bad signal frame", "err", err)
				continue
			}
			if err := ac.Signal(ctx, cid, s.Signal); err != nil {
				log.Debug("signal", "signal", s.Signal, "err", err)
			}
		case agentapi.FrameResize:
			var sz agentapi.PTYSize
			if err := json.Unmarshal(msg[1:], &sz); err != nil {
				log.Debug("bad resize frame", "err", err)
				continue
			}
			if err := ac.Resize(ctx, cid, sz); err != nil {
				log.Debug("resize", "cols", sz.Cols, "rows", sz.Rows, "err", err)
			}
		}
	}
}

func writeFrame(ctx context.Context, conn *websocket.Conn, kind byte, payload []byte) error {
	msg := make([]byte, 1+len(payload))
	msg[0] = kind
	copy(msg[1:], payload)
	return conn.Write(ctx, websocket.MessageBinary, msg)
}

func sendError(ctx context.Context, conn *websocket.Conn, err error) {
	b, _ := json.Marshal(map[string]string{"message": err.Error()})
	if writeFrame(ctx, conn, agentapi.FrameError, b) == nil {
		conn.Close(websocket.StatusNormalClosure, "")
	}
}

// countReader counts the bytes read through it.
type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
