package daemon

import (
	"context"
	"flag"
	"log/slog"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/tracing"
	"github.com/airlock/airlock/internal/workerapi"
)

// addTraceFlag adds --otlp-endpoint (docs/operations.md "Traces").
func addTraceFlag(fs *flag.FlagSet) *string {
	return fs.String("otlp-endpoint", "", tracing.FlagUsage)
}

// startTracing returns the tracer provider of role service (no-op when
// neither the flag nor the OTEL_EXPORTER_OTLP_*ENDPOINT variables name an
// endpoint) and says where spans go.
func startTracing(ctx context.Context, service, endpoint string, log *slog.Logger) (*tracing.Provider, error) {
	p, err := tracing.New(ctx, tracing.Config{Service: service, Endpoint: endpoint})
	if err != nil {
		return nil, err
	}
	if p.Enabled() {
		log.Info("tracing on", "service", service, "otlp_endpoint", p.Endpoint)
	}
	return p, nil
}

// tracedDataPlane gives the server's calls to workers' data planes client
// spans and the traceparent header, so the worker's server spans join the
// request's trace; dp as it is without tracing.
func tracedDataPlane(dp service.DataPlane, tp trace.TracerProvider) service.DataPlane {
	if !tracing.On(tp) {
		return dp
	}
	var base *workerapi.DataPlane
	switch d := dp.(type) {
	case nil:
		base = &workerapi.DataPlane{}
	case *workerapi.DataPlane:
		c := *d
		base = &c
	default:
		return dp // someone else's implementation
	}
	wrap := func(c *http.Client, timeout time.Duration) *http.Client {
		out := http.Client{Timeout: timeout}
		if c != nil {
			out = *c
		}
		out.Transport = tracing.Transport(tp, out.Transport, true)
		return &out
	}
	stream := base.Stream
	if stream == nil && base.HTTP != nil {
		stream = &http.Client{Transport: base.HTTP.Transport}
	}
	base.HTTP = wrap(base.HTTP, 30*time.Second)
	base.Stream = wrap(stream, 0)
	return base
}
