package service

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
)

// PauseSandbox freezes a running sandbox (memory stays resident on its
// worker) and returns the pause operation.
func (s *Service) PauseSandbox(ctx context.Context, p Principal, id string) (model.Operation, error) {
	return s.lifecycle(ctx, p, id, model.OpPause)
}

// ResumeSandbox continues a paused sandbox and returns the resume operation.
func (s *Service) ResumeSandbox(ctx context.Context, p Principal, id string) (model.Operation, error) {
	return s.lifecycle(ctx, p, id, model.OpResume)
}

// SuspendSandbox writes a running or paused sandbox to a snapshot and
// releases its runtime; it returns the suspend operation.
func (s *Service) SuspendSandbox(ctx context.Context, p Principal, id string) (model.Operation, error) {
	return s.lifecycle(ctx, p, id, model.OpSuspend)
}

// WakeSandbox restores a suspended sandbox, or resumes a paused one, and
// returns the wake operation.
func (s *Service) WakeSandbox(ctx context.Context, p Principal, id string) (model.Operation, error) {
	return s.lifecycle(ctx, p, id, model.OpWake)
}

// EnsureRunning makes sure the sandbox is running or on its way there: a
// paused or suspended sandbox is woken (an open wake, resume or create is
// joined), a running one returns the operation that got it there. It does
// not wait; the caller waits for the returned operation. Adapters that
// connect to a sandbox (E2B connect) use it; auto_wake=false is not
// consulted, since the caller asked explicitly.
func (s *Service) EnsureRunning(ctx context.Context, p Principal, id string) (model.Operation, error) {
	if _, err := s.GetSandbox(ctx, p, id); err != nil {
		return model.Operation{}, err
	}
	return s.requestLifecycle(ctx, LifecycleRequest{SandboxID: id, Kind: model.OpWake, Join: true})
}

func (s *Service) lifecycle(ctx context.Context, p Principal, id string, kind model.OperationKind) (model.Operation, error) {
	if _, err := s.GetSandbox(ctx, p, id); err != nil {
		return model.Operation{}, err
	}
	return s.requestLifecycle(ctx, LifecycleRequest{SandboxID: id, Kind: kind})
}

// requestLifecycle starts (or joins) a transition a client asked for, on
// the service's clock and deadline; the request is API activity, so the
// sandbox's idle clock restarts, and a new operation wakes the controller.
func (s *Service) requestLifecycle(ctx context.Context, req LifecycleRequest) (model.Operation, error) {
	req.Now, req.Deadline = s.now(), s.deadline()
	if req.Kind == model.OpWake && req.Guard == nil {
		req.Guard = s.wakeGuard(ctx)
	}
	op, started, err := StartLifecycle(ctx, s.st, s.ev, req)
	if err != nil {
		return model.Operation{}, err
	}
	s.touch(ctx, req.SandboxID)
	if started {
		s.kick()
	}
	return op, nil
}

// WakeForTraffic starts waking sb, paused or suspended, for sandbox
// traffic that reached it (the E2B adapter's autoResume), or joins the
// wake under way; model.ErrConflict when sb opted out of auto-wake. The
// caller has authorized the traffic.
func (s *Service) WakeForTraffic(ctx context.Context, sb model.Sandbox, what string) error {
	return s.autoWake(ctx, sb, what)
}

// autoWake starts waking sb for a data-plane request (or joins the wake
// already under way), unless sb opted out of auto-wake.
func (s *Service) autoWake(ctx context.Context, sb model.Sandbox, what string) error {
	if sb.NoAutoWake {
		return withHint(model.Errorf(model.ErrConflict, "sandbox %s is %s and was created with auto_wake=false; wake it first, then retry the %s",
			sb.ID, sb.State, what), Hint{Kind: HintWake, SandboxID: sb.ID})
	}
	_, started, err := StartLifecycle(ctx, s.st, s.ev, LifecycleRequest{
		SandboxID: sb.ID, Kind: model.OpWake, Join: true, Now: s.now(), Deadline: s.deadline(),
		Reason: "auto-wake for " + what, Guard: s.wakeGuard(ctx),
	})
	if err != nil {
		return err
	}
	if started {
		s.kick()
	}
	return nil
}

// LifecycleRequest asks StartLifecycle for one transition.
type LifecycleRequest struct {
	SandboxID string
	// Kind is pause, resume, suspend or wake.
	Kind model.OperationKind
	// Reason is recorded on a new operation (e.g. "idle for 6h0m0s").
	Reason string
	// Join makes a wake succeed whenever the sandbox is running or on its
	// way there: it returns the open operation that gets it there (whatever
	// its kind), or the last one that did. Data-plane wake-ups use it.
	Join bool
	// RespectNoAutoWake refuses (ErrConflict) when the sandbox opted out of
	// auto-wake. Data-plane wake-ups use it.
	RespectNoAutoWake bool
	// Guard, when set, is called with the sandbox as read before the write;
	// an error cancels the request (e.g. the idle check of auto-suspend).
	Guard func(model.Sandbox) error
	// Now and Deadline date the operation (Deadline 0:
	// model.DefaultOperationDeadline).
	Now      time.Time
	Deadline time.Duration
	// Task is the worker's job for Kind checkpoint or rollback (its
	// OperationID is filled in); required for those kinds.
	Task *model.Task
}

// lifecycleKinds are the operations of which a sandbox has at most one open.
var lifecycleKinds = []model.OperationKind{model.OpCreate, model.OpPause, model.OpResume, model.OpSuspend, model.OpWake,
	model.OpCheckpoint, model.OpRollback, model.OpFork}

// StartLifecycle sets the sandbox's desired state for req.Kind and records
// the operation that tracks it, in one guarded write, and appends the
// events; the caller kicks the controllers when started is true. Concurrent
// requests are serialized by the store's compare-and-set: a sandbox has at
// most one open lifecycle operation, so a second, different request gets
// model.ErrConflict naming the one in progress, and a repeat of the same
// request returns the open operation (started=false). Illegal transitions
// are model.ErrConflict saying why; an unknown sandbox model.ErrNotFound.
//
// It is transport-free and needs no principal (the caller authorizes):
// the service, the controller (idle auto-suspend, worker wake requests) and
// the E2B adapter share it.
func StartLifecycle(ctx context.Context, st store.Store, ev *events.Log, req LifecycleRequest) (model.Operation, bool, error) {
	target, ok := lifecycleTarget(req.Kind)
	if !ok {
		return model.Operation{}, false, model.Errorf(model.ErrInvalid, "%q is not a lifecycle operation", req.Kind)
	}
	if model.TaskKind(req.Kind) != (req.Task != nil) {
		return model.Operation{}, false, model.Errorf(model.ErrInvalid, "a %s request needs a task exactly when it is a checkpoint or rollback", req.Kind)
	}
	if req.Now.IsZero() {
		req.Now = time.Now().UTC()
	}
	if req.Deadline <= 0 {
		req.Deadline = model.DefaultOperationDeadline
	}
	id := req.SandboxID
	for range maxUpdateRetries {
		sb, err := st.GetSandbox(ctx, id)
		if errors.Is(err, model.ErrNotFound) {
			return model.Operation{}, false, model.Errorf(model.ErrNotFound, "sandbox %s not found", id)
		}
		if err != nil {
			return model.Operation{}, false, fmt.Errorf("%s sandbox %s: get: %w", req.Kind, id, err)
		}
		// A join may answer with the last operation that got the sandbox
		// running; anything else needs only the open ones.
		ops, err := st.ListOperations(ctx, store.OperationFilter{SandboxID: id, Open: !req.Join})
		if err != nil {
			return model.Operation{}, false, fmt.Errorf("%s sandbox %s: list operations: %w", req.Kind, id, err)
		}
		if req.RespectNoAutoWake && sb.NoAutoWake {
			return model.Operation{}, false, withHint(model.Errorf(model.ErrConflict, "sandbox %s is %s and was created with auto_wake=false; wake it first", id, sb.State),
				Hint{Kind: HintWake, SandboxID: id})
		}
		if op, done, err := checkLifecycle(sb, ops, req, target); done || err != nil {
			return op, false, err
		}
		if req.Guard != nil {
			if err := req.Guard(sb); err != nil {
				return model.Operation{}, false, err
			}
		}
		tgt := target
		if tgt == "" { // a checkpoint leaves the sandbox as it is
			tgt = sb.State
		}
		nsb := sb
		nsb.DesiredState = tgt
		op := model.Operation{
			ID: model.NewID("op"), OrgID: sb.OrgID, SandboxID: id, Kind: req.Kind, State: model.OpPending,
			Target: tgt, Reason: req.Reason, CreatedAt: req.Now, UpdatedAt: req.Now, Deadline: req.Now.Add(req.Deadline),
		}
		if req.Task != nil {
			// The assignment drives a task at once; it completes when the
			// worker reports its outcome (controller.decideObserved).
			t := *req.Task
			t.OperationID, t.Kind = op.ID, req.Kind
			nsb.Task = &t
			op.State = model.OpRunning
		}
		err = st.InTx(ctx, func(tx store.Tx) error {
			var err error
			if nsb, err = tx.UpdateSandbox(ctx, nsb); err != nil {
				return err
			}
			if err := tx.CreateOperation(ctx, op); err != nil {
				return err
			}
			op, err = tx.GetOperation(ctx, op.ID)
			return err
		})
		if errors.Is(err, model.ErrConflict) {
			continue // someone else wrote; re-read and decide again
		}
		if err != nil {
			return model.Operation{}, false, fmt.Errorf("%s sandbox %s: %w", req.Kind, id, err)
		}
		if ev != nil {
			// Failures to append are not the request's: the write happened.
			_ = ev.Sandbox(ctx, nsb)
			_ = ev.Operation(ctx, op)
		}
		return op, true, nil
	}
	return model.Operation{}, false, model.Errorf(model.ErrConflict, "sandbox %s is changing too fast to %s; retry", id, req.Kind)
}

// lifecycleTarget is the desired state a lifecycle request sets.
func lifecycleTarget(kind model.OperationKind) (model.SandboxState, bool) {
	switch kind {
	case model.OpPause:
		return model.StatePaused, true
	case model.OpResume, model.OpWake:
		return model.StateRunning, true
	case model.OpSuspend:
		return model.StateSuspended, true
	case model.OpCheckpoint:
		return "", true // stays running or paused
	case model.OpRollback:
		return model.StateRunning, true
	}
	return "", false
}

// verb is how an error message names a request.
func verb(kind model.OperationKind) string {
	switch kind {
	case model.OpPause:
		return "pausing"
	case model.OpResume:
		return "resuming"
	case model.OpSuspend:
		return "suspending"
	case model.OpWake:
		return "waking"
	case model.OpCheckpoint:
		return "checkpointing"
	case model.OpRollback:
		return "rolling back"
	}
	return string(kind)
}

// checkLifecycle decides whether req may start on sb: an error (the 409 that
// says why), an operation to return as is (done=true), or neither (write).
func checkLifecycle(sb model.Sandbox, ops []model.Operation, req LifecycleRequest, target model.SandboxState) (model.Operation, bool, error) {
	id := sb.ID
	var open []model.Operation
	for _, op := range ops {
		if !op.State.Done() {
			open = append(open, op)
		}
	}
	switch {
	case sb.State == model.StateDeleted:
		return model.Operation{}, false, model.Errorf(model.ErrNotFound, "sandbox %s not found", id)
	case sb.DesiredState == model.StateDeleted || sb.State == model.StateDeleting:
		return model.Operation{}, false, model.Errorf(model.ErrConflict, "sandbox %s is being deleted", id)
	case sb.State.Broken():
		why := ""
		if sb.Reason != "" {
			why = " (" + sb.Reason + ")"
		}
		what := "has failed"
		if sb.State == model.StateLost {
			what = "was lost with its worker"
		}
		return model.Operation{}, false, model.Errorf(model.ErrConflict, "sandbox %s %s%s; it can only be deleted", id, what, why)
	}
	for _, op := range open {
		if !slices.Contains(lifecycleKinds, op.Kind) {
			continue
		}
		sameTask := req.Task == nil || sb.Task != nil && sb.Task.OperationID == op.ID && sb.Task.Checkpoint == req.Task.Checkpoint
		if op.Kind == req.Kind && sameTask || req.Join && op.Target == model.StateRunning {
			return op, true, nil // the same request again, or a wake joining the way to running
		}
		return model.Operation{}, false, withHint(model.Errorf(model.ErrConflict, "sandbox %s has a %s operation %s in progress; wait for it and retry",
			id, op.Kind, op.ID), Hint{Kind: HintWait, SandboxID: id})
	}
	st := sb.State
	if req.Join && req.Kind == model.OpWake && st == model.StateRunning && sb.DesiredState == model.StateRunning {
		// Already running: the last operation that got it there answers.
		for i := len(ops) - 1; i >= 0; i-- {
			if ops[i].Target == model.StateRunning && ops[i].State == model.OpSucceeded {
				return ops[i], true, nil
			}
		}
	}
	if sb.DesiredState != st && sb.DesiredState != "" {
		// A transition without an operation is still converging (e.g. after
		// a suspend that timed out): let it settle first.
		return model.Operation{}, false, withHint(model.Errorf(model.ErrConflict, "sandbox %s is %s and on its way to %s; wait for it and retry",
			id, st, sb.DesiredState), Hint{Kind: HintWait, SandboxID: id})
	}
	allowed := map[model.OperationKind][]model.SandboxState{
		model.OpPause:   {model.StateRunning},
		model.OpResume:  {model.StatePaused},
		model.OpSuspend: {model.StateRunning, model.StatePaused},
		model.OpWake:    {model.StateSuspended, model.StatePaused},
		// Checkpoints and rollbacks work on a runtime in memory.
		model.OpCheckpoint: {model.StateRunning, model.StatePaused},
		model.OpRollback:   {model.StateRunning, model.StatePaused},
	}[req.Kind]
	if slices.Contains(allowed, st) {
		return model.Operation{}, false, nil
	}
	hint, next := "", HintKind("")
	switch {
	case st == model.StatePending || st == model.StateStarting:
		hint, next = "; wait until it is running", HintWait
	case st == model.StateSuspended && model.TaskKind(req.Kind):
		hint, next = "; wake it first", HintWake
	case st == model.StateSuspended && (req.Kind == model.OpPause || req.Kind == model.OpResume):
		hint = "; wake it instead of " + verb(req.Kind)
	case st == model.StateSuspending || st == model.StateWaking:
		hint, next = "; wait for it to finish", HintWait
	case st == model.StateRunning && req.Kind == model.OpWake:
		hint = "; there is nothing to wake"
	case st == model.StateRunning && req.Kind == model.OpResume:
		hint = "; there is nothing to resume"
	}
	var err error
	if st == target {
		err = model.Errorf(model.ErrConflict, "sandbox %s is already %s%s", id, st, hint)
	} else {
		err = model.Errorf(model.ErrConflict, "sandbox %s is %s; %s needs a %s sandbox%s",
			id, st, verb(req.Kind), joinStates(allowed), hint)
	}
	if next != "" {
		err = withHint(err, Hint{Kind: next, SandboxID: id})
	}
	return model.Operation{}, false, err
}

func joinStates(states []model.SandboxState) string {
	s := make([]string, len(states))
	for i, st := range states {
		s[i] = string(st)
	}
	return strings.Join(s, " or ")
}

// IdleFor is the reason idle auto-suspend records on its operations.
func IdleFor(d time.Duration) string {
	return "idle for " + d.Round(time.Second).String()
}

// MaxIdleSuspend bounds idle_suspend_after_s.
const MaxIdleSuspend = 365 * 24 * time.Hour

// idleSuspend resolves a create request's idle setting: the request's, else
// the org's, else model.DefaultIdleSuspend (seconds; 0 disables).
func (s *Service) idleSuspend(ctx context.Context, orgID string, req *int64) (int64, error) {
	if req != nil {
		if *req < 0 || *req > int64(MaxIdleSuspend/time.Second) {
			return 0, model.Errorf(model.ErrUnprocessable, "idle_suspend_after_s is %d; it must be 0 (never) to %d", *req, int64(MaxIdleSuspend/time.Second))
		}
		return *req, nil
	}
	org, err := s.st.GetOrg(ctx, orgID)
	if err != nil && !errors.Is(err, model.ErrNotFound) {
		return 0, fmt.Errorf("get org %s: %w", orgID, err)
	}
	if err == nil && org.IdleSuspendS != nil {
		return *org.IdleSuspendS, nil
	}
	return int64(model.DefaultIdleSuspend / time.Second), nil
}

// KnownFeatures are the feature gates an org may have.
var KnownFeatures = []string{model.FeatureSnapshots, model.FeatureUnsignedImports}

// GetOrg returns an org to its members and to operators.
func (s *Service) GetOrg(ctx context.Context, p Principal, id string) (model.Org, error) {
	if p.OrgID != id && !p.Operator() {
		return model.Org{}, model.Errorf(model.ErrNotFound, "org %s not found", id)
	}
	org, err := s.st.GetOrg(ctx, id)
	if errors.Is(err, model.ErrNotFound) {
		return model.Org{}, model.Errorf(model.ErrNotFound, "org %s not found", id)
	}
	if err != nil {
		return model.Org{}, fmt.Errorf("get org %s: %w", id, err)
	}
	return org, nil
}

// UpdateOrg changes an org's settings. Feature gates are set by operators
// (admin keys of the default org); the idle setting by the org's admins
// too.
func (s *Service) UpdateOrg(ctx context.Context, p Principal, id string, req OrgUpdate) (model.Org, error) {
	if !p.Admin || (p.OrgID != id && !p.Operator()) {
		return model.Org{}, model.Errorf(model.ErrForbidden, "changing org %s needs an admin key of that org", id)
	}
	if req.Features != nil && !p.Operator() {
		return model.Org{}, model.Errorf(model.ErrForbidden, "feature gates are set by admins of the %q org", DefaultOrgName)
	}
	if req.Quotas != nil && !p.Operator() {
		return model.Org{}, model.Errorf(model.ErrForbidden, "quotas are set by admins of the %q org", DefaultOrgName)
	}
	if req.Network != nil && !p.Operator() {
		return model.Org{}, model.Errorf(model.ErrForbidden, "network settings are set by admins of the %q org", DefaultOrgName)
	}
	org, err := s.GetOrg(ctx, p, id)
	if err != nil {
		return model.Org{}, err
	}
	if req.Features != nil {
		var fs []string
		for _, f := range *req.Features {
			f = strings.TrimSpace(f)
			if f == "" {
				continue
			}
			if !slices.Contains(KnownFeatures, f) {
				return model.Org{}, model.Errorf(model.ErrUnprocessable, "unknown feature %q; known features: %s", f, strings.Join(KnownFeatures, ", "))
			}
			if !slices.Contains(fs, f) {
				fs = append(fs, f)
			}
		}
		slices.Sort(fs)
		org.Features = fs
	}
	if req.IdleSuspendAfterS != nil {
		switch v := *req.IdleSuspendAfterS; {
		case v == -1:
			org.IdleSuspendS = nil
		case v < 0 || v > int64(MaxIdleSuspend/time.Second):
			return model.Org{}, model.Errorf(model.ErrUnprocessable, "idle_suspend_after_s is %d; it must be 0 (never) to %d, or -1 for the default", v, int64(MaxIdleSuspend/time.Second))
		default:
			org.IdleSuspendS = &v
		}
	}
	if req.Quotas != nil {
		q, err := patchQuotas(org.Quotas, *req.Quotas)
		if err != nil {
			return model.Org{}, err
		}
		org.Quotas = q
	}
	if req.Network != nil {
		if err := s.validOrgNetwork(ctx, *req.Network); err != nil {
			return model.Org{}, err
		}
		org.Network = *req.Network
	}
	if err := s.st.UpdateOrg(ctx, org); err != nil {
		return model.Org{}, fmt.Errorf("update org %s: %w", id, err)
	}
	return org, nil
}

// HasFeature reports whether the org has the feature gate on.
func HasFeature(org model.Org, feature string) bool { return slices.Contains(org.Features, feature) }
