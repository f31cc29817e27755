package worker

// Traces (docs/operations.md "Traces"): the worker's spans for an action
// (start, pause, resume, suspend, wake, delete, a task) join the trace of
// the operation the sandbox's assignment names (workerapi.OperationRef,
// sent by a server that traces); the runtime steps inside an action
// (boot, restore, checkpoint, pause, delete) and the worker's calls to the
// agent are its children. The agent is never given the trace context: the
// guest is untrusted and never reaches the collector; the worker records
// client spans for its calls instead.

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/tracing"
	"github.com/airlock/airlock/internal/workerapi"
)

var noSpan = trace.SpanFromContext(context.Background())

// recordOperations keeps the operations the assignments serve; w.mu is
// held.
func (w *Worker) recordOperations(as []workerapi.Assignment) {
	if w.tracer == nil {
		return
	}
	refs := make(map[string]*workerapi.OperationRef, len(as))
	for _, a := range as {
		if a.Operation != nil {
			refs[a.Sandbox.ID] = a.Operation
		}
	}
	w.opRefs = refs
}

// actionSpan starts the span of action name on sandbox id in the trace of
// the operation its assignment serves; w.mu is held. Without tracing, or
// without such an operation (an adoption, a retry the server did not
// ask for), it is a no-op span and ctx as it is.
func (w *Worker) actionSpan(ctx context.Context, id, name string) (context.Context, trace.Span) {
	ref := w.opRefs[id]
	if w.tracer == nil || ref == nil {
		return ctx, noSpan
	}
	ctx = tracing.WithTraceParent(ctx, ref.TraceParent)
	return w.tracer.Start(ctx, "worker."+name, trace.WithAttributes(
		tracing.SandboxID.String(id), tracing.OperationID.String(ref.ID),
		tracing.OperationKind.String(string(ref.Kind)), tracing.OrgID.String(ref.OrgID),
		tracing.WorkerID.String(w.cfg.ID)))
}

// stepSpan starts a child span of ctx's action span for one runtime step
// (nothing when ctx has no recording span); end records the step's error.
func (w *Worker) stepSpan(ctx context.Context, id, name string) (context.Context, func(error)) {
	if w.tracer == nil || !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, func(error) {}
	}
	ctx, span := w.tracer.Start(ctx, name, trace.WithAttributes(tracing.SandboxID.String(id)))
	return ctx, func(err error) { tracing.End(span, err) }
}

// endAction ends an action's span with the sandbox's outcome.
func endAction(span trace.Span, state model.SandboxState, err error) {
	if span.IsRecording() {
		span.SetAttributes(attribute.String("airlock.sandbox.state", string(state)))
	}
	tracing.End(span, err)
}

// newAgentClient is a client of h's agent whose calls get client spans
// (when tracing) without a traceparent header.
func (w *Worker) newAgentClient(h runtime.Sandbox) *agentclient.Client {
	ac := newAgentClient(h)
	if w.tracer != nil {
		ac.WrapTransport(func(rt http.RoundTripper) http.RoundTripper {
			return tracing.Transport(w.cfg.Tracer, rt, false)
		})
	}
	return ac
}

// waitAgent waits for ac's agent to answer, as a step of ctx's action.
func (w *Worker) waitAgent(ctx context.Context, id string, ac *agentclient.Client) (err error) {
	ctx, end := w.stepSpan(ctx, id, "agent.wait_ready")
	defer func() { end(err) }()
	return ac.WaitReady(ctx)
}
