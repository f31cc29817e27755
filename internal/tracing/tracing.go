// Package tracing is Airlock's OpenTelemetry wiring: a tracer provider per
// daemon role (airlock-server, airlock-worker) that exports OTLP/HTTP when
// an endpoint is configured and is OpenTelemetry's no-op provider
// otherwise (no exporter, no goroutine, spans that record nothing), the
// W3C trace context as the one string an operation keeps in the store
// (TraceParent, WithTraceParent), server and client span helpers for the
// internal HTTP surfaces, and a slog handler that adds the trace id to
// log records written with a context.
//
// Components take a trace.TracerProvider (nil: no-op) rather than using
// the global one: `airlock up` runs a server and a worker in one process,
// each with its own service.name.
package tracing

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/model"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Service names, one per role.
const (
	ServiceServer = "airlock-server"
	ServiceWorker = "airlock-worker"
)

// Instrumentation scope of every tracer.
const scope = "github.com/airlock/airlock"

// Attribute keys Airlock's spans carry.
const (
	SandboxID     = attribute.Key("airlock.sandbox.id")
	OperationID   = attribute.Key("airlock.operation.id")
	OperationKind = attribute.Key("airlock.operation.kind")
	OrgID         = attribute.Key("airlock.org.id")
	WorkerID      = attribute.Key("airlock.worker.id")
	Result        = attribute.Key("airlock.result")
)

// Env vars of the OTLP exporter that turn tracing on (the standard ones;
// the exporter reads the rest of OTEL_EXPORTER_OTLP_* itself).
const (
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
)

// FlagUsage is the --otlp-endpoint flag's help.
const FlagUsage = "OTLP/HTTP base `URL` to export traces to, e.g. http://127.0.0.1:4318 (traces go to <URL>/v1/traces); default $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or $OTEL_EXPORTER_OTLP_ENDPOINT; none: tracing off"

// Provider is one role's tracer provider.
type Provider struct {
	tp  trace.TracerProvider
	sdk *sdktrace.TracerProvider // nil: no-op
	// Endpoint is where spans go ("" when off; "(environment)" when the
	// exporter takes it from OTEL_EXPORTER_OTLP_*).
	Endpoint string
}

// Config configures New.
type Config struct {
	Service string // service.name
	// Endpoint is the --otlp-endpoint flag: a base URL as
	// OTEL_EXPORTER_OTLP_ENDPOINT ("/v1/traces" is appended). Empty: the
	// environment decides.
	Endpoint string
	// Getenv reads the environment (nil: os.Getenv).
	Getenv func(string) string
	// Options are added to the SDK provider's (tests: a synchronous
	// span processor).
	Options []sdktrace.TracerProviderOption
	// Sync exports each span as it ends instead of in batches (tests).
	Sync bool
}

// New returns cfg.Service's provider: exporting over OTLP/HTTP when
// cfg.Endpoint or one of the OTEL_EXPORTER_OTLP_*ENDPOINT variables is
// set, the no-op provider otherwise.
func New(ctx context.Context, cfg Config) (*Provider, error) {
	getenv := cfg.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	var opts []otlptracehttp.Option
	endpoint := strings.TrimSpace(cfg.Endpoint)
	switch {
	case endpoint != "":
		if !strings.HasPrefix(endpoint, "http://") && !strings.HasPrefix(endpoint, "https://") {
			return nil, fmt.Errorf("--otlp-endpoint %q: want an http:// or https:// URL", endpoint)
		}
		endpoint = strings.TrimSuffix(endpoint, "/") + "/v1/traces"
		opts = append(opts, otlptracehttp.WithEndpointURL(endpoint))
	case getenv(EnvTracesEndpoint) != "" || getenv(EnvEndpoint) != "":
		endpoint = "(environment)" // the exporter reads the variables
	default:
		return &Provider{tp: noop.NewTracerProvider()}, nil
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("otlp trace exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(cfg.Service)))
	if err != nil {
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	po := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if cfg.Sync {
		po = append(po, sdktrace.WithSyncer(exp))
	} else {
		po = append(po, sdktrace.WithBatcher(exp))
	}
	sdk := sdktrace.NewTracerProvider(append(po, cfg.Options...)...)
	return &Provider{tp: sdk, sdk: sdk, Endpoint: endpoint}, nil
}

// TracerProvider is p's provider (no-op for a nil p).
func (p *Provider) TracerProvider() trace.TracerProvider {
	if p == nil || p.tp == nil {
		return noop.NewTracerProvider()
	}
	return p.tp
}

// Enabled reports whether p exports spans.
func (p *Provider) Enabled() bool { return p != nil && p.sdk != nil }

// Shutdown flushes and stops p's exporter (nothing for a no-op p).
func (p *Provider) Shutdown(ctx context.Context) error {
	if !p.Enabled() {
		return nil
	}
	return p.sdk.Shutdown(ctx)
}

// ForceFlush exports every ended span now.
func (p *Provider) ForceFlush(ctx context.Context) error {
	if !p.Enabled() {
		return nil
	}
	return p.sdk.ForceFlush(ctx)
}

// Tracer is tp's Airlock tracer; a nil tp gives the no-op one.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return tp.Tracer(scope)
}

// On reports whether tp records spans (false for nil and the no-op).
func On(tp trace.TracerProvider) bool {
	if tp == nil {
		return false
	}
	_, noopTP := tp.(noop.TracerProvider)
	return !noopTP
}

var w3c = propagation.TraceContext{}

// TraceParent is the W3C traceparent of ctx's span ("" without a valid
// one): what an operation keeps so that whoever acts on it later joins the
// trace of the request that made it.
func TraceParent(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	w3c.Inject(ctx, c)
	return c["traceparent"]
}

// MaxTraceParent bounds a traceparent Airlock accepts (version 00 is 55
// bytes; later versions may append fields).
const MaxTraceParent = 128

// WithTraceParent returns ctx with the remote span context tp names as the
// parent of the spans started from it; ctx as it is when tp is empty,
// too long or not a valid traceparent.
func WithTraceParent(ctx context.Context, tp string) context.Context {
	if tp == "" || len(tp) > MaxTraceParent {
		return ctx
	}
	out := w3c.Extract(ctx, propagation.MapCarrier{"traceparent": tp})
	if !trace.SpanContextFromContext(out).IsValid() {
		return ctx
	}
	return out
}

// End sets span's status from err (the error recorded) and ends it.
func End(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(Result.String("error"))
	} else {
		span.SetAttributes(Result.String("ok"))
	}
	span.End()
}

// ServerSpan starts a server span for r named name (a route pattern),
// continuing the trace of r's traceparent header when trust is set.
func ServerSpan(tr trace.Tracer, r *http.Request, name string, trust bool) (context.Context, trace.Span) {
	ctx := r.Context()
	if trust {
		ctx = w3c.Extract(ctx, propagation.HeaderCarrier(r.Header))
	}
	return tr.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			attribute.String("http.request.method", r.Method),
			attribute.String("http.route", strings.TrimPrefix(name, r.Method+" ")),
			attribute.String("url.path", r.URL.Path),
		))
}

// EndServer records status on span (5xx is an error) and ends it.
func EndServer(span trace.Span, status int) {
	if status == 0 {
		status = http.StatusOK
	}
	span.SetAttributes(attribute.Int("http.response.status_code", status))
	if status >= 500 {
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	span.End()
}

// Middleware gives every request to next a server span named after the
// route pattern next's ServeMux matched ("METHOD /path/{id}"), continuing
// the caller's trace (traceparent) when trust is set. With a no-op tp it
// is next.
func Middleware(tp trace.TracerProvider, trust bool, next http.Handler) http.Handler {
	if !On(tp) {
		return next
	}
	tr := Tracer(tp)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, span := ServerSpan(tr, r, r.Method+" "+r.URL.Path, trust)
		sw := &StatusWriter{ResponseWriter: w}
		r = r.WithContext(ctx)
		defer func() {
			if r.Pattern != "" { // set by the ServeMux on this very request
				span.SetName(routeName(r))
				span.SetAttributes(attribute.String("http.route", r.Pattern))
			}
			if id := r.PathValue("sid"); id != "" {
				span.SetAttributes(SandboxID.String(id))
			} else if id := r.PathValue("id"); id != "" && strings.Contains(r.Pattern, "sandboxes/{id}") {
				span.SetAttributes(SandboxID.String(id))
			}
			EndServer(span, sw.Code())
		}()
		next.ServeHTTP(sw, r)
	})
}

func routeName(r *http.Request) string {
	if strings.HasPrefix(r.Pattern, r.Method+" ") {
		return r.Pattern
	}
	return r.Method + " " + r.Pattern
}

// StatusWriter remembers the status a handler wrote; it passes Flush and
// Unwrap on, so streaming and http.ResponseController keep working.
type StatusWriter struct {
	http.ResponseWriter
	code int
}

func (w *StatusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *StatusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush and FlushError flush through whatever w wraps, following Unwrap
// (a writer that only unwraps, such as the API's metrics recorder, still
// streams).
func (w *StatusWriter) Flush() { _ = w.FlushError() }

func (w *StatusWriter) FlushError() error {
	return http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *StatusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack passes a WebSocket upgrade through (101 counted as the status).
func (w *StatusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil && w.code == 0 {
		w.code = http.StatusSwitchingProtocols
	}
	return c, rw, err
}

// Code is the status written (0 if none yet).
func (w *StatusWriter) Code() int { return w.code }

// Transport records a client span for every request through base (nil:
// http.DefaultTransport) when ctx carries a recording span or tp is on,
// and, when inject is set, sends the W3C traceparent with it. The worker
// never injects into the agent's requests: the guest is not part of the
// trace.
func Transport(tp trace.TracerProvider, base http.RoundTripper, inject bool) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	if !On(tp) {
		return base
	}
	return &transport{tr: Tracer(tp), base: base, inject: inject}
}

type transport struct {
	tr     trace.Tracer
	base   http.RoundTripper
	inject bool
}

func (t *transport) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx := r.Context()
	if !trace.SpanContextFromContext(ctx).IsValid() {
		// Only calls made on behalf of a traced request or operation: the
		// worker's polls and health checks would be a trace each.
		return t.base.RoundTrip(r)
	}
	path := r.URL.Path
	if len(path) > 64 {
		path = path[:64]
	}
	ctx, span := t.tr.Start(ctx, r.Method+" "+spanPath(path), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path)))
	r = r.Clone(ctx)
	if t.inject {
		w3c.Inject(ctx, propagation.HeaderCarrier(r.Header))
	}
	resp, err := t.base.RoundTrip(r)
	if err != nil {
		End(span, err)
		return nil, err
	}
	span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
	if resp.StatusCode >= 500 {
		span.SetStatus(codes.Error, resp.Status)
	}
	span.End()
	return resp, nil
}

// spanPath keeps a client span's name low in cardinality: ids in the path
// (segments with a digit) become "*".
func spanPath(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		if strings.ContainsAny(s, "0123456789") {
			segs[i] = "*"
		}
	}
	return strings.Join(segs, "/")
}

// LogHandler adds trace_id (and span_id) to every record logged with a
// context that carries a valid span; otherwise it is h.
func LogHandler(h slog.Handler) slog.Handler { return logHandler{h} }

type logHandler struct{ slog.Handler }

func (l logHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return l.Handler.Handle(ctx, r)
}

func (l logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return logHandler{l.Handler.WithAttrs(as)}
}

func (l logHandler) WithGroup(name string) slog.Handler { return logHandler{l.Handler.WithGroup(name)} }

// ShutdownTimeout bounds the final flush at a daemon's exit.
const ShutdownTimeout = 5 * time.Second

// ShutdownAll shuts every provider down within ShutdownTimeout.
func ShutdownAll(ps ...*Provider) error {
	ctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	var errs []error
	for _, p := range ps {
		errs = append(errs, p.Shutdown(ctx))
	}
	return errors.Join(errs...)
}

// OperationAttrs are the attributes of a span about op.
func OperationAttrs(op model.Operation) []attribute.KeyValue {
	return []attribute.KeyValue{
		OperationID.String(op.ID), OperationKind.String(string(op.Kind)),
		SandboxID.String(op.SandboxID), OrgID.String(op.OrgID),
	}
}

// AnnotateOperation adds op's attributes to ctx's span (nothing when it
// does not record).
func AnnotateOperation(ctx context.Context, op model.Operation) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(OperationAttrs(op)...)
	}
}
