package api_test

import (
	"bufio"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/airlock/airlock/internal/api"
	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/store/sqlite"
)

// TestEventStreamWithTracingAndMetrics: with both the metrics hook and a
// recording tracer wrapping the response, an event stream still streams
// (its keep-alive arrives while the stream is open), and the request got
// a server span named by its route.
func TestEventStreamWithTracingAndMetrics(t *testing.T) {
	ctx := t.Context()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	svc := service.New(service.Config{Store: st, Events: events.New(st), Kick: func() {}})
	key, _, err := svc.Bootstrap(ctx)
	if err != nil {
		t.Fatal(err)
	}
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	srv := httptest.NewServer(api.New(svc, api.Options{KeepAlive: 50 * time.Millisecond, Tracer: tp,
		Observe: func(string, string, int, time.Duration) {}}))
	defer srv.Close()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/v1/events", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close() // before srv.Close, which waits for the stream
	got := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(resp.Body).ReadString('\n')
		got <- line
	}()
	select {
	case line := <-got:
		if line == "" {
			t.Fatalf("stream ended without a line")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no keep-alive within 5 s: the stream is buffered")
	}
	resp.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	for len(spans.Ended()) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	ended := spans.Ended()
	if len(ended) != 1 || ended[0].Name() != "GET /v1/events" {
		names := []string{}
		for _, s := range ended {
			names = append(names, s.Name())
		}
		t.Fatalf("spans = %q, want one GET /v1/events", names)
	}
}
