package workerapi

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/httperr"
	"github.com/airlock/airlock/internal/model"
)

// Server is the server side of the worker API, as the handler calls it
// (internal/controller implements it; workerapitest has an in-memory one).
// Errors are model sentinels; the handler answers them through httperr.
type Server interface {
	// Authenticate reports whether secret is worker id's own credential
	// (model.ErrUnauthorized when not). Sync and Wake call it first.
	Authenticate(ctx context.Context, id, secret string) error
	// Register records a worker that presented the join token.
	Register(ctx context.Context, req RegisterRequest) (RegisterResponse, error)
	// Sync applies worker id's heartbeat and observations and returns its
	// assignments, long-polling as poll says.
	Sync(ctx context.Context, id string, req SyncRequest, poll Poll) (SyncResponse, error)
	// Heartbeat records that worker id (authenticated) is alive when its
	// Sync body could not be read.
	Heartbeat(ctx context.Context, id string) error
	// Wake wakes (or resumes) a sandbox assigned to worker id.
	Wake(ctx context.Context, id string, req WakeRequest) (model.Operation, error)
}

// Poll is how a Sync waits: when the assignment version equals Version
// (HasVersion) and the observations changed nothing, up to Wait for a
// change.
type Poll struct {
	Version    int64
	HasVersion bool
	Wait       time.Duration
}

// WakeResponse is the answer to a Wake: the operation taking the sandbox
// to running.
type WakeResponse struct {
	Operation model.Operation `json:"operation"`
}

// MaxBody caps the body of a worker API request.
const MaxBody = 8 << 20

// HandlerConfig configures NewHandler.
type HandlerConfig struct {
	// JoinToken is the server's --worker-token; "" turns the worker API
	// off (every call is refused).
	JoinToken string
	// MaxSyncWait caps a Sync's wait (0: no cap).
	MaxSyncWait time.Duration
}

// NewHandler serves the worker API over s: routes, authentication
// (the join token for Register, the worker's own secret for Sync and
// Wake), request decoding and error answers.
func NewHandler(s Server, cfg HandlerConfig) http.Handler {
	h := &handler{s: s, cfg: cfg}
	mux := http.NewServeMux()
	mux.Handle(RouteRegister, h.joinAuth(http.HandlerFunc(h.register)))
	mux.Handle(RouteSync, h.workerAuth(http.HandlerFunc(h.sync)))
	mux.Handle(RouteWake, h.workerAuth(http.HandlerFunc(h.wake)))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if cfg.JoinToken == "" {
			writeError(w, model.Errorf(model.ErrUnauthorized, "the worker API is disabled: the server has no worker token"))
			return
		}
		mux.ServeHTTP(w, r)
	})
}

type handler struct {
	s   Server
	cfg HandlerConfig
}

// joinAuth admits a registration that carries the join token. Register
// then checks the worker id's own secret.
func (h *handler) joinAuth(next http.Handler) http.Handler {
	want := []byte("Bearer " + h.cfg.JoinToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			writeError(w, model.Errorf(model.ErrUnauthorized, "missing or wrong join token: register with Authorization: Bearer <the server's --worker-token>"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// workerAuth admits a call on /internal/v1/workers/{id}/… only with that
// worker's own secret (the join token is not enough: one worker cannot
// sync or wake as another).
func (h *handler) workerAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		secret, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || secret == "" {
			writeError(w, model.Errorf(model.ErrUnauthorized, "missing worker credential: send Authorization: Bearer <the secret worker %s received at registration>", id))
			return
		}
		if err := h.s.Authenticate(r.Context(), id, secret); err != nil {
			writeError(w, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (h *handler) register(w http.ResponseWriter, r *http.Request) {
	var req RegisterRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	resp, err := h.s.Register(r.Context(), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

func (h *handler) sync(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	poll, err := h.poll(r)
	if err != nil {
		writeError(w, err)
		return
	}
	var req SyncRequest
	if err := decode(r, &req); err != nil {
		if errors.Is(err, model.ErrTooLarge) {
			// The worker is authenticated and alive: its heartbeat counts
			// even when its observations cannot be read, so one runaway
			// report never marks the worker (and every sandbox on it)
			// unreachable.
			_ = h.s.Heartbeat(r.Context(), id)
			err = model.Errorf(model.ErrTooLarge, "sync body exceeds %d bytes: the heartbeat was recorded but no observation was applied; report fewer or smaller observations (reasons are limited to %d bytes)", MaxBody, MaxReason)
		}
		writeError(w, err)
		return
	}
	resp, err := h.s.Sync(r.Context(), id, req, poll)
	if err != nil {
		if r.Context().Err() != nil {
			return // the worker went away
		}
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// poll reads a Sync's wait and version.
func (h *handler) poll(r *http.Request) (Poll, error) {
	var p Poll
	q := r.URL.Query()
	if s := q.Get("wait"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			secs, err2 := strconv.Atoi(s)
			if err2 != nil || secs < 0 {
				return Poll{}, model.Errorf(model.ErrInvalid, "wait %q: want a duration such as 25s", s)
			}
			d = time.Duration(secs) * time.Second
		}
		p.Wait = max(d, 0)
		if h.cfg.MaxSyncWait > 0 {
			p.Wait = min(p.Wait, h.cfg.MaxSyncWait)
		}
	}
	if s := q.Get("version"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return Poll{}, model.Errorf(model.ErrInvalid, "version %q: want an integer", s)
		}
		p.Version, p.HasVersion = v, true
	}
	return p, nil
}

func (h *handler) wake(w http.ResponseWriter, r *http.Request) {
	var req WakeRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	op, err := h.s.Wake(r.Context(), r.PathValue("id"), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, WakeResponse{Operation: op})
}

func decode(r *http.Request, v any) error {
	body := http.MaxBytesReader(nil, r.Body, MaxBody)
	if err := json.NewDecoder(body).Decode(v); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return model.Errorf(model.ErrTooLarge, "request body exceeds %d bytes", MaxBody)
		}
		return model.Errorf(model.ErrInvalid, "request body: %v", err)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// writeError answers err through httperr (an unauthorized answer names
// the worker API's realm).
func writeError(w http.ResponseWriter, err error) {
	if status, _ := httperr.Status(err); status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="airlock-worker"`)
	}
	httperr.Write(w, err)
}
