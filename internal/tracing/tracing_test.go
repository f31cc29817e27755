package tracing_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/tracing"
	"github.com/airlock/airlock/internal/tracing/tracingtest"
)

func noEnv(t *testing.T) {
	t.Setenv(tracing.EnvEndpoint, "")
	t.Setenv(tracing.EnvTracesEndpoint, "")
}

type plain struct{}

func (*plain) ServeHTTP(http.ResponseWriter, *http.Request) {}

// TestOffWithoutEndpoint: with neither the flag nor the variables, the
// provider is OpenTelemetry's no-op: nothing records, nothing is exported,
// no goroutine is started, and the HTTP wrappers are the handlers and
// transports they were given.
func TestOffWithoutEndpoint(t *testing.T) {
	noEnv(t)
	rcv := tracingtest.Start(t)
	before := runtime.NumGoroutine()
	p, err := tracing.New(context.Background(), tracing.Config{Service: tracing.ServiceServer})
	if err != nil {
		t.Fatal(err)
	}
	if p.Enabled() || tracing.On(p.TracerProvider()) {
		t.Fatalf("provider without an endpoint is enabled (endpoint %q)", p.Endpoint)
	}
	ctx, span := tracing.Tracer(p.TracerProvider()).Start(context.Background(), "x")
	if span.IsRecording() || span.SpanContext().IsValid() {
		t.Errorf("span of the no-op provider records or has a valid context")
	}
	if tp := tracing.TraceParent(ctx); tp != "" {
		t.Errorf("traceparent without tracing = %q, want empty", tp)
	}
	span.End()
	h := &plain{}
	if got := tracing.Middleware(p.TracerProvider(), true, h); got != http.Handler(h) {
		t.Errorf("Middleware without tracing wraps the handler")
	}
	if got := tracing.Transport(p.TracerProvider(), http.DefaultTransport, true); got != http.DefaultTransport {
		t.Errorf("Transport without tracing wraps the transport")
	}
	if after := runtime.NumGoroutine(); after > before {
		t.Errorf("goroutines: %d before, %d after a no-op provider", before, after)
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := rcv.Requests(); n != 0 {
		t.Errorf("receiver got %d exports from a no-op provider", n)
	}
}

func exportOne(t *testing.T, cfg tracing.Config) {
	t.Helper()
	p, err := tracing.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Enabled() {
		t.Fatalf("provider with an endpoint is off")
	}
	_, span := tracing.Tracer(p.TracerProvider()).Start(context.Background(), "one")
	span.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestEndpointFromEnvironment: OTEL_EXPORTER_OTLP_ENDPOINT alone turns
// tracing on; spans carry the role's service.name.
func TestEndpointFromEnvironment(t *testing.T) {
	noEnv(t)
	rcv := tracingtest.Start(t)
	t.Setenv(tracing.EnvEndpoint, rcv.URL)
	exportOne(t, tracing.Config{Service: tracing.ServiceWorker})
	got := rcv.Spans()
	if len(got) != 1 || got[0].Name != "one" || got[0].Service != tracing.ServiceWorker {
		t.Fatalf("spans = %+v, want one span of %s", got, tracing.ServiceWorker)
	}
}

// TestEndpointFromTracesVariable: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is the
// whole URL.
func TestEndpointFromTracesVariable(t *testing.T) {
	noEnv(t)
	rcv := tracingtest.Start(t)
	t.Setenv(tracing.EnvTracesEndpoint, rcv.URL+"/v1/traces")
	exportOne(t, tracing.Config{Service: tracing.ServiceServer})
	if n := len(rcv.Spans()); n != 1 {
		t.Fatalf("got %d spans, want 1", n)
	}
}

// TestEndpointFlag: the flag is a base URL, like OTEL_EXPORTER_OTLP_ENDPOINT.
func TestEndpointFlag(t *testing.T) {
	noEnv(t)
	rcv := tracingtest.Start(t)
	exportOne(t, tracing.Config{Service: tracing.ServiceServer, Endpoint: rcv.URL + "/"})
	if got := rcv.Spans(); len(got) != 1 || got[0].Service != tracing.ServiceServer {
		t.Fatalf("spans = %+v", got)
	}
	if _, err := tracing.New(context.Background(), tracing.Config{Endpoint: "collector:4318"}); err == nil {
		t.Errorf("an endpoint without a scheme is accepted")
	}
}

// TestTraceParent: what an operation keeps is the W3C traceparent of the
// span, and only a valid, bounded one is taken back.
func TestTraceParent(t *testing.T) {
	noEnv(t)
	rcv := tracingtest.Start(t)
	p, err := tracing.New(context.Background(), tracing.Config{Service: "t", Endpoint: rcv.URL, Sync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	tr := tracing.Tracer(p.TracerProvider())
	ctx, span := tr.Start(context.Background(), "request")
	defer span.End()
	tp := tracing.TraceParent(ctx)
	want := "00-" + span.SpanContext().TraceID().String() + "-" + span.SpanContext().SpanID().String() + "-01"
	if tp != want {
		t.Fatalf("traceparent = %q, want %q", tp, want)
	}
	_, child := tr.Start(tracing.WithTraceParent(context.Background(), tp), "later")
	if child.SpanContext().TraceID() != span.SpanContext().TraceID() {
		t.Errorf("span from the kept traceparent is in another trace")
	}
	child.End()
	for _, bad := range []string{"", "garbage", "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" + strings.Repeat("x", tracing.MaxTraceParent)} {
		if got := tracing.WithTraceParent(context.Background(), bad); got != context.Background() {
			t.Errorf("WithTraceParent(%q) took it", bad)
		}
	}
}

// TestTransportInject: the worker's agent calls get client spans without
// the traceparent header; the server's data-plane calls send it.
func TestTransportInject(t *testing.T) {
	noEnv(t)
	rcv := tracingtest.Start(t)
	p, err := tracing.New(context.Background(), tracing.Config{Service: "t", Endpoint: rcv.URL, Sync: true})
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.Header.Get("Traceparent"))
	}))
	defer srv.Close()
	ctx, span := tracing.Tracer(p.TracerProvider()).Start(context.Background(), "action")
	for _, inject := range []bool{false, true} {
		c := &http.Client{Transport: tracing.Transport(p.TracerProvider(), nil, inject), Timeout: 10 * time.Second}
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/health", nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	span.End()
	p.Shutdown(context.Background())
	if len(seen) != 2 || seen[0] != "" || !strings.HasPrefix(seen[1], "00-"+span.SpanContext().TraceID().String()) {
		t.Errorf("traceparent headers seen = %q, want none, then one in the action's trace", seen)
	}
	clients := 0
	for _, s := range rcv.Spans() {
		if s.Kind == 3 && s.ParentID == span.SpanContext().SpanID().String() {
			clients++
		}
	}
	if clients != 2 {
		t.Errorf("client spans under the action = %d, want 2", clients)
	}
}

type unwrapOnly struct{ http.ResponseWriter }

func (u unwrapOnly) Unwrap() http.ResponseWriter { return u.ResponseWriter }

// TestStatusWriterStreams: the span's status recorder flushes through a
// writer that only unwraps (the API's metrics recorder), so event streams
// still stream with tracing on.
func TestStatusWriterStreams(t *testing.T) {
	rec := httptest.NewRecorder()
	w := &tracing.StatusWriter{ResponseWriter: unwrapOnly{rec}}
	w.Write([]byte("data: x\n\n"))
	if err := http.NewResponseController(w).Flush(); err != nil || !rec.Flushed {
		t.Errorf("flush through an unwrapping writer: err %v, flushed %v", err, rec.Flushed)
	}
	if w.Code() != http.StatusOK {
		t.Errorf("code = %d", w.Code())
	}
}
