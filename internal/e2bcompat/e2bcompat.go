// Package e2bcompat lets the unmodified E2B SDKs drive Airlock. It is a
// transport adapter over internal/service, beside the native REST adapter
// (internal/api). An Adapter has two parts:
//
//   - API: E2B's control-plane REST API (POST /sandboxes, /v2/sandboxes,
//     list, get, kill, timeout, pause, connect, resume, refreshes, metrics,
//     and the template build API of the SDKs' Template() builder:
//     templates.go),
//     authenticated by X-API-KEY, answering E2B's shapes and error bodies
//     {"code": <status>, "message"}; endpoints Airlock lacks (snapshots,
//     volumes, network rules…) answer 501 at once with a message naming
//     the gap.
//   - Sandboxes: recognizes sandbox (envd and user-port) traffic by the
//     E2b-Sandbox-Id / E2b-Sandbox-Port headers or a "<port>-<sandboxID>.<domain>"
//     Host, checks E2B's access token or file-URL signature (envd's port)
//     or the sandbox's traffic token (its other ports, unless public), caps
//     the requests in flight per sandbox, removes the client's credentials,
//     and hands the request to the data plane of the worker running the
//     sandbox (in-process under `airlock up`, else by reverse proxy); the
//     worker forwards it to the agent's envd or the port in the sandbox.
//
// E2B timeouts are the sandbox's ExpiresAt and OnExpiry (autoPause:
// model.ExpirySuspend), which the controller acts on (its expiry rule):
// the adapter only sets them (create, timeout, connect, refreshes).
//
// Model errors become E2B status codes only in writeError.
package e2bcompat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/tracing"
)

// EnvdVersion is the envd version Airlock reports; the SDKs enable features
// by it (2.51 needs at least 0.6.4 for all of them).
const EnvdVersion = "0.6.13"

// EnvdPort is the port of envd inside an E2B sandbox.
const EnvdPort = 49983

// DefaultTimeout is a sandbox's time to live when create names none
// (seconds), as in E2B's v2 API.
const DefaultTimeout = 300

// Reserved metadata keys: E2B options that the model has no field for.
// They are hidden from E2B answers.
const (
	metaPrefix = "airlock.e2b."
	metaAlias  = metaPrefix + "alias" // the templateID as the SDK sent it
)

// maxBody caps control-plane request bodies.
const maxBody = 1 << 20

// Options tune the adapter. The zero value is ready to use.
type Options struct {
	// Logger receives internal errors (nil: slog.Default()).
	Logger *slog.Logger
	// SigningKey returns the data-plane HMAC key envd access tokens are
	// signed with (nil: svc.InstallationKey).
	SigningKey func(ctx context.Context) ([]byte, error)
	// CreateWait bounds how long create and connect wait for the sandbox to
	// run (0: 5 minutes).
	CreateWait time.Duration
	// LocalWorker returns the data-plane handler of workerID when that
	// worker runs in this process (`airlock up`), else nil; sandbox traffic
	// for other workers is reverse-proxied to their data-plane URL.
	LocalWorker func(workerID string) http.Handler
	// Observe, when set, is called after every control-plane request with
	// its method, route pattern (e.g. "/v2/sandboxes/{id}/connect"), answer
	// status and duration (the API request metrics).
	Observe func(method, route string, status int, d time.Duration)
	// MaxInflightPerSandbox caps the requests the router carries to one
	// sandbox at once; one more is answered 429 (0: MaxInflightPerSandbox).
	MaxInflightPerSandbox int // Domain is the sandbox domain create, connect and get answer (the
	// SDKs build "<port>-<sandboxID>.<Domain>" hosts from it): the name
	// under which wildcard DNS (and TLS) reach this server. Empty: the
	// host the request came to (see (*server).domain).
	Domain string
}

// Adapter is the E2B compatibility layer of one server.
type Adapter struct {
	s   *server
	rt  *router
	api http.Handler
}

// New returns the adapter over svc.
func New(svc *service.Service, o Options) *Adapter {
	s := newServer(svc, o)
	rt := &router{s: s, local: o.LocalWorker, maxInflight: o.MaxInflightPerSandbox}
	if rt.maxInflight <= 0 {
		rt.maxInflight = MaxInflightPerSandbox
	}
	s.envdGet = rt.envdGet
	return &Adapter{s: s, rt: rt, api: newAPI(s)}
}

// SetDomain sets Options.Domain; call it before the adapter serves.
func (a *Adapter) SetDomain(d string) {
	a.s.domainName = strings.ToLower(strings.TrimSuffix(d, "."))
}

// API returns the handler of E2B's control-plane REST API. Unknown paths
// answer an E2B 404.
func (a *Adapter) API() http.Handler { return a.api }

// Sandboxes wraps next: requests for a sandbox (E2b-Sandbox-Id header or a
// "<port>-<sandboxID>.<domain>" Host) go to the sandbox's worker data
// plane, everything else to next.
func (a *Adapter) Sandboxes(next http.Handler) http.Handler { return a.rt.wrap(next) }

type server struct {
	svc        *service.Service
	log        *slog.Logger
	key        func(ctx context.Context) ([]byte, error)
	createWait time.Duration
	domainName string
	observe    func(method, route string, status int, d time.Duration)
	// envdGet fetches an envd path of a running sandbox (nil: metrics are []).
	envdGet func(ctx context.Context, sb model.Sandbox, path string) ([]byte, error)
}

func newServer(svc *service.Service, o Options) *server {
	s := &server{svc: svc, log: o.Logger, key: o.SigningKey, createWait: o.CreateWait, observe: o.Observe, domainName: strings.ToLower(strings.TrimSuffix(o.Domain, "."))}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.key == nil {
		s.key = svc.InstallationKey
	}
	if s.createWait <= 0 {
		s.createWait = 5 * time.Minute
	}
	return s
}

type handlerFunc func(s *server, w http.ResponseWriter, r *http.Request, p service.Principal) error

// route is one endpoint; every route needs X-API-KEY.
type route struct {
	pattern string
	h       handlerFunc
}

// routes is every endpoint of the E2B control plane that Airlock serves.
var routes = []route{
	{"POST /sandboxes", (*server).create},
	{"POST /v2/sandboxes", (*server).create},
	{"GET /sandboxes", (*server).list},
	{"GET /v2/sandboxes", (*server).list},
	{"GET /sandboxes/{id}", (*server).get},
	{"DELETE /sandboxes/{id}", (*server).kill},
	{"POST /sandboxes/{id}/timeout", (*server).setTimeout},
	{"PUT /sandboxes/{id}/network", (*server).updateNetwork},
	{"POST /sandboxes/{id}/refreshes", (*server).refresh},
	{"POST /sandboxes/{id}/pause", (*server).pause},
	{"POST /sandboxes/{id}/connect", (*server).connect},
	{"POST /v2/sandboxes/{id}/connect", (*server).connect},
	{"POST /sandboxes/{id}/resume", (*server).resume},
	{"GET /sandboxes/{id}/metrics", (*server).metrics},
	{"GET /sandboxes/metrics", (*server).metricsMany},
	{"GET /sandboxes/{id}/logs", (*server).logs},
	{"GET /v2/sandboxes/{id}/logs", (*server).logs},
	// Template builds (templates.go).
	{"POST /v3/templates", (*server).requestTemplate},
	{"POST /v2/templates", (*server).requestTemplate},
	{"GET /templates/{templateID}/files/{hash}", (*server).fileUpload},
	{"POST /v2/templates/{templateID}/builds/{buildID}", (*server).startTemplateBuild},
	{"GET /templates/{templateID}/builds/{buildID}/status", (*server).buildStatus},
	{"GET /templates/{a}/{b}", (*server).templateGet},
	{"POST /templates/tags", (*server).assignTags},
	// Snapshots, forks and secrets (snapshots.go).
	{"POST /sandboxes/{id}/snapshots", (*server).createSnapshot},
	{"GET /snapshots", (*server).listSnapshots},
	{"DELETE /templates/{templateID}", (*server).deleteTemplate},
	{"POST /sandboxes/{id}/fork", (*server).fork},
	{"POST /secrets", (*server).createSecret},
	{"GET /secrets", (*server).listSecrets},
	{"GET /secrets/{secretID}", (*server).getSecret},
	{"POST /secrets/{secretID}", (*server).updateSecret},
	{"DELETE /secrets/{secretID}", (*server).deleteSecret},
}

// unsupported are E2B endpoints Airlock does not implement: each answers
// 501 with the name of the gap.
var unsupported = []struct{ pattern, what string }{
	{"/templates", "this template call (Airlock serves the SDKs' Template() builder, aliases and tags; list and delete templates with `airlock template`)"},
	{"/templates/", "this template call (Airlock serves the SDKs' Template() builder, aliases and tags; list and delete templates with `airlock template`)"},
	{"/v2/templates/", "this template call (Airlock serves the SDKs' Template() builder)"},
	{"/v3/templates/", "this template call (Airlock serves the SDKs' Template() builder)"},
	{"/snapshots/", "this snapshot call (Airlock serves createSnapshot, listSnapshots, deleteSnapshot and fork)"},
	{"/volumes", "volumes"},
	{"/volumes/", "volumes"},
	{"/volumecontent", "volumes"},
	{"/volumecontent/", "volumes"},
	{"/secrets/", "this secrets call (Airlock serves create, list, get, update and delete)"},
	{"/teams", "teams (Airlock has orgs; see `airlock org`)"},
	{"/teams/", "teams (Airlock has orgs; see `airlock org`)"},
	{"/access-tokens", "access tokens (create keys with `airlock key create --e2b`)"},
	{"/access-tokens/", "access tokens (create keys with `airlock key create --e2b`)"},
	{"/api-keys", "API key management (create keys with `airlock key create --e2b`)"},
	{"/api-keys/", "API key management (create keys with `airlock key create --e2b`)"},
	{"/nodes", "cluster nodes"},
	{"/nodes/", "cluster nodes"},
}

func newAPI(s *server) http.Handler {
	svc := s.svc
	mux := http.NewServeMux()
	for _, rt := range routes {
		mux.Handle(rt.pattern, s.observed(rt.pattern, s.wrap(rt.h)))
	}
	for _, u := range unsupported {
		what := u.what
		mux.Handle(u.pattern, s.observed(u.pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.writeError(w, r, notSupported("not supported by Airlock: %s", what))
		})))
	}
	// Build file uploads carry their own credential (the token in the
	// path), as E2B's presigned URLs do: the SDKs send no API key there.
	mux.HandleFunc("PUT "+uploadPath+"{token}", s.upload)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		if err := svc.CheckReady(r.Context()); err != nil {
			s.writeError(w, r, err)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	return &fallback{mux: mux, s: s}
}

// fallback turns the ServeMux's plain-text 404 and 405 into E2B errors.
type fallback struct {
	mux *http.ServeMux
	s   *server
}

func (f *fallback) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, pattern := f.mux.Handler(r); pattern != "" {
		f.mux.ServeHTTP(w, r)
		return
	}
	f.s.writeError(w, r, model.Errorf(model.ErrNotFound, "no such endpoint: %s %s (Airlock's E2B-compatible API; the native API is under /v1)", r.Method, r.URL.Path))
}

// observed reports each request to h, under its route pattern
// ("POST /v2/sandboxes" is method POST, route /v2/sandboxes; a pattern
// without a method reports the request's), to Options.Observe.
func (s *server) observed(pattern string, h http.Handler) http.Handler {
	if s.observe == nil {
		return h
	}
	method, route, ok := strings.Cut(pattern, " ")
	if !ok {
		method, route = "", pattern
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &tracing.StatusWriter{ResponseWriter: w}
		t0 := time.Now()
		defer func() {
			m := method
			if m == "" {
				m = r.Method
			}
			code := sw.Code()
			if code == 0 {
				code = http.StatusOK // nothing written: net/http answers 200
			}
			s.observe(m, route, code, time.Since(t0))
		}()
		h.ServeHTTP(sw, r)
	})
}

func (s *server) wrap(h handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := strings.TrimSpace(r.Header.Get("X-API-KEY"))
		if key == "" {
			if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
				key = strings.TrimSpace(b)
			}
		}
		if key == "" {
			s.writeError(w, r, model.Errorf(model.ErrUnauthorized, "missing API key; set E2B_API_KEY to a key from `airlock key create --e2b`"))
			return
		}
		p, err := s.svc.Authenticate(r.Context(), key)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		if err := h(s, w, r, p); err != nil {
			s.writeError(w, r, err)
		}
	})
}

// Error vocabulary local to this adapter.
type (
	errBadRequest   struct{ msg string }
	errNotSupported struct{ msg string }
	errFailed       struct{ msg string } // the sandbox failed; not a server bug
)

func (e errBadRequest) Error() string   { return e.msg }
func (e errNotSupported) Error() string { return e.msg }
func (e errFailed) Error() string       { return e.msg }

func badRequest(format string, args ...any) error {
	return errBadRequest{fmt.Sprintf(format, args...)}
}

func notSupported(format string, args ...any) error {
	return errNotSupported{fmt.Sprintf(format, args...)}
}

// errorBody is E2B's error shape; Code always equals the HTTP status (the
// JS SDK reads it for 404 and 409).
type errorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// writeError is the one place errors become E2B statuses.
func (s *server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	status, msg := http.StatusInternalServerError, "internal error; the server log has the details"
	var (
		bad    errBadRequest
		gap    errNotSupported
		failed errFailed
		big    *http.MaxBytesError
		limit  *service.RateLimitError
	)
	switch {
	case errors.As(err, &bad):
		status, msg = http.StatusBadRequest, bad.msg
	case errors.As(err, &gap):
		status, msg = http.StatusNotImplemented, gap.msg
	case errors.As(err, &failed):
		status, msg = http.StatusInternalServerError, failed.msg
	case errors.As(err, &big) || errors.Is(err, model.ErrTooLarge):
		status, msg = http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is larger than %d bytes", maxBody)
	case errors.Is(err, model.ErrUnauthorized):
		status, msg = http.StatusUnauthorized, message(err)
	case errors.Is(err, model.ErrForbidden):
		status, msg = http.StatusForbidden, message(err)
	case errors.Is(err, model.ErrNotFound):
		status, msg = http.StatusNotFound, message(err)
	case errors.Is(err, model.ErrConflict):
		status, msg = http.StatusConflict, message(err)
	case errors.Is(err, model.ErrUnprocessable), errors.Is(err, model.ErrInvalid):
		status, msg = http.StatusBadRequest, message(err)
	case errors.Is(err, model.ErrRateLimited):
		status, msg = http.StatusTooManyRequests, message(err)
		retry := time.Second
		if errors.As(err, &limit) {
			retry = limit.RetryAfter
		}
		w.Header().Set("Retry-After", strconv.Itoa(int((retry+time.Second-1)/time.Second)))
	case errors.Is(err, model.ErrUnavailable):
		status, msg = http.StatusServiceUnavailable, message(err)
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		return // the client went away
	default:
		s.log.Error("e2b request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeJSON(w, status, errorBody{Code: status, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		b = []byte(`{"code":500,"message":"encode response"}`)
		status = http.StatusInternalServerError
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// decode reads an optional JSON body into v; unknown fields are ignored
// (the SDKs send many).
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	if err := dec.Decode(v); err != nil {
		var big *http.MaxBytesError
		if errors.As(err, &big) {
			return err
		}
		if err.Error() == "EOF" {
			return nil
		}
		return badRequest("request body is not valid JSON for this endpoint: %v", err)
	}
	return nil
}
