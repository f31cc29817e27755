package daemon

// Traces across the stack: a real server and worker (the stack of
// `airlock up` over the fake runtime: REST API, service, controller,
// worker API over loopback HTTP, worker, its data plane) export to an
// in-test OTLP/HTTP receiver, and each lifecycle operation's spans — the
// API request, the controller's transitions, the worker's action and its
// runtime steps — are one trace with the right parents and attributes.

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime/fake"
	"github.com/airlock/airlock/internal/tracing"
	"github.com/airlock/airlock/internal/tracing/tracingtest"
	"github.com/airlock/airlock/internal/worker"
)

func TestTracesAcrossServerAndWorker(t *testing.T) {
	t.Setenv(tracing.EnvEndpoint, "")
	t.Setenv(tracing.EnvTracesEndpoint, "")
	rcv := tracingtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	newTP := func(service string) *tracing.Provider {
		p, err := tracing.New(ctx, tracing.Config{Service: service, Endpoint: rcv.URL, Sync: true})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	serverTP, workerTP := newTP(tracing.ServiceServer), newTP(tracing.ServiceWorker)
	s := startFakeStackTraced(t, serverTP.TracerProvider(), func(c *worker.Config) { c.Tracer = workerTP.TracerProvider() })

	driveTracedLifecycle(t, ctx, s.c, fake.Name, rcv, serverTP, workerTP)
}

// driveTracedLifecycle drives a sandbox of runtime rt through create,
// pause, resume, suspend, wake and delete on c, then checks the spans rcv
// received from the server's and the worker's providers.
func driveTracedLifecycle(t *testing.T, ctx context.Context, c *client.Client, rt string, rcv *tracingtest.Receiver, serverTP, workerTP *tracing.Provider) {
	t.Helper()
	sb, op, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Runtime: rt, Resources: model.Resources{VCPUs: 1, MemoryMiB: 256}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if op, err = c.WaitOperation(ctx, op.ID); err != nil || op.State != model.OpSucceeded {
		t.Fatalf("create: %v %+v", err, op)
	}
	ops := map[model.OperationKind]string{model.OpCreate: op.ID}
	// A command through the data plane, whose server span wraps the
	// attach's WebSocket (the upgrade passes through it).
	cmd, err := c.CreateCommand(ctx, sb.ID, client.CreateCommandRequest{Argv: []string{"/bin/sh", "-c", "echo traced"}})
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if exit, err := client.RunCommand(ctx, cmd.AttachURL, cmd.Token, nil, &out, &errb); err != nil || exit.ExitCode != 0 || out.String() != "traced\n" {
		t.Fatalf("command with tracing on: %v exit %+v out %q err %q", err, exit, out.String(), errb.String())
	}
	step := func(kind model.OperationKind, req func(context.Context, string) (model.Operation, error), want model.SandboxState) {
		t.Helper()
		op, err := req(ctx, sb.ID)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if op, err = c.WaitOperation(ctx, op.ID); err != nil || op.State != model.OpSucceeded {
			t.Fatalf("%s: %v %+v", kind, err, op)
		}
		if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.State != want {
			t.Fatalf("after %s: %v, state %s, want %s", kind, err, got.State, want)
		}
		ops[kind] = op.ID
	}
	step(model.OpPause, c.PauseSandbox, model.StatePaused)
	step(model.OpResume, c.ResumeSandbox, model.StateRunning)
	step(model.OpSuspend, c.SuspendSandbox, model.StateSuspended)
	step(model.OpWake, c.WakeSandbox, model.StateRunning)
	step(model.OpDelete, c.DeleteSandbox, model.StateDeleted)
	// A worker's action span ends after the action reported the outcome
	// that completed the operation (a wake still retires the snapshot it
	// came from): give the last ones a moment.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		got := rcv.Spans()
		done := true
		for _, name := range []string{"worker.start", "worker.pause", "worker.resume", "worker.suspend", "worker.wake", "worker.delete"} {
			done = done && hasSpan(got, tracing.ServiceWorker, name)
		}
		if done {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := tracing.ShutdownAll(serverTP, workerTP); err != nil {
		t.Fatal(err)
	}
	spans := rcv.Spans()

	// Per operation: the API request's server span is the trace's root; the
	// controller's transitions and the worker's action are its children;
	// the worker's runtime steps are the action's.
	cases := []struct {
		kind    model.OperationKind
		request string // the API span
		action  string // the worker's span
		steps   []string
	}{
		{model.OpCreate, "POST /v1/sandboxes", "worker.start", []string{"runtime.boot", "agent.wait_ready"}},
		{model.OpPause, "POST /v1/sandboxes/{id}/pause", "worker.pause", []string{"runtime.pause"}},
		{model.OpResume, "POST /v1/sandboxes/{id}/resume", "worker.resume", []string{"runtime.resume"}},
		{model.OpSuspend, "POST /v1/sandboxes/{id}/suspend", "worker.suspend", []string{"runtime.checkpoint", "runtime.delete"}},
		{model.OpWake, "POST /v1/sandboxes/{id}/wake", "worker.wake", []string{"runtime.restore", "agent.wait_ready"}},
		{model.OpDelete, "DELETE /v1/sandboxes/{id}", "worker.delete", []string{"runtime.delete"}},
	}
	traces := map[string]int{}
	for _, sp := range spans {
		traces[sp.TraceID]++
	}
	t.Logf("%d spans in %d traces from %d export requests", len(spans), len(traces), rcv.Requests())
	for _, c := range cases {
		t.Run(string(c.kind), func(t *testing.T) {
			opID := ops[c.kind]
			req := find(spans, func(s tracingtest.Span) bool {
				return s.Service == tracing.ServiceServer && s.Name == c.request && s.Attrs["airlock.operation.id"] == opID
			})
			if len(req) != 1 {
				t.Fatalf("API spans %q of operation %s: %d, want 1\n%s", c.request, opID, len(req), dump(spans))
			}
			root := req[0]
			if root.ParentID != "" || root.Kind != 2 {
				t.Errorf("API span: parent %q kind %d, want a root server span", root.ParentID, root.Kind)
			}
			checkAttrs(t, root, sb.ID, opID, c.kind, sb.OrgID)
			inTrace := find(spans, func(s tracingtest.Span) bool { return s.TraceID == root.TraceID })
			t.Logf("operation %s: %d spans in its trace", opID, len(inTrace))

			ctrl := find(inTrace, func(s tracingtest.Span) bool {
				return s.Service == tracing.ServiceServer && strings.HasPrefix(s.Name, "controller: ")
			})
			if len(ctrl) == 0 {
				t.Errorf("no controller span in the trace of %s\n%s", opID, dump(inTrace))
			}
			for _, cs := range ctrl {
				if cs.ParentID != root.SpanID {
					t.Errorf("controller span %q: parent %s, want the API span %s", cs.Name, cs.ParentID, root.SpanID)
				}
				checkAttrs(t, cs, sb.ID, opID, c.kind, sb.OrgID)
			}

			act := find(inTrace, func(s tracingtest.Span) bool { return s.Service == tracing.ServiceWorker && s.Name == c.action })
			if len(act) != 1 {
				t.Fatalf("worker spans %q in the trace of %s: %d, want 1\n%s\nall worker spans:\n%s", c.action, opID, len(act), dump(inTrace),
					dump(find(spans, func(s tracingtest.Span) bool { return s.Service == tracing.ServiceWorker && s.Kind != 3 })))
			}
			a := act[0]
			if a.ParentID != root.SpanID {
				t.Errorf("worker span %q: parent %s, want the API span %s", a.Name, a.ParentID, root.SpanID)
			}
			if a.Error || a.Attrs["airlock.result"] != "ok" {
				t.Errorf("worker span %q: error %v result %q, want ok", a.Name, a.Error, a.Attrs["airlock.result"])
			}
			checkAttrs(t, a, sb.ID, opID, c.kind, sb.OrgID)
			for _, name := range c.steps {
				st := find(inTrace, func(s tracingtest.Span) bool { return s.Service == tracing.ServiceWorker && s.Name == name })
				if len(st) == 0 {
					t.Errorf("no worker step %q in the trace of %s\n%s", name, opID, dump(inTrace))
					continue
				}
				for _, x := range st {
					if x.ParentID != a.SpanID || x.Attrs["airlock.sandbox.id"] != sb.ID {
						t.Errorf("step %q: parent %s sandbox %q, want the action %s and %s", name, x.ParentID, x.Attrs["airlock.sandbox.id"], a.SpanID, sb.ID)
					}
				}
			}
		})
	}
	if dp := find(spans, func(s tracingtest.Span) bool {
		return s.Service == tracing.ServiceWorker && s.Kind == 2 && s.Attrs["airlock.sandbox.id"] == sb.ID
	}); len(dp) == 0 {
		t.Errorf("no data-plane server span for the command's attach\n%s", dump(spans))
	}
	// The worker's calls to the agent are client spans under its actions,
	// never sent to the guest (tracing.Transport without inject).
	if agent := find(spans, func(s tracingtest.Span) bool { return s.Service == tracing.ServiceWorker && s.Kind == 3 }); len(agent) == 0 {
		t.Errorf("no client span for the worker's agent calls\n%s", dump(spans))
	}
}

func checkAttrs(t *testing.T, s tracingtest.Span, sandbox, op string, kind model.OperationKind, org string) {
	t.Helper()
	for k, want := range map[string]string{
		"airlock.sandbox.id": sandbox, "airlock.operation.id": op,
		"airlock.operation.kind": string(kind), "airlock.org.id": org,
	} {
		if got := s.Attrs[k]; got != want {
			t.Errorf("span %q (%s): %s = %q, want %q", s.Name, s.Service, k, got, want)
		}
	}
}

func find(spans []tracingtest.Span, f func(tracingtest.Span) bool) []tracingtest.Span {
	var out []tracingtest.Span
	for _, s := range spans {
		if f(s) {
			out = append(out, s)
		}
	}
	return out
}

func hasSpan(spans []tracingtest.Span, service, name string) bool {
	return len(find(spans, func(s tracingtest.Span) bool { return s.Service == service && s.Name == name })) > 0
}

func dump(spans []tracingtest.Span) string {
	lines := make([]string, 0, len(spans))
	for _, s := range spans {
		lines = append(lines, fmt.Sprintf("  %s %s span=%s parent=%s %s %q op=%s", s.TraceID[:8], s.Service, s.SpanID[:8], s.ParentID, s.Name, s.Attrs["airlock.transition"], s.Attrs["airlock.operation.id"]))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
