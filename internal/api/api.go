// Package api is the native REST + SSE adapter over internal/service: it
// authenticates requests, decodes bodies and queries, calls the service and
// encodes results. Sentinel errors become HTTP statuses in exactly one place
// (writeError). The routes table is the single list of endpoints; the
// OpenAPI document (api/openapi.json) is checked against it by a test.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	apidoc "github.com/airlock/airlock/api"
	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/httperr"
	"github.com/airlock/airlock/internal/httplimit"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/tracing"

	"go.opentelemetry.io/otel/trace"
)

// MaxBodyBytes caps every request body.
const MaxBodyBytes = 1 << 20

// Options tune the handler. The zero value is ready to use.
type Options struct {
	// Logger receives internal errors (nil: slog.Default()).
	Logger *slog.Logger
	// KeepAlive is the interval of SSE keep-alive comments (0: 15 s).
	KeepAlive time.Duration
	// MaxStreamsPerKey caps the SSE event streams one API key holds open
	// at once (0: DefaultMaxStreamsPerKey); one more gets 429.
	MaxStreamsPerKey int
	// Observe, when set, is called after every request to a route with its
	// method, route pattern (e.g. "/v1/sandboxes/{id}"), answer status and
	// duration (the daemon's Prometheus metrics). An event stream is
	// observed when it ends.
	Observe func(method, route string, status int, d time.Duration)
	// Tracer, when it records (internal/tracing), gives every request a
	// server span named "METHOD /route/{pattern}" with the org and the
	// sandbox it acts on; the operation a request writes annotates it and
	// keeps its trace context (the store does both). A client's
	// traceparent is not trusted: each request starts its own trace.
	Tracer trace.TracerProvider
}

type server struct {
	svc       *service.Service
	log       *slog.Logger
	keepAlive time.Duration
	streams   streamCounter
	observe   func(method, route string, status int, d time.Duration)
	tracer    trace.Tracer // nil: tracing off
}

// route is one endpoint. auth=false routes are public.
type route struct {
	method, path string
	auth         bool
	h            func(s *server, w http.ResponseWriter, r *http.Request, p service.Principal) error
}

// routes is every endpoint the server serves; api/openapi.json must list
// exactly these (see TestOpenAPICoversRoutes).
var routes = []route{
	{"GET", "/healthz", false, (*server).healthz},
	{"GET", "/v1/openapi.json", false, (*server).openapi},
	{"POST", "/v1/sandboxes", true, (*server).createSandbox},
	{"GET", "/v1/sandboxes", true, (*server).listSandboxes},
	{"GET", "/v1/sandboxes/{id}", true, (*server).getSandbox},
	{"DELETE", "/v1/sandboxes/{id}", true, (*server).deleteSandbox},
	{"GET", "/v1/sandboxes/{id}/events", true, (*server).sandboxEvents},
	{"POST", "/v1/sandboxes/{id}/pause", true, (*server).pauseSandbox},
	{"POST", "/v1/sandboxes/{id}/resume", true, (*server).resumeSandbox},
	{"POST", "/v1/sandboxes/{id}/suspend", true, (*server).suspendSandbox},
	{"POST", "/v1/sandboxes/{id}/wake", true, (*server).wakeSandbox},
	{"POST", "/v1/sandboxes/{id}/checkpoints", true, (*server).createCheckpoint},
	{"GET", "/v1/sandboxes/{id}/checkpoints", true, (*server).listCheckpoints},
	{"DELETE", "/v1/sandboxes/{id}/checkpoints/{name}", true, (*server).deleteCheckpoint},
	{"GET", "/v1/sandboxes/{id}/checkpoints/{name}/export", true, (*server).exportCheckpoint},
	{"POST", "/v1/sandboxes/{id}/rollback", true, (*server).rollbackSandbox},
	{"POST", "/v1/sandboxes/{id}/commands", true, (*server).createCommand},
	{"GET", "/v1/sandboxes/{id}/commands", true, (*server).listCommands},
	{"POST", "/v1/sandboxes/{id}/files/session", true, (*server).filesSession},
	{"GET", "/v1/operations/{id}", true, (*server).getOperation},
	{"GET", "/v1/events", true, (*server).allEvents},
	{"GET", "/v1/templates", true, (*server).listTemplates},
	{"GET", "/v1/templates/{ref}", true, (*server).getTemplate},
	{"POST", "/v1/templates", true, (*server).importTemplate},
	{"PUT", "/v1/templates/files/{hash}", true, (*server).putBuildFile},
	{"HEAD", "/v1/templates/files/{hash}", true, (*server).headBuildFile},
	{"POST", "/v1/templates/builds", true, (*server).startBuild},
	{"GET", "/v1/templates/builds", true, (*server).listBuilds},
	{"GET", "/v1/templates/builds/{id}", true, (*server).getBuild},
	{"GET", "/v1/templates/builds/{id}/events", true, (*server).buildEvents},
	{"DELETE", "/v1/templates/{ref}", true, (*server).deleteTemplate},
	{"POST", "/v1/orgs", true, (*server).createOrg},
	{"GET", "/v1/orgs", true, (*server).listOrgs},
	{"GET", "/v1/orgs/{id}", true, (*server).getOrg},
	{"PATCH", "/v1/orgs/{id}", true, (*server).updateOrg},
	{"POST", "/v1/orgs/{id}/keys", true, (*server).createKey},
	{"GET", "/v1/orgs/{id}/keys", true, (*server).listKeys},
	{"DELETE", "/v1/orgs/{id}/keys/{key}", true, (*server).revokeKey},
	{"GET", "/v1/pools", true, (*server).listPools},
	{"PUT", "/v1/pools/{template}", true, (*server).setPool},
	{"DELETE", "/v1/pools/{template}", true, (*server).deletePool},
	{"GET", "/v1/workers", true, (*server).listWorkers},
	{"GET", "/v1/workers/{id}", true, (*server).getWorker},
	{"POST", "/v1/workers/{id}/cordon", true, (*server).cordonWorker},
	{"POST", "/v1/workers/{id}/uncordon", true, (*server).uncordonWorker},
	{"POST", "/v1/workers/{id}/drain", true, (*server).drainWorker},
	{"GET", "/v1/sandboxes/{id}/network", true, (*server).getSandboxNetwork},
	{"PUT", "/v1/sandboxes/{id}/network", true, (*server).setSandboxNetwork},
	{"GET", "/v1/sandboxes/{id}/network/log", true, (*server).networkLog},
	{"GET", "/v1/network-profiles", true, (*server).listNetworkProfiles},
	{"GET", "/v1/network-profiles/{name}", true, (*server).getNetworkProfile},
	{"PUT", "/v1/network-profiles/{name}", true, (*server).putNetworkProfile},
	{"DELETE", "/v1/network-profiles/{name}", true, (*server).deleteNetworkProfile},
	{"GET", "/v1/secrets", true, (*server).listSecrets},
	{"PUT", "/v1/secrets/{name}", true, (*server).putSecret},
	{"DELETE", "/v1/secrets/{name}", true, (*server).deleteSecret},
	{"GET", "/v1/network/ca", true, (*server).getOrgCA},
}

// New returns the handler of the native API.
func New(svc *service.Service, opts Options) http.Handler {
	s := &server{svc: svc, log: opts.Logger, keepAlive: opts.KeepAlive, streams: streamCounter{max: opts.MaxStreamsPerKey}, observe: opts.Observe}
	if s.streams.max <= 0 {
		s.streams.max = DefaultMaxStreamsPerKey
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if tracing.On(opts.Tracer) {
		s.tracer = tracing.Tracer(opts.Tracer)
	}
	if s.keepAlive <= 0 {
		s.keepAlive = 15 * time.Second
	}
	mux := http.NewServeMux()
	for _, rt := range routes {
		mux.Handle(rt.method+" "+rt.path, s.wrap(rt))
	}
	return &jsonMux{mux: mux, s: s}
}

// wrap authenticates (for auth routes) and writes the handler's error.
func (s *server) wrap(rt route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.observe != nil {
			sw := &statusWriter{ResponseWriter: w}
			t0 := time.Now()
			defer func() { s.observe(rt.method, rt.path, sw.code(), time.Since(t0)) }()
			w = sw
		}
		var span trace.Span
		if s.tracer != nil {
			var ctx context.Context
			ctx, span = tracing.ServerSpan(s.tracer, r, rt.method+" "+rt.path, false)
			if id := r.PathValue("id"); id != "" && strings.HasPrefix(rt.path, "/v1/sandboxes/{id}") {
				span.SetAttributes(tracing.SandboxID.String(id))
			}
			r = r.WithContext(ctx)
			tw := &tracing.StatusWriter{ResponseWriter: w}
			defer func() { tracing.EndServer(span, tw.Code()) }()
			w = tw
		}
		var p service.Principal
		if rt.auth {
			var err error
			p, err = s.svc.Authenticate(r.Context(), bearer(r))
			if err != nil {
				s.writeError(w, r, err)
				return
			}
			if span != nil {
				span.SetAttributes(tracing.OrgID.String(p.OrgID))
			}
		}
		if err := rt.h(s, w, r, p); err != nil {
			s.writeError(w, r, err)
		}
	})
}

func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// jsonMux turns the ServeMux's plain-text 404 and 405 answers into JSON
// error bodies.
type jsonMux struct {
	mux *http.ServeMux
	s   *server
}

func (m *jsonMux) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h, pattern := m.mux.Handler(r)
	if pattern != "" {
		m.mux.ServeHTTP(w, r)
		return
	}
	rec := &statusRecorder{header: http.Header{}}
	h.ServeHTTP(rec, r)
	switch rec.status {
	case http.StatusNotFound:
		m.s.writeError(w, r, model.Errorf(model.ErrNotFound, "no such endpoint: %s %s; GET /v1/openapi.json lists them", r.Method, r.URL.Path))
	case http.StatusMethodNotAllowed:
		w.Header().Set("Allow", rec.header.Get("Allow"))
		m.s.writeError(w, r, errMethod{fmt.Sprintf("method %s is not allowed on %s; allowed: %s", r.Method, r.URL.Path, rec.header.Get("Allow"))})
	default: // e.g. a redirect to the cleaned path
		for k, v := range rec.header {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.status)
		w.Write(rec.body)
	}
}

type statusRecorder struct {
	header http.Header
	status int
	body   []byte
}

func (r *statusRecorder) Header() http.Header { return r.header }
func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}
func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	r.body = append(r.body, b...)
	return len(b), nil
}

// errBadRequest is a malformed request: bad JSON, unknown field, bad query.
type errBadRequest struct{ msg string }

func (e errBadRequest) Error() string { return e.msg }

func badRequest(format string, args ...any) error { return errBadRequest{fmt.Sprintf(format, args...)} }

type errMethod struct{ msg string }

func (e errMethod) Error() string { return e.msg }

// writeError is the one place that maps errors to HTTP statuses and codes.
func (s *server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	status, code, msg := http.StatusInternalServerError, apitypes.CodeInternal, "internal error; the server log has the details"
	var (
		bad   errBadRequest
		meth  errMethod
		big   *http.MaxBytesError
		limit *service.RateLimitError
	)
	switch {
	case errors.As(err, &bad):
		status, code, msg = http.StatusBadRequest, apitypes.CodeBadRequest, bad.msg
	case errors.As(err, &meth):
		status, code, msg = http.StatusMethodNotAllowed, apitypes.CodeMethod, meth.msg
	case errors.As(err, &big):
		status, code, msg = http.StatusRequestEntityTooLarge, apitypes.CodeTooLarge, fmt.Sprintf("request body is larger than %d bytes", big.Limit)
	case errors.Is(err, model.ErrTooLarge):
		status, code, msg = http.StatusRequestEntityTooLarge, apitypes.CodeTooLarge, err.Error()
	case isSentinel(err):
		// The /v1 table (httperr.Public): the internal one, but for
		// ErrInvalid, which users have always seen as 422 "unprocessable".
		status, code = httperr.Public.Status(err)
		msg = err.Error() + hintText(err)
		switch {
		case status == http.StatusUnauthorized:
			w.Header().Set("WWW-Authenticate", `Bearer realm="airlock"`)
		case code == apitypes.CodeRateLimited:
			// A quota has no Retry-After: waiting does not help, freeing
			// something does.
			retry := time.Second
			if errors.As(err, &limit) {
				retry = limit.RetryAfter
			}
			w.Header().Set("Retry-After", strconv.Itoa(int((retry+time.Second-1)/time.Second)))
		}
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		return // the client went away
	default:
		s.log.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeJSON(w, status, apitypes.ErrorResponse{Error: apitypes.ErrorBody{Code: code, Message: msg}})
}

// isSentinel reports whether err is one of the model sentinels the /v1
// table maps.
func isSentinel(err error) bool {
	_, ok := httperr.Public.Lookup(err)
	return ok
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode response: %w", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
	return nil
}

// decode reads a JSON body into v: at most MaxBodyBytes, no unknown fields,
// one value. An empty body leaves v as is when emptyOK.
func decode(w http.ResponseWriter, r *http.Request, v any, emptyOK bool) error {
	r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var big *http.MaxBytesError
		switch {
		case errors.As(err, &big):
			return err
		case errors.Is(err, io.EOF):
			if emptyOK {
				return nil
			}
			return badRequest("request body is empty; send a JSON object")
		case errors.Is(err, httplimit.ErrBodyStalled):
			return badRequest("%v; send the body without long pauses", err)
		default:
			return badRequest("request body is not valid JSON for this endpoint: %v", err)
		}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var big *http.MaxBytesError
		if errors.As(err, &big) {
			return err
		}
		return badRequest("request body has data after the JSON value")
	}
	return nil
}

func (s *server) healthz(w http.ResponseWriter, r *http.Request, _ service.Principal) error {
	if err := s.svc.CheckReady(r.Context()); err != nil {
		return writeJSON(w, http.StatusServiceUnavailable, apitypes.Health{Status: "unavailable", Reason: err.Error()})
	}
	return writeJSON(w, http.StatusOK, apitypes.Health{Status: "ok"})
}

func (s *server) openapi(w http.ResponseWriter, r *http.Request, _ service.Principal) error {
	w.Header().Set("Content-Type", "application/json")
	w.Write(apidoc.OpenAPI)
	return nil
}

// statusWriter records the status a handler answers; Unwrap keeps
// http.ResponseController (flushes, deadlines) reaching the real writer.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) code() int {
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}
