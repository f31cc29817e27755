package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/scheduler"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/store"
	"github.com/airlock/airlock/internal/tracing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// maxSteps bounds the transitions one reconcile of one sandbox makes before
// it yields to the next round (each step is one guarded write).
const maxSteps = 8

// round is what one reconcile pass knows about the cluster. Placement adds
// to load as it goes so one pass does not overcommit a worker.
type round struct {
	now     time.Time
	workers []model.Worker
	byID    map[string]model.Worker
	load    map[string]scheduler.Load
}

// action is one transition: the new sandbox and/or operation to write.
// With newOp, op is an operation to create (its ID is made at the write)
// rather than one to update.
type action struct {
	sb    *model.Sandbox
	op    *model.Operation
	newOp bool
	why   string
	// serves is the operation the transition serves, for its span: a.op
	// when it updates one, else the sandbox's newest open operation (nil:
	// none).
	serves *model.Operation
}

// relate sets a.serves from a and the sandbox's open operations.
func (a *action) relate(open []model.Operation) {
	switch {
	case a.op != nil && !a.newOp:
		a.serves = a.op
	case len(open) > 0:
		op := open[len(open)-1]
		a.serves = &op
	}
}

func (a action) empty() bool { return a.sb == nil && a.op == nil }

func (c *Controller) newRound(ctx context.Context) (*round, []model.Sandbox, error) {
	workers, err := c.st.ListWorkers(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("controller: list workers: %w", err)
	}
	sbs, err := c.listSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		return nil, nil, err
	}
	r := &round{now: c.now(), workers: workers, byID: make(map[string]model.Worker, len(workers)), load: scheduler.LoadOf(sbs)}
	for _, w := range workers {
		r.byID[w.ID] = w
	}
	return r, sbs, nil
}

// listSandboxes returns every page of f.
func (c *Controller) listSandboxes(ctx context.Context, f store.SandboxFilter) ([]model.Sandbox, error) {
	all, err := store.ListAllSandboxes(ctx, c.st, f)
	if err != nil {
		return nil, fmt.Errorf("controller: list sandboxes: %w", err)
	}
	return all, nil
}

// ReconcileAll runs one full round: every sandbox that is not deleted and
// every sandbox with an open operation. Conflicts are left for the next
// round; other errors are joined.
func (c *Controller) ReconcileAll(ctx context.Context) error {
	_, err := c.reconcileAll(ctx)
	return err
}

// reconcileAll is ReconcileAll; n is the number of sandboxes it listed.
func (c *Controller) reconcileAll(ctx context.Context) (rs RoundStats, err error) {
	r, sbs, err := c.newRound(ctx)
	if err != nil {
		return rs, err
	}
	rs.Sandboxes = len(sbs)
	rs.ByState = make(map[model.SandboxState]int)
	for _, sb := range sbs {
		rs.ByState[sb.State]++
	}
	ops, err := c.st.ListOperations(ctx, store.OperationFilter{Open: true})
	if err != nil {
		return rs, fmt.Errorf("controller: list open operations: %w", err)
	}
	rs.OpenOperations = len(ops)
	for _, op := range ops {
		rs.OldestOpen = max(rs.OldestOpen, r.now.Sub(op.CreatedAt))
	}
	openBySandbox := make(map[string][]model.Operation)
	for _, op := range ops {
		openBySandbox[op.SandboxID] = append(openBySandbox[op.SandboxID], op)
	}
	// Steady state costs no per-sandbox reads: decide on the listed rows
	// first and re-read (in reconcile) only the sandboxes that need a write.
	seen := make(map[string]bool, len(sbs))
	var ids []string
	for _, sb := range sbs {
		seen[sb.ID] = true
		if !c.decide(r, sb, openBySandbox[sb.ID], "").empty() {
			ids = append(ids, sb.ID)
		}
	}
	for _, op := range ops {
		if op.SandboxID != "" && !seen[op.SandboxID] {
			seen[op.SandboxID] = true
			ids = append(ids, op.SandboxID)
		}
	}
	var errs []error
	for _, id := range ids {
		if ctx.Err() != nil {
			return rs, ctx.Err()
		}
		if err := c.reconcile(ctx, r, id); err != nil && !errors.Is(err, model.ErrConflict) {
			errs = append(errs, err)
		}
	}
	for _, sb := range sbs {
		if ctx.Err() != nil {
			return rs, ctx.Err()
		}
		d := idleFor(sb, r.now)
		if len(openBySandbox[sb.ID]) > 0 || d == 0 {
			continue
		}
		if err := c.suspendIdle(ctx, sb.ID, d); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := c.reconcile(ctx, r, sb.ID); errors.Is(err, errDeposed) {
			// Another replica took the lease over: this round ends here,
			// having written nothing since (the fence).
			c.leading.Store(false)
			c.log.Warn("controller: deposed during a round; it stops", "err", err)
			return rs, errors.Join(append(errs, err)...)
		} else if err != nil && !errors.Is(err, model.ErrConflict) {
			errs = append(errs, err)
		}
	}
	if err := c.reconcilePools(ctx, sbs); err != nil { // warm pools (pool.go)
		errs = append(errs, err)
	}
	return rs, errors.Join(errs...)
}

// Reconcile reconciles one sandbox by ID until it needs nothing more (or
// maxSteps transitions were made). It returns model.ErrConflict when a
// concurrent writer won a race; the caller retries later.
func (c *Controller) Reconcile(ctx context.Context, sandboxID string) error {
	r, _, err := c.newRound(ctx)
	if err != nil {
		return err
	}
	return c.reconcile(ctx, r, sandboxID)
}

func (c *Controller) reconcile(ctx context.Context, r *round, id string) error {
	for range maxSteps {
		sb, open, prior, err := c.read(ctx, id)
		if errors.Is(err, model.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if sb.State == model.StateSuspended && sb.DesiredState == model.StateRunning && sb.SnapshotShared {
			// Where it wakes depends on its worker's cordon and heartbeat as
			// of now, not as of the round's start: a cordon made before the
			// wake request was must count.
			c.refreshWorker(ctx, r, sb.WorkerID)
		}
		a := c.decide(r, sb, open, prior)
		if a.empty() {
			return nil
		}
		a.relate(open)
		if err := c.apply(ctx, a, sb); err != nil {
			if errors.Is(err, model.ErrConflict) {
				continue // a concurrent writer moved sb on: decide again
			}
			return err
		}
		if a.sb != nil && !scheduler.Reserves(sb.State) && scheduler.Reserves(a.sb.State) && a.sb.WorkerID != "" {
			// Placed, or waking (maybe moved): it takes its worker's
			// capacity from now on in this round.
			l := r.load[a.sb.WorkerID]
			l.Add(a.sb.Resources, a.sb.State)
			r.load[a.sb.WorkerID] = l
		}
	}
	return nil
}

// read returns the sandbox, its open operations (oldest first) and the
// state it settled in before its current lifecycle operation (running or
// paused: see priorState).
func (c *Controller) read(ctx context.Context, id string) (model.Sandbox, []model.Operation, model.SandboxState, error) {
	sb, err := c.st.GetSandbox(ctx, id)
	if err != nil {
		return model.Sandbox{}, nil, "", fmt.Errorf("controller: get sandbox %s: %w", id, err)
	}
	ops, err := c.st.ListOperations(ctx, store.OperationFilter{SandboxID: id})
	if err != nil {
		return model.Sandbox{}, nil, "", fmt.Errorf("controller: list operations of %s: %w", id, err)
	}
	open := ops[:0:0]
	for _, op := range ops {
		if !op.State.Done() {
			open = append(open, op)
		}
	}
	return sb, open, priorState(ops), nil
}

// priorState is the state the last succeeded lifecycle operation left the
// sandbox in: paused after a pause, running after anything else. A suspend
// that fails or times out returns the sandbox there.
func priorState(ops []model.Operation) model.SandboxState {
	prior := model.StateRunning
	for _, op := range ops {
		if op.State != model.OpSucceeded {
			continue
		}
		switch op.Target {
		case model.StatePaused:
			prior = model.StatePaused
		case model.StateRunning:
			prior = model.StateRunning
		}
	}
	return prior
}

// decide returns the next transition of sb, or an empty action. Rules, in
// order:
//  1. a deleted sandbox completes its delete operation and cancels others;
//  2. desired deleted: unplaced → deleted, placed → deleting;
//  3. an open operation past its deadline fails, and so does the sandbox
//     unless it is being deleted or already failed;
//  4. an open operation whose target state is reached succeeds; a failed
//     sandbox fails its operations; a sandbox being deleted cancels the
//     others;
//  5. expiry (decideExpiry): past ExpiresAt, a sandbox is deleted, or
//     with OnExpiry suspend a running one is suspended, by a new operation;
//  6. pending and desired running → placed (starting) by Config.Placer, or
//     a Reason saying why not;
//     6b. drain: a running sandbox on a draining worker is suspended and
//     woken on another (decideDrain);
//  7. lifecycle: running|paused and desired suspended → suspending;
//     suspended and desired running → waking, on its worker or, its
//     snapshot in the blob store, another (wakeOn), or a Reason saying why
//     it cannot wake yet; an open lifecycle operation
//     that the assignment now drives → running;
//     7b. waking, its snapshot in the blob store, on a worker silent for
//     wakeMoveFactor × HeartbeatTTL → suspended again, to wake elsewhere;
//  8. placed on a worker silent for longer than WorkerLossGrace: lost, or
//     restored elsewhere (decideLoss);
//  9. placed on a worker that has been silent for staleFactor × HeartbeatTTL
//     → a note in Reason (the sandbox stays: the worker may come back).
//
// Deadlines of pause, resume and suspend do not fail the sandbox: the
// operation fails and the desired state goes back to where the sandbox was
// (prior, for a suspend already under way), so it is never left half
// suspended; the worker keeps or returns its runtime and reports it.
func (c *Controller) decide(r *round, sb model.Sandbox, open []model.Operation, prior model.SandboxState) action {
	now := r.now
	deleting := sb.DesiredState == model.StateDeleted

	// 1. Tombstone.
	if sb.State == model.StateDeleted {
		for _, op := range open {
			if target(op) == model.StateDeleted {
				return action{op: finish(op, model.OpSucceeded, "", now), why: "delete completed"}
			}
			return action{op: finish(op, model.OpCancelled, "the sandbox was deleted", now), why: "sandbox deleted"}
		}
		return action{}
	}

	// 2. Deletion.
	if deleting && (sb.State != model.StateDeleting || sb.WorkerID == "") {
		nsb := sb
		if sb.WorkerID == "" || sb.State == model.StatePending || sb.State == model.StateLost {
			// No worker holds anything of it (a lost one's worker is gone;
			// should it come back, the sandbox is no longer assigned to it).
			nsb.State = model.StateDeleted
			a := action{sb: &nsb, why: "delete unplaced sandbox"}
			if op, ok := firstOp(open, func(op model.Operation) bool { return target(op) == model.StateDeleted }); ok {
				a.op = finish(op, model.OpSucceeded, "", now)
			} else if len(open) > 0 {
				a.op = finish(open[0], model.OpCancelled, "the sandbox was deleted", now)
			}
			return a
		}
		nsb.State = model.StateDeleting
		a := action{sb: &nsb, why: "delete placed sandbox"}
		if op, ok := firstOp(open, func(op model.Operation) bool { return target(op) != model.StateDeleted }); ok {
			a.op = finish(op, model.OpCancelled, "superseded by delete", now)
		}
		return a
	}

	// 3. Deadlines.
	for _, op := range open {
		if op.Deadline.IsZero() || !now.After(op.Deadline) {
			continue
		}
		if sb.State == target(op) && !model.TaskKind(op.Kind) {
			continue // reached: completion below
		}
		reason := fmt.Sprintf("deadline of %s passed while %s was %s", formatDuration(op.Deadline.Sub(op.CreatedAt)), op.Kind, sb.State)
		a := action{op: finish(op, model.OpFailed, reason, now), why: "operation deadline"}
		if model.TaskKind(op.Kind) {
			// The sandbox stays as it is; the worker's late outcome is
			// ignored (its snapshot goes with the sandbox).
			if sb.Task != nil && sb.Task.OperationID == op.ID {
				nsb := sb
				nsb.Task = nil
				a.sb = &nsb
			}
			return a
		}
		if !deleting && !sb.State.Broken() && revertible(op.Kind) {
			back := sb.State
			if back != model.StateRunning && back != model.StatePaused {
				back = prior
			}
			if back == "" {
				back = model.StateRunning
			}
			if sb.DesiredState != back {
				nsb := sb
				nsb.DesiredState = back
				nsb.LastActivityAt = now // idle auto-suspend waits a full period again
				a.sb = &nsb
			}
			return a
		}
		if !deleting && !sb.State.Broken() {
			nsb := sb
			nsb.State = model.StateFailed
			nsb.Reason = reason
			a.sb = &nsb
		}
		return a
	}

	// 4. Operation completion.
	for _, op := range open {
		switch {
		case sb.State == target(op) && !model.TaskKind(op.Kind):
			return action{op: finish(op, model.OpSucceeded, "", now), why: "operation completed"}
		case model.TaskKind(op.Kind) && (sb.Task == nil || sb.Task.OperationID != op.ID) && !deleting && !sb.State.Broken():
			// Its task is gone without an outcome (it cannot be, but an
			// operation must never hang).
			return action{op: finish(op, model.OpFailed, "the sandbox no longer has this task", now), why: "task lost"}
		case sb.State.Broken() && !deleting:
			return action{op: finish(op, model.OpFailed, failReason(sb), now), why: "sandbox failed"}
		case deleting && target(op) != model.StateDeleted:
			return action{op: finish(op, model.OpCancelled, "superseded by delete", now), why: "superseded by delete"}
		}
	}

	// 5. Expiry.
	if a := c.decideExpiry(sb, open, now); !a.empty() {
		return a
	}

	// 6. Placement.
	if sb.State == model.StatePending && sb.DesiredState == model.StateRunning {
		workers := r.workers
		if sb.Source != nil {
			// Forks and imports start from a snapshot on one worker.
			workers = nil
			if w, ok := r.byID[sb.Source.WorkerID]; ok {
				workers = []model.Worker{w}
			}
		}
		wid, err := c.cfg.Placer.Place(scheduler.Cluster{Workers: workers, Load: r.load, Now: now}, scheduler.RequestFor(sb))
		if err != nil && sb.Source != nil {
			err = fmt.Errorf("waiting for worker %s, which holds the snapshot it starts from: %w", sb.Source.WorkerID, err)
		}
		if err != nil {
			if sb.Reason == err.Error() {
				return action{}
			}
			nsb := sb
			nsb.Reason = err.Error()
			return action{sb: &nsb, why: "unschedulable"}
		}
		nsb := sb
		nsb.WorkerID = wid
		nsb.State = model.StateStarting
		nsb.Reason = ""
		a := action{sb: &nsb, why: "placed"}
		if op, ok := firstOp(open, func(op model.Operation) bool { return op.State == model.OpPending }); ok {
			nop := op
			nop.State = model.OpRunning
			nop.UpdatedAt = now
			a.op = &nop
		}
		return a
	}

	// 6b. Drain.
	if !deleting && !sb.State.Terminal() {
		if a, ok := c.decideDrain(r, sb, open, now); ok {
			return a
		}
	}

	// 7. Lifecycle.
	if !deleting {
		nsb := sb
		switch {
		case (sb.State == model.StateRunning || sb.State == model.StatePaused) && sb.DesiredState == model.StateSuspended:
			nsb.State = model.StateSuspending
		case sb.State == model.StateSuspended && sb.DesiredState == model.StateRunning:
			wid, err := c.wakeOn(r, sb)
			if err != nil {
				if sb.Reason == err.Error() {
					return action{}
				}
				nsb.Reason = err.Error()
				return action{sb: &nsb, why: "cannot wake yet"}
			}
			nsb.State = model.StateWaking
			if wid != sb.WorkerID {
				c.log.Info("waking a sandbox on another worker", "sandbox", sb.ID, "from", sb.WorkerID, "to", wid, "snapshot", sb.SnapshotID)
				nsb.WorkerID = wid
			}
		}
		var nop *model.Operation
		if op, ok := firstOp(open, func(op model.Operation) bool {
			return op.State == model.OpPending && revertible(op.Kind) || op.State == model.OpPending && op.Kind == model.OpWake
		}); ok && sb.State != model.StatePending && sb.State != model.StateStarting {
			o := op
			o.State = model.OpRunning
			o.UpdatedAt = now
			nop = &o
		}
		if nsb.State != sb.State || nop != nil {
			a := action{op: nop, why: "lifecycle " + string(sb.State) + " → " + string(sb.DesiredState)}
			if nsb.State != sb.State {
				nsb.Reason = ""
				a.sb = &nsb
			}
			return a
		}
	}

	// 7b. Waking on a worker gone silent, from a snapshot in the blob
	// store: back to suspended, so that rule 7 wakes it elsewhere. (Had the
	// worker restored it meanwhile, unseen, that copy goes when the worker
	// next syncs: the sandbox is no longer assigned to it.)
	if !deleting && sb.State == model.StateWaking && sb.SnapshotShared {
		if w, known := r.byID[sb.WorkerID]; known && now.Sub(w.LastHeartbeat) > wakeMoveFactor*c.cfg.HeartbeatTTL {
			nsb := sb
			nsb.State = model.StateSuspended
			nsb.Reason = fmt.Sprintf("worker %s went silent while waking it (no heartbeat since %s); waking it on another worker", sb.WorkerID, w.LastHeartbeat.UTC().Format(time.RFC3339))
			return action{sb: &nsb, why: "waking on a silent worker"}
		}
	}

	// 8. Lost worker.
	if sb.WorkerID != "" && !sb.State.Terminal() && sb.State != model.StatePending {
		if w, known := r.byID[sb.WorkerID]; known && scheduler.Lost(w, now, c.cfg.WorkerLossGrace) {
			if a, ok := c.decideLoss(sb, open, w, now); ok {
				return a
			}
		}
	}

	// 9. Silent worker.
	if sb.WorkerID != "" && !sb.State.Terminal() && sb.State != model.StatePending {
		w, known := r.byID[sb.WorkerID]
		prefix := stalePrefix(sb.WorkerID)
		stale := !known || now.Sub(w.LastHeartbeat) > staleFactor*c.cfg.HeartbeatTTL
		switch {
		case stale && !strings.HasPrefix(sb.Reason, prefix):
			nsb := sb
			if known {
				nsb.Reason = fmt.Sprintf("%sno heartbeat since %s; the sandbox stays assigned in case it comes back", prefix, w.LastHeartbeat.UTC().Format(time.RFC3339))
			} else {
				nsb.Reason = prefix + "it is not registered; the sandbox stays assigned in case it comes back"
			}
			return action{sb: &nsb, why: "worker silent"}
		case !stale && strings.HasPrefix(sb.Reason, prefix):
			nsb := sb
			nsb.Reason = ""
			return action{sb: &nsb, why: "worker back"}
		}
	}
	return action{}
}

// refreshWorker rereads worker id into the round's view (a failed read
// keeps the round's).
func (c *Controller) refreshWorker(ctx context.Context, r *round, id string) {
	w, err := c.st.GetWorker(ctx, id)
	if err != nil {
		return
	}
	r.byID[id] = w
	for i := range r.workers {
		if r.workers[i].ID == id {
			r.workers[i] = w
		}
	}
}

// wakeOn returns the worker suspended sb wakes on: its own (where its
// snapshot is) while that one is live and uncordoned and has room for it,
// else, when its snapshot is in the shared blob store (SnapshotShared),
// another worker on the same blob store that the placer picks, which pulls
// the snapshot from there. A sandbox that can wake nowhere yet waits
// suspended with the reason (an error wrapping model.ErrUnavailable); one
// whose snapshot is only on its own worker always wakes there (it waits
// for the worker to come back).
func (c *Controller) wakeOn(r *round, sb model.Sandbox) (string, error) {
	home, known := r.byID[sb.WorkerID]
	if !sb.SnapshotShared || !known || home.BlobStore == "" {
		return sb.WorkerID, nil
	}
	req := scheduler.RequestFor(sb)
	req.Needs.Snapshot = true
	cl := scheduler.Cluster{Workers: []model.Worker{home}, Load: r.load, Now: r.now}
	homeErr := error(nil)
	if home.Cordoned {
		homeErr = fmt.Errorf("worker %s is cordoned", home.ID)
	} else if _, homeErr = c.cfg.Placer.Place(cl, req); homeErr == nil {
		return home.ID, nil
	}
	cl.Workers = nil
	for _, w := range r.workers {
		if w.ID != home.ID && w.BlobStore == home.BlobStore {
			cl.Workers = append(cl.Workers, w)
		}
	}
	wid, err := c.cfg.Placer.Place(cl, req)
	if err != nil {
		return "", model.Errorf(model.ErrUnavailable, "waiting to wake: its worker cannot take it (%v) and no other worker on blob store %s can (%v)", homeErr, home.BlobStore, err)
	}
	return wid, nil
}

// decideLoss is rule 8: what sb, on worker w that has been silent for
// longer than WorkerLossGrace, becomes. ok false: nothing (a suspended
// sandbox whose snapshot is in the blob store stays suspended: it wakes
// on another worker).
//   - deleting: deleted (nothing is left to remove where it was);
//   - its last snapshot in the blob store and OnWorkerLoss restore:
//     suspended from that snapshot, desired running, so that rule 7 wakes
//     it on another worker (what changed since the snapshot is gone, and
//     the reason says so);
//   - otherwise: lost, with the reason; its open operation fails.
func (c *Controller) decideLoss(sb model.Sandbox, open []model.Operation, w model.Worker, now time.Time) (action, bool) {
	since := w.LastHeartbeat.UTC().Format(time.RFC3339)
	nsb := sb
	var a action
	switch {
	case sb.State == model.StateDeleting:
		nsb.State = model.StateDeleted
		a = action{sb: &nsb, why: "worker lost: deleted"}
		if op, ok := firstOp(open, func(op model.Operation) bool { return target(op) == model.StateDeleted }); ok {
			a.op = finish(op, model.OpSucceeded, "", now)
		}
		return a, true
	case sb.State == model.StateSuspended && sb.SnapshotShared:
		return action{}, false
	case c.cfg.OnWorkerLoss == OnLossRestore && sb.SnapshotShared && sb.SnapshotID != "":
		nsb.State = model.StateSuspended
		nsb.DesiredState = model.StateRunning
		nsb.Task = nil
		nsb.LastActivityAt = now
		nsb.Reason = fmt.Sprintf("worker %s was lost (no heartbeat since %s); restored from its last snapshot %s in the blob store: what changed after it is gone", w.ID, since, sb.SnapshotID)
		a = action{sb: &nsb, why: "worker lost: restore"}
	default:
		nsb.State = model.StateLost
		nsb.Reason = fmt.Sprintf("worker %s was lost (no heartbeat since %s, more than %s); the sandbox was %s there", w.ID, since, formatDuration(c.cfg.WorkerLossGrace), sb.State)
		a = action{sb: &nsb, why: "worker lost"}
	}
	if len(open) > 0 {
		a.op = finish(open[0], model.OpFailed, nsb.Reason, now)
	}
	return a, true
}

func stalePrefix(workerID string) string { return "worker " + workerID + " is unreachable: " }

// decideExpiry is rule 5: what a sandbox whose ExpiresAt has passed needs,
// if anything. Only sandboxes on their way to or at running or paused
// expire (not one being deleted, failed, suspended or suspending).
//   - OnExpiry delete (the default): desired deleted and a delete
//     operation; rule 2 then deletes it.
//   - OnExpiry suspend, running: the expiry is cleared and, in the same
//     write, desired suspended with a suspend operation, as a suspend
//     request would; an open suspend is joined (only the expiry is
//     cleared). A sandbox that cannot be suspended now (another lifecycle
//     operation open, or still converging) is deleted: the expiry must end
//     it one way or the other.
//   - OnExpiry suspend, paused: the expiry is cleared; it stays paused.
//   - OnExpiry suspend, pending, starting or waking: nothing until it
//     settles.
//
// A resumed sandbox gets a new expiry from its adapter (E2B connect).
func (c *Controller) decideExpiry(sb model.Sandbox, open []model.Operation, now time.Time) action {
	if sb.ExpiresAt == nil || now.Before(*sb.ExpiresAt) || sb.DesiredState == model.StateDeleted {
		return action{}
	}
	switch sb.State {
	case model.StatePending, model.StateStarting, model.StateRunning, model.StateWaking, model.StatePaused:
	default:
		return action{}
	}
	reason := "expired at " + sb.ExpiresAt.UTC().Format(time.RFC3339)
	newOp := func(kind model.OperationKind, target model.SandboxState) *model.Operation {
		return &model.Operation{
			OrgID: sb.OrgID, SandboxID: sb.ID, Kind: kind, State: model.OpPending, Target: target, Reason: reason,
			CreatedAt: now, UpdatedAt: now, Deadline: now.Add(c.cfg.OperationDeadline),
		}
	}
	if sb.OnExpiry == model.ExpirySuspend {
		nsb := sb
		nsb.ExpiresAt = nil
		switch sb.State {
		case model.StatePaused:
			return action{sb: &nsb, why: "expired while paused: expiry cleared"}
		case model.StateRunning:
			if _, ok := firstOp(open, func(op model.Operation) bool { return op.Kind == model.OpSuspend }); ok {
				return action{sb: &nsb, why: "expired while suspending: expiry cleared"}
			}
			if len(open) == 0 && sb.DesiredState == model.StateRunning {
				nsb.DesiredState = model.StateSuspended
				return action{sb: &nsb, op: newOp(model.OpSuspend, model.StateSuspended), newOp: true, why: "expired: suspend"}
			}
			// Cannot be suspended now: deleted below.
		default:
			return action{} // decided once it settles
		}
	}
	nsb := sb
	nsb.DesiredState = model.StateDeleted
	return action{sb: &nsb, op: newOp(model.OpDelete, model.StateDeleted), newOp: true, why: "expired: delete"}
}

// apply writes a (both writes in one transaction when both change) and
// appends the events.
func (c *Controller) apply(ctx context.Context, a action, read model.Sandbox) (err error) {
	var (
		sb model.Sandbox
		op model.Operation
	)
	if c.tracer != nil && (a.newOp || a.serves != nil && a.serves.TraceParent != "") {
		// The span joins the trace of the request that made the operation;
		// an operation the controller makes itself (expiry) starts a trace
		// of its own, which the operation then keeps.
		var span trace.Span
		if a.serves != nil && !a.newOp {
			ctx = tracing.WithTraceParent(ctx, a.serves.TraceParent)
		}
		ctx, span = c.tracer.Start(ctx, "controller: "+a.why, trace.WithAttributes(
			tracing.SandboxID.String(read.ID), tracing.OrgID.String(read.OrgID),
			attribute.String("airlock.transition", a.why)))
		if a.serves != nil && !a.newOp {
			span.SetAttributes(tracing.OperationAttrs(*a.serves)...)
		}
		defer func() {
			if a.sb != nil {
				span.SetAttributes(attribute.String("airlock.sandbox.state", string(sb.State)), tracing.WorkerID.String(sb.WorkerID))
			}
			if a.op != nil {
				span.SetAttributes(attribute.String("airlock.operation.state", string(op.State)))
			}
			tracing.End(span, err)
		}()
	}
	f, fenced := fenceOf(ctx)
	hold := func(tx store.Tx) error {
		if !fenced {
			return nil
		}
		if err := tx.HoldLease(ctx, f.name, f.holder, f.epoch, c.now()); err != nil {
			if errors.Is(err, model.ErrConflict) {
				return fmt.Errorf("%w: %v", errDeposed, err)
			}
			return err
		}
		return nil
	}
	switch {
	case a.sb != nil && a.op != nil:
		err = c.st.InTx(ctx, func(tx store.Tx) error {
			if err := hold(tx); err != nil {
				return err
			}
			var err error
			if sb, err = tx.UpdateSandbox(ctx, *a.sb); err != nil {
				return err
			}
			if a.newOp {
				nop := *a.op
				nop.ID = model.NewID("op")
				if err := tx.CreateOperation(ctx, nop); err != nil {
					return err
				}
				op, err = tx.GetOperation(ctx, nop.ID)
				return err
			}
			op, err = tx.UpdateOperation(ctx, *a.op)
			return err
		})
	case a.sb != nil && fenced:
		err = c.st.InTx(ctx, func(tx store.Tx) error {
			if err := hold(tx); err != nil {
				return err
			}
			var err error
			sb, err = tx.UpdateSandbox(ctx, *a.sb)
			return err
		})
	case a.sb != nil:
		sb, err = c.st.UpdateSandbox(ctx, *a.sb)
	default:
		// The operation alone changes, but it was decided on read: write
		// read back unchanged in the same transaction, so that the write
		// fails (ErrConflict) if the sandbox moved on since. Without it a
		// read of the sandbox from before a pause completed, paired with
		// the operations listed after a resume began, completes that
		// resume ("running is its target") while the sandbox is paused.
		err = c.st.InTx(ctx, func(tx store.Tx) error {
			if err := hold(tx); err != nil {
				return err
			}
			if _, err := tx.UpdateSandbox(ctx, read); err != nil {
				return err
			}
			var err error
			op, err = tx.UpdateOperation(ctx, *a.op)
			return err
		})
	}
	if err != nil {
		return fmt.Errorf("controller: %s: write: %w", a.why, err)
	}
	attrs := []any{"why", a.why}
	if a.sb != nil {
		attrs = append(attrs, "sandbox", sb.ID, "state", sb.State, "worker", sb.WorkerID, "reason", sb.Reason)
		if err := c.ev.Sandbox(ctx, sb); err != nil {
			c.log.WarnContext(ctx, "controller: sandbox event", "sandbox", sb.ID, "err", err)
		}
	}
	if a.op != nil {
		attrs = append(attrs, "operation", op.ID, "op_state", op.State, "op_reason", op.Reason)
		if err := c.ev.Operation(ctx, op); err != nil {
			c.log.WarnContext(ctx, "controller: operation event", "operation", op.ID, "err", err)
		}
	}
	if a.serves != nil && a.op == nil {
		attrs = append(attrs, "operation", a.serves.ID)
	}
	c.log.InfoContext(ctx, "controller: transition", attrs...)
	return nil
}

// revertible reports whether a deadline of kind leaves the sandbox where it
// was instead of failing it.
func revertible(kind model.OperationKind) bool {
	return kind == model.OpPause || kind == model.OpResume || kind == model.OpSuspend
}

// errNotIdle cancels an idle auto-suspend whose sandbox moved on.
var errNotIdle = errors.New("no longer idle")

// idleFor returns how long sb may be idle before it is suspended if it is
// due now (0 otherwise): running or paused and settled, with an idle
// setting, and no activity for that long.
func idleFor(sb model.Sandbox, now time.Time) time.Duration {
	if sb.IdleSuspendS <= 0 || sb.DesiredState != sb.State {
		return 0
	}
	if sb.State != model.StateRunning && sb.State != model.StatePaused {
		return 0
	}
	d := time.Duration(sb.IdleSuspendS) * time.Second
	if now.Sub(sb.LastActivityAt) < d {
		return 0
	}
	return d
}

// suspendIdle starts a suspend of sandbox id, idle for d, if it is still
// idle, with the reason "idle for <d>". A sandbox that moved on (activity,
// another operation, a lost race) is left alone.
func (c *Controller) suspendIdle(ctx context.Context, id string, d time.Duration) (err error) {
	if c.tracer != nil {
		// The suspend's own trace, which its operation keeps.
		var span trace.Span
		ctx, span = c.tracer.Start(ctx, "controller: idle auto-suspend", trace.WithAttributes(tracing.SandboxID.String(id)))
		defer func() { tracing.End(span, err) }()
	}
	op, started, err := service.StartLifecycle(ctx, c.st, c.ev, service.LifecycleRequest{
		SandboxID: id, Kind: model.OpSuspend, Now: c.now(), Deadline: c.cfg.OperationDeadline,
		Reason: service.IdleFor(d),
		Guard: func(sb model.Sandbox) error {
			if idleFor(sb, c.now()) == 0 {
				return errNotIdle
			}
			return nil
		},
	})
	switch {
	case errors.Is(err, errNotIdle), errors.Is(err, model.ErrConflict), errors.Is(err, model.ErrNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("controller: idle auto-suspend of %s: %w", id, err)
	}
	if started {
		c.log.InfoContext(ctx, "controller: idle auto-suspend", "sandbox", id, "operation", op.ID, "idle", d)
	}
	return nil
}

// target is the sandbox state that completes op.
func target(op model.Operation) model.SandboxState {
	if op.Target != "" {
		return op.Target
	}
	switch op.Kind {
	case model.OpCreate, model.OpResume, model.OpWake:
		return model.StateRunning
	case model.OpDelete:
		return model.StateDeleted
	case model.OpPause:
		return model.StatePaused
	case model.OpSuspend:
		return model.StateSuspended
	}
	return ""
}

// finish ends op with state s; an empty reason keeps the one op was
// started with (e.g. "idle for 6h0m0s").
func finish(op model.Operation, s model.OperationState, reason string, now time.Time) *model.Operation {
	op.State = s
	if reason != "" {
		op.Reason = reason
	}
	op.UpdatedAt = now
	return &op
}

func firstOp(ops []model.Operation, f func(model.Operation) bool) (model.Operation, bool) {
	for _, op := range ops {
		if f(op) {
			return op, true
		}
	}
	return model.Operation{}, false
}

func failReason(sb model.Sandbox) string {
	if sb.Reason != "" {
		return sb.Reason
	}
	return "the sandbox failed"
}

// formatDuration renders d in whole seconds, or milliseconds when shorter.
func formatDuration(d time.Duration) string {
	if d >= time.Second {
		return d.Round(time.Second).String()
	}
	return d.Round(time.Millisecond).String()
}
