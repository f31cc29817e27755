// Package agent is the server side of airlock-agent, the PID 1 of every
// sandbox: it starts and reaps processes, keeps their output, and serves
// files, all over the HTTP/2 (h2c) wire contract in internal/agentapi.
//
// It links only the standard library, golang.org/x/sys and agentapi, so the
// agent binary stays small and static (enforced by a dependency test in
// cmd/airlock-agent).
package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
)

// DefaultMaxOutput is how many bytes of output the agent keeps per process.
const DefaultMaxOutput = 64 << 20

// Bounds on what the agent keeps of finished processes (their record and
// output, for re-attaching and listing): beyond either, the oldest finished
// ones are forgotten when a new process starts. Running processes are
// never forgotten.
const (
	DefaultMaxFinished       = 256
	DefaultMaxFinishedOutput = 256 << 20
)

// DefaultMaxTombstones is how many ids of forgotten processes the agent
// remembers (oldest dropped first), so that a late start or attach of one
// gets 410 Gone instead of running the command a second time. An id costs
// some 100 bytes.
const DefaultMaxTombstones = 65536

// Config configures an Agent. The zero value is the production setting.
type Config struct {
	// PasswdPath and GroupPath are the user databases (default /etc/passwd,
	// /etc/group).
	PasswdPath string
	GroupPath  string
	// Home resolves relative file paths (default agentapi.DefaultHome).
	Home string
	// MaxOutput bounds the retained output per process (default DefaultMaxOutput).
	MaxOutput int64
	// MaxFinished and MaxFinishedOutput bound the finished processes kept
	// (defaults DefaultMaxFinished, DefaultMaxFinishedOutput).
	MaxFinished       int
	MaxFinishedOutput int64
	// MaxTombstones bounds the ids of forgotten processes kept (default
	// DefaultMaxTombstones).
	MaxTombstones int
	// Logger receives diagnostics (default: discard).
	Logger *slog.Logger
}

// Agent serves the agentapi endpoints.
type Agent struct {
	cfg  Config
	log  *slog.Logger
	boot time.Time
	mux  *http.ServeMux

	mu    sync.Mutex
	procs map[string]*process
	// gone holds the ids of forgotten processes; goneOrder is their ring in
	// the order forgotten, goneNext the next slot to reuse once it is full.
	gone      map[string]struct{}
	goneOrder []string
	goneNext  int
}

// New returns an Agent. It starts the process reaper, which handles SIGCHLD
// for the whole program (as PID 1 it reaps every child; otherwise only the
// processes the agent started).
func New(cfg Config) *Agent {
	if cfg.PasswdPath == "" {
		cfg.PasswdPath = "/etc/passwd"
	}
	if cfg.GroupPath == "" {
		cfg.GroupPath = "/etc/group"
	}
	if cfg.Home == "" {
		cfg.Home = agentapi.DefaultHome
	}
	if cfg.MaxOutput <= 0 {
		cfg.MaxOutput = DefaultMaxOutput
	}
	if cfg.MaxFinished <= 0 {
		cfg.MaxFinished = DefaultMaxFinished
	}
	if cfg.MaxFinishedOutput <= 0 {
		cfg.MaxFinishedOutput = DefaultMaxFinishedOutput
	}
	if cfg.MaxTombstones <= 0 {
		cfg.MaxTombstones = DefaultMaxTombstones
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Agent{cfg: cfg, log: log, boot: time.Now().UTC(), procs: map[string]*process{}, gone: map[string]struct{}{}}
	startReaper()
	m := http.NewServeMux()
	m.HandleFunc("GET /health", a.handleHealth)
	m.HandleFunc("POST /processes", a.handleStart)
	m.HandleFunc("GET /processes", a.handleList)
	m.HandleFunc("GET /processes/{id}", a.handleGet)
	m.HandleFunc("GET /processes/{id}/output", a.handleOutput)
	m.HandleFunc("POST /processes/{id}/stdin", a.handleStdin)
	m.HandleFunc("POST /processes/{id}/close-stdin", a.handleCloseStdin)
	m.HandleFunc("POST /processes/{id}/signal", a.handleSignal)
	m.HandleFunc("POST /processes/{id}/resize", a.handleResize)
	m.HandleFunc("GET /files/content", a.handleReadFile)
	m.HandleFunc("PUT /files/content", a.handleWriteFile)
	m.HandleFunc("GET /files/stat", a.handleStat)
	m.HandleFunc("GET /files/list", a.handleListDir)
	m.HandleFunc("POST /files/mkdir", a.handleMkdir)
	m.HandleFunc("POST /files/move", a.handleMove)
	m.HandleFunc("DELETE /files", a.handleRemove)
	a.mux = m
	return a
}

// ServeHTTP implements http.Handler.
func (a *Agent) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

var _ http.Handler = (*Agent)(nil)

func (a *Agent) handleHealth(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, agentapi.Health{Version: agentapi.Version, PID: os.Getpid(), Boot: a.boot})
}

// Error kinds; translated to wire codes only in writeError.
var (
	errNotFound = errors.New("not found")
	errInvalid  = errors.New("invalid")
	errConflict = errors.New("conflict")
	errGone     = errors.New("gone")
)

type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

func errorf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// classify maps an error to an HTTP status and an agentapi error code.
func classify(err error) (int, string) {
	switch {
	case errors.Is(err, errInvalid):
		return http.StatusBadRequest, "invalid"
	case errors.Is(err, errConflict):
		return http.StatusConflict, "conflict"
	case errors.Is(err, errGone):
		return http.StatusGone, "gone"
	case errors.Is(err, errNotFound), errors.Is(err, fs.ErrNotExist):
		return http.StatusNotFound, "not_found"
	case errors.Is(err, fs.ErrExist), errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR),
		errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EBUSY):
		return http.StatusConflict, "conflict"
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.EXDEV),
		errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.ELOOP):
		return http.StatusBadRequest, "invalid"
	default:
		return http.StatusInternalServerError, "internal"
	}
}

func writeError(w http.ResponseWriter, err error) {
	status, code := classify(err)
	var body agentapi.Error
	body.Error.Code = code
	body.Error.Message = err.Error()
	writeJSON(w, status, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func readJSON(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<20))
	if err := dec.Decode(v); err != nil {
		return errorf(errInvalid, "decode request body: %v", err)
	}
	return nil
}
