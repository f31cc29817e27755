// Package envd serves E2B's envd API from airlock-agent: the Connect-RPC
// services process.Process and filesystem.Filesystem (wire-compatible with
// envd, from Airlock's own .proto files in api/proto) and envd's plain HTTP
// endpoints (/files, /health, /envs, /init, /metrics). Processes run in the
// agent's process table and files go through the agent's file code, so the
// native agent API and envd see the same sandbox.
//
// The agent mounts the handler under /envd/ with the prefix stripped; the
// data plane forwards E2B's envd traffic there with its path unchanged
// (e.g. /envd/process.Process/Start). Ports serves /ports/{port}/… and
// Tunnel the CONNECT tunnels that reach other ports inside the sandbox.
package envd

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock/airlock/internal/agent"
	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/envdpb/filesystem/filesystemconnect"
	"github.com/airlock/airlock/internal/envdpb/process/processconnect"
)

// Version is the envd version Airlock speaks; E2B SDKs gate features on it
// (2.51 needs 0.6.4 for all of them).
const Version = "0.6.13"

// DefaultKeepalive is the keepalive interval of streams whose client did
// not ask for one (Keepalive-Ping-Interval, seconds).
const DefaultKeepalive = 90 * time.Second

// Config configures a Server.
type Config struct {
	// Logger receives diagnostics (default: discard).
	Logger *slog.Logger
}

// Server is the envd API over one agent.
type Server struct {
	agent *agent.Agent
	log   *slog.Logger
	mux   *http.ServeMux

	mu             sync.Mutex
	envVars        map[string]string
	accessToken    string
	defaultUser    string
	defaultWorkdir string

	watchMu  sync.Mutex
	watchers map[string]*watcher

	cpuMu   sync.Mutex
	cpuLast cpuSample
}

// New returns the envd API over a.
func New(a *agent.Agent, cfg Config) *Server {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{agent: a, log: log, envVars: map[string]string{}, watchers: map[string]*watcher{}}
	m := http.NewServeMux()
	path, h := processconnect.NewProcessHandler(&processService{s})
	m.Handle(path, h)
	path, h = filesystemconnect.NewFilesystemHandler(&filesystemService{s})
	m.Handle(path, h)
	m.HandleFunc("GET /health", s.handleHealth)
	m.HandleFunc("GET /envs", s.handleEnvs)
	m.HandleFunc("POST /init", s.handleInit)
	m.HandleFunc("GET /metrics", s.handleMetrics)
	m.HandleFunc("GET /files", s.handleReadFile)
	m.HandleFunc("POST /files", s.handleWriteFiles)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeHTTPError(w, http.StatusNotImplemented, fmt.Sprintf("envd %s %s is not supported by Airlock's agent", r.Method, r.URL.Path))
	})
	s.mux = m
	return s
}

var _ http.Handler = (*Server)(nil)

// ServeHTTP checks the access token (when /init set one), then serves.
// GET /health and POST /init need none; /files accepts a signature instead.
// Like envd it allows cross-origin calls (browser SDKs).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Access-Control-Allow-Origin", "*")
	h.Set("Access-Control-Expose-Headers", "Connect-Protocol-Version, Grpc-Status, Grpc-Message, Grpc-Status-Details-Bin, Content-Encoding, Content-Length")
	if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
		h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
		h.Set("Access-Control-Allow-Headers", "*")
		h.Set("Access-Control-Max-Age", "7200")
		w.WriteHeader(http.StatusNoContent)
		return
	}
	switch {
	case r.URL.Path == "/health", r.URL.Path == "/init", r.URL.Path == "/files":
	default:
		if !s.tokenOK(r) {
			if strings.Count(r.URL.Path, "/") == 2 && strings.Contains(r.URL.Path, ".") { // an RPC
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				_, _ = w.Write([]byte(`{"code":"unauthenticated","message":"missing or wrong X-Access-Token"}`))
				return
			}
			writeHTTPError(w, http.StatusUnauthorized, "missing or wrong X-Access-Token")
			return
		}
	}
	s.mux.ServeHTTP(w, r)
}

func (s *Server) token() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accessToken
}

func (s *Server) tokenOK(r *http.Request) bool {
	tok := s.token()
	return tok == "" || subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Access-Token")), []byte(tok)) == 1
}

// env returns a copy of the sandbox environment set by /init.
func (s *Server) env() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.envVars)
}

// userName picks the calling user: an explicit name, else the Basic
// authorization user, else the default user.
func (s *Server) userName(h http.Header, explicit string) string {
	if explicit != "" {
		return explicit
	}
	if auth := h.Get("Authorization"); strings.HasPrefix(auth, "Basic ") {
		if raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(auth, "Basic ")); err == nil {
			if name, _, _ := strings.Cut(string(raw), ":"); name != "" {
				return name
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.defaultUser != "" {
		return s.defaultUser
	}
	return agentapi.DefaultUser
}

// user resolves the calling user (unauthenticated when unknown).
func (s *Server) user(h http.Header, explicit string) (agent.User, error) {
	name := s.userName(h, explicit)
	u, ok := s.agent.LookupUser(name)
	if !ok {
		return agent.User{}, connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("user %q does not exist", name))
	}
	return u, nil
}

// resolve expands ~ and makes p absolute against the user's home, as envd
// does; an empty path is the default workdir (set by /init), else the home.
func (s *Server) resolve(p string, u agent.User) (string, error) {
	if p == "" {
		s.mu.Lock()
		p = s.defaultWorkdir
		s.mu.Unlock()
	}
	switch {
	case p == "~", p == "":
		p = u.Home
	case strings.HasPrefix(p, "~/"):
		p = filepath.Join(u.Home, p[2:])
	case strings.HasPrefix(p, "~"):
		return "", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("cannot expand %q: only ~ and ~/ are supported", p))
	case !filepath.IsAbs(p):
		p = filepath.Join(u.Home, p)
	}
	return filepath.Clean(p), nil
}

// rpcError maps an error from the agent or the file system to a Connect
// error; errors that already are Connect errors pass through.
func rpcError(step string, err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	code := connect.CodeInternal
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		code = connect.CodeDeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	case errors.Is(err, agent.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		code = connect.CodeNotFound
	case errors.Is(err, agent.ErrInvalid), errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.ENAMETOOLONG),
		errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR):
		code = connect.CodeInvalidArgument
	case errors.Is(err, fs.ErrExist), errors.Is(err, syscall.ENOTEMPTY):
		code = connect.CodeAlreadyExists
	case errors.Is(err, agent.ErrConflict), errors.Is(err, syscall.EBUSY):
		code = connect.CodeFailedPrecondition
	case errors.Is(err, fs.ErrPermission):
		code = connect.CodePermissionDenied
	case errors.Is(err, syscall.ENOSPC):
		code = connect.CodeResourceExhausted
	}
	return connect.NewError(code, fmt.Errorf("%s: %w", step, err))
}

// keepalive reads Keepalive-Ping-Interval (seconds).
func keepalive(h http.Header) time.Duration {
	if n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval")); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return DefaultKeepalive
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeHTTPError writes envd's HTTP error body {message, code}.
func writeHTTPError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"message": msg, "code": status})
}

// httpStatus maps an error of the plain HTTP endpoints to a status.
func httpStatus(err error) int {
	switch connect.CodeOf(rpcError("", err)) {
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeInvalidArgument, connect.CodeAlreadyExists, connect.CodeFailedPrecondition:
		return http.StatusBadRequest
	case connect.CodeUnauthenticated, connect.CodePermissionDenied:
		return http.StatusUnauthorized
	case connect.CodeResourceExhausted:
		return http.StatusInsufficientStorage
	default:
		return http.StatusInternalServerError
	}
}
