package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/airlock/airlock/internal/model"
)

// decideDrain is reconcile rule 6b: moving sandboxes off a draining worker
// (service.DrainWorker) through the shared blob store. ok false: not a
// drain's business.
//
//   - running (settled) on a draining worker that uses a blob store: a
//     suspend operation, MoveFrom set to the worker;
//   - paused (settled) there: a suspend operation (it stays suspended and
//     wakes on any worker of the store when next used);
//   - suspended with MoveFrom (settled): a wake operation, which rule 7
//     places on another worker (the draining one is cordoned); one whose
//     snapshot did not reach the blob store stays suspended there, with
//     the reason;
//   - running again with MoveFrom: moved (MoveFrom cleared), or, back on
//     the draining worker after a failed suspend, MoveFrom cleared so that
//     the next round tries again.
func (c *Controller) decideDrain(r *round, sb model.Sandbox, open []model.Operation, now time.Time) (action, bool) {
	settled := len(open) == 0 && sb.Task == nil
	op := func(kind model.OperationKind, target model.SandboxState, why string) *model.Operation {
		return &model.Operation{
			OrgID: sb.OrgID, SandboxID: sb.ID, Kind: kind, State: model.OpPending, Target: target, Reason: why,
			CreatedAt: now, UpdatedAt: now, Deadline: now.Add(c.cfg.OperationDeadline),
		}
	}
	nsb := sb
	if sb.MoveFrom != "" {
		switch {
		case sb.State == model.StateRunning && sb.WorkerID != sb.MoveFrom:
			nsb.MoveFrom = ""
			return action{sb: &nsb, why: "drain: moved"}, true
		case sb.State == model.StateRunning && sb.DesiredState == model.StateRunning && settled:
			nsb.MoveFrom = ""
			nsb.Reason = fmt.Sprintf("drain of worker %s: the suspend to move it failed; trying again", sb.MoveFrom)
			return action{sb: &nsb, why: "drain: suspend failed"}, true
		case sb.State == model.StateSuspended && sb.DesiredState == model.StateSuspended && settled:
			if !sb.SnapshotShared {
				nsb.MoveFrom = ""
				nsb.Reason = fmt.Sprintf("drain of worker %s could not move it: its snapshot did not reach the blob store, so it stays suspended there", sb.MoveFrom)
				return action{sb: &nsb, why: "drain: cannot move"}, true
			}
			nsb.DesiredState = model.StateRunning
			return action{sb: &nsb, op: op(model.OpWake, model.StateRunning, "drain of worker "+sb.MoveFrom+": wake on another worker"), newOp: true, why: "drain: wake elsewhere"}, true
		}
		return action{}, false
	}
	w, ok := r.byID[sb.WorkerID]
	if !ok || !w.Draining || w.BlobStore == "" || !settled {
		return action{}, false
	}
	why := "drain of worker " + w.ID
	switch {
	case sb.State == model.StateRunning && sb.DesiredState == model.StateRunning:
		nsb.MoveFrom = w.ID
		nsb.DesiredState = model.StateSuspended
		return action{sb: &nsb, op: op(model.OpSuspend, model.StateSuspended, why+": suspend to move it"), newOp: true, why: "drain: suspend to move"}, true
	case sb.State == model.StatePaused && sb.DesiredState == model.StatePaused:
		nsb.DesiredState = model.StateSuspended
		return action{sb: &nsb, op: op(model.OpSuspend, model.StateSuspended, why), newOp: true, why: "drain: suspend"}, true
	}
	return action{}, false
}

// errDeposed fails a fenced write whose lease another replica holds now.
var errDeposed = errors.New("controller: deposed (the controller lease moved to another replica)")

// fence is the lease a reconcile round's writes are conditional on
// (store.Leases.HoldLease, in each write's transaction).
type fence struct {
	name, holder string
	epoch        int64
}

type fenceKey struct{}

func withFence(ctx context.Context, f fence) context.Context {
	return context.WithValue(ctx, fenceKey{}, f)
}

func fenceOf(ctx context.Context) (fence, bool) {
	f, ok := ctx.Value(fenceKey{}).(fence)
	return f, ok && f.epoch > 0
}
