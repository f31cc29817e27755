package worker

// Reconciliation: after every Sync, reconcile copies the local state under
// w.mu, asks plan (plan.go) for the steps and executes them, still under
// w.mu: recording states, and starting at most one action goroutine per
// sandbox (the start*, suspend, wake and task functions), which take w.mu
// again to record their outcome and clear busy.

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/tracing"
	"github.com/airlock/airlock/internal/workerapi"
)

// reconcile moves local sandboxes toward the assignments.
func (w *Worker) reconcile(ctx context.Context, as []workerapi.Assignment) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	w.recordEgress(as)
	w.recordOperations(as)
	local, f := w.planInput(as, now)
	w.execute(ctx, plan(local, as, now, f))
}

// planInput copies what plan decides on: the local sandboxes, and the
// snapshot store's answers for the assignments that need them. w.mu is
// held.
func (w *Worker) planInput(as []workerapi.Assignment, now time.Time) ([]localState, facts) {
	_, canPause := w.cfg.Driver.(runtime.Pauser)
	_, snapshotter := w.cfg.Driver.(runtime.Snapshotter)
	f := facts{
		workerID:    w.cfg.ID,
		first:       !w.synced,
		canPause:    canPause,
		canSnapshot: snapshotter && w.cfg.Snapshots != nil,
		unadopted:   w.unadopted,
		found:       make(map[string]foundSnapshot),
		canPull:     snapshotter && w.cfg.Snapshots != nil && w.cfg.Blobs != nil,
		pullWait:    make(map[string]bool),
	}
	for id, at := range w.pullRetryAt {
		if now.Before(at) {
			f.pullWait[id] = true
		} else {
			delete(w.pullRetryAt, id)
		}
	}
	w.synced = true
	local := make([]localState, 0, len(w.sandboxes))
	for id, sb := range w.sandboxes {
		l := localState{id: id, state: sb.state, busy: sb.busy,
			retryAt: sb.retryAt, suspendRetryAt: sb.suspendRetryAt, wakeRetryAt: sb.wakeRetryAt,
			envDigest: model.EnvDigest(sb.env), source: sourceOf(sb.spec)}
		if sb.taskResult != nil {
			l.hasTaskResult, l.taskOp = true, sb.taskResult.OperationID
		}
		local = append(local, l)
	}
	slices.SortFunc(local, func(a, b localState) int { return strings.Compare(a.id, b.id) })
	for _, a := range as {
		id := a.Sandbox.ID
		if _, ok := w.unadopted[id]; ok || w.sandboxes[id] != nil || !needsSnapshotLookup(a) {
			continue
		}
		if _, ok := f.found[id]; ok {
			continue
		}
		if m, ok := w.latestSuspend(id); ok {
			f.found[id] = foundSnapshot{id: m.ID, bytes: m.Bytes}
		} else if a.Sandbox.SnapshotID != "" && w.cfg.Snapshots != nil {
			if m, _, err := w.cfg.Snapshots.Get(id, a.Sandbox.SnapshotID); err == nil {
				f.found[id] = foundSnapshot{id: m.ID, bytes: m.Bytes}
			}
		}
	}
	if w.cfg.Snapshots != nil && !now.Before(w.orphanCheckAt) {
		w.orphanCheckAt = now.Add(OrphanSnapshotAge / 4)
		ids, err := w.cfg.Snapshots.Sandboxes()
		if err != nil {
			w.log.Warn("list snapshot store", "err", err)
		} else {
			f.stored = ids
		}
	}
	return local, f
}

// execute carries out steps; w.mu is held.
func (w *Worker) execute(ctx context.Context, steps []step) {
	for _, s := range steps {
		if s.note != "" {
			w.log.Info(s.note, "sandbox", s.id)
		}
		switch s.kind {
		case stepRecreate, stepForgetUnadopted:
			delete(w.unadopted, s.id)
		case stepReportFailed:
			w.record(&sandbox{id: s.id, state: model.StateFailed, reason: s.reason})
		case stepFoundSuspended:
			w.record(&sandbox{id: s.id, state: model.StateSuspended, snapshotID: s.snapshot.id, snapshotBytes: s.snapshot.bytes})
		case stepReportGone:
			if s.dropSnapshots && w.cfg.Snapshots != nil {
				if err := w.cfg.Snapshots.DeleteSandbox(s.id); err != nil {
					w.log.Warn("delete snapshots of a deleted sandbox", "sandbox", s.id, "err", err)
				}
			}
			w.record(&sandbox{id: s.id, state: model.StateDeleted, reason: s.reason})
		case stepStart:
			sb := &sandbox{id: s.id, state: model.StateStarting, env: s.sandbox.Env, spec: s.sandbox, busy: true}
			w.record(sb)
			w.actions.Add(1)
			actx, span := w.actionSpan(ctx, s.id, "start")
			go func() {
				defer w.actions.Done()
				tracing.End(span, w.start(actx, sb, s.sandbox))
			}()
		case stepPull:
			w.startPull(ctx, s.sandbox)
		case stepDropOrphanSnapshots:
			w.log.Info("removing snapshots of a sandbox not assigned to this worker", "sandbox", s.id, "last_change", s.lastChange)
			if err := w.cfg.Snapshots.DeleteSandbox(s.id); err != nil {
				w.log.Warn("remove orphan snapshots", "sandbox", s.id, "err", err)
			}
		default:
			sb := w.sandboxes[s.id]
			if sb == nil {
				w.log.Error("reconcile step for a sandbox without a record", "sandbox", s.id, "step", s.String())
				continue
			}
			w.executeOn(ctx, sb, s)
		}
	}
}

// executeOn carries out step s on the recorded sandbox sb; w.mu is held.
func (w *Worker) executeOn(ctx context.Context, sb *sandbox, s step) {
	switch s.kind {
	case stepAssign:
		w.updateGateway(sb.id, sb.spec.Network, s.sandbox.Network)
		sb.spec = s.sandbox
		// Every assignment: a warm-pool claim changes the env of a running
		// sandbox, and commands and envd must see the new one.
		if s.envChanged {
			w.changed() // an attach may wait for this env (awaitEnv)
		}
		sb.env = s.sandbox.Env
		if s.clearTask {
			sb.taskResult = nil // the server has the outcome
		}
	case stepTask:
		w.startTask(ctx, sb, s.task)
	case stepCannotTask:
		w.cannotTask(sb, s.task)
	case stepDelete:
		w.startDelete(ctx, sb)
	case stepPause, stepResume:
		w.startPause(ctx, sb, s.kind == stepPause)
	case stepCannotPause:
		w.cannotPause(sb)
	case stepSuspend:
		w.startSuspend(ctx, sb)
	case stepCannotSuspend:
		w.cannotSuspend(sb)
	case stepWake:
		w.startWake(ctx, sb)
	case stepUnsupported:
		w.log.Warn("unsupported desired state", "sandbox", sb.id, "desired", s.desired)
	default:
		w.log.Error("unknown reconcile step", "sandbox", sb.id, "step", s.String())
	}
}

// record makes sb the record of its sandbox; w.mu is held.
func (w *Worker) record(sb *sandbox) {
	w.sandboxes[sb.id] = sb
	w.changed()
}
