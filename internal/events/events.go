// Package events appends state changes to the store's event log and wakes
// the SSE streams and long polls that wait on it. Every component that
// changes a sandbox or an operation reports the change here, so the log is
// the one ordered history clients can follow.
package events

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/notify"
	"github.com/airlock/airlock/internal/store"
)

// Event types.
const (
	TypeSandbox   = "sandbox.state"
	TypeOperation = "operation.state"
	// TypeNetworkDenied is an egress denial of a sandbox's gateway
	// (model.NetDenial), published by the controller from the worker's
	// Sync under a per-sandbox rate limit (docs/network.md).
	TypeNetworkDenied = "network.denied"
)

// Log publishes events. Waiters use Changed() to learn that new events (or
// any state change) may exist; SSE streams Subscribe to the one fan-out
// instead of each reading the store per wake-up. With Listen running,
// other servers' appends to the same database wake them too.
type Log struct {
	Store store.Store
	// Now dates the events (nil: time.Now); servers pass their clock.
	Now func() time.Time
	bc  notify.Broadcaster
	// streams wakes the feed only: every append notifies it, and only
	// the state events also bc (a network.denied event concerns the
	// streams, not the controller, long polls or workers' syncs).
	streams notify.Broadcaster
	feed    feed // the one fan-out to SSE streams (Subscribe)
	onOp    atomic.Pointer[func(model.Operation)]
}

// ObserveOperations has f called with every operation state this Log
// records (after it is stored): the daemon's Prometheus metrics time
// operations from them. It replaces any earlier f.
func (l *Log) ObserveOperations(f func(model.Operation)) { l.onOp.Store(&f) }

// New returns a Log over st.
func New(st store.Store) *Log { return &Log{Store: st} }

// Changed returns a channel closed at the next published event.
func (l *Log) Changed() <-chan struct{} { return l.bc.C() }

// Wake wakes waiters without writing an event (e.g. a worker heartbeat).
func (l *Log) Wake() { l.bc.Notify() }

// Listen wakes the Log's waiters — Changed, hence long polls and the
// controller, and Subscribe, hence SSE streams — whenever another store on
// the same database (another server's, on PostgreSQL) appends events,
// until ctx ends. It returns at once if the store cannot tell
// (store.Notifier). Servers run it for their lifetime.
func (l *Log) Listen(ctx context.Context) {
	if n, ok := l.Store.(store.Notifier); ok {
		n.Listen(ctx, l.remoteAppended)
	}
}

// remoteAppended wakes the waiters after another store's append. A feed
// that is not running forgets its cursor: events it did not see pass it,
// and the next feed starts at the end of the log, not behind them.
func (l *Log) remoteAppended() {
	f := &l.feed
	f.mu.Lock()
	if !f.running {
		f.known = false
	}
	f.mu.Unlock()
	l.bc.Notify()
	l.streams.Notify()
}

// Sandbox records sb's current state, without its env: the log is kept
// and served to every stream of the org, and env values are often secrets
// (GET /v1/sandboxes/{id} has them).
func (l *Log) Sandbox(ctx context.Context, sb model.Sandbox) error {
	sb.Env = nil
	return l.append(ctx, model.Event{OrgID: sb.OrgID, SandboxID: sb.ID, Type: TypeSandbox}, sb, true)
}

// Operation records op's current state.
func (l *Log) Operation(ctx context.Context, op model.Operation) error {
	err := l.append(ctx, model.Event{OrgID: op.OrgID, SandboxID: op.SandboxID, OperationID: op.ID, Type: TypeOperation}, op, true)
	if f := l.onOp.Load(); f != nil && err == nil {
		(*f)(op)
	}
	return err
}

// NetworkDenied records an egress denial of sandbox sandboxID of org orgID.
// It wakes the event streams only, not Changed's waiters: no state changed.
func (l *Log) NetworkDenied(ctx context.Context, orgID, sandboxID string, d model.NetDenial) error {
	return l.append(ctx, model.Event{OrgID: orgID, SandboxID: sandboxID, Type: TypeNetworkDenied}, d, false)
}

// append stores ev with v as its data and wakes the streams, and with
// state set Changed's waiters too.
func (l *Log) append(ctx context.Context, ev model.Event, v any, state bool) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("events: encode %s: %w", ev.Type, err)
	}
	ev.Data = data
	if l.Now != nil {
		ev.Time = l.Now().UTC()
	} else {
		ev.Time = time.Now().UTC()
	}
	got, err := l.Store.AppendEvent(ctx, ev)
	if err != nil {
		return fmt.Errorf("events: append %s: %w", ev.Type, err)
	}
	l.appended(got.Seq)
	l.streams.Notify()
	if state {
		l.bc.Notify()
	}
	return nil
}
