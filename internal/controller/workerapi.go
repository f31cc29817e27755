package controller

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/store"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/tracing"
	"github.com/airlock/airlock/internal/workerapi"

	"go.opentelemetry.io/otel/trace"
)

var workerIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// Handler serves the worker API (see internal/workerapi) under
// /internal/v1/workers/: workerapi's handler over the controller.
func (c *Controller) Handler() http.Handler {
	return workerapi.NewHandler(c, workerapi.HandlerConfig{JoinToken: c.cfg.WorkerToken, MaxSyncWait: MaxSyncWait})
}

var _ workerapi.Server = (*Controller)(nil)

// Authenticate reports whether secret is worker id's own credential
// (workerapi.Server).
func (c *Controller) Authenticate(ctx context.Context, id, secret string) error {
	return c.checkWorkerSecret(ctx, id, secret)
}

// checkWorkerSecret reports whether secret is worker id's own credential.
func (c *Controller) checkWorkerSecret(ctx context.Context, id, secret string) error {
	cred, err := c.st.GetWorkerCredential(ctx, id)
	if errors.Is(err, model.ErrNotFound) {
		return model.Errorf(model.ErrUnauthorized, "worker %s has no credential on this server: register first (with the join token)", id)
	}
	if err != nil {
		return fmt.Errorf("controller: worker %s: read credential: %w", id, err)
	}
	if subtle.ConstantTimeCompare([]byte(service.HashKey(secret)), []byte(cred.SecretHash)) != 1 {
		return model.Errorf(model.ErrUnauthorized, "wrong credential for worker %s: send the secret it received at registration (kept in its data dir as worker.secret)", id)
	}
	return nil
}

// bindWorker makes sure the registration of id is by the worker that holds
// id's secret: an id without a credential gets one (returned, to be sent
// back to the worker once); an id with one must prove it with secret.
func (c *Controller) bindWorker(ctx context.Context, id, secret string, now time.Time) (issued string, err error) {
	if _, err := c.st.GetWorkerCredential(ctx, id); err == nil {
		if secret == "" {
			return "", model.Errorf(model.ErrForbidden, "worker id %s is registered with its own credential, and this registration has none: "+
				"a worker re-registers with the secret it received (in its data dir as worker.secret); if that is lost, the operator removes the worker's credential first", id)
		}
		if err := c.checkWorkerSecret(ctx, id, secret); err != nil {
			return "", model.Errorf(model.ErrForbidden, "worker id %s is registered with another credential: a worker can register only as itself", id)
		}
		return "", nil
	} else if !errors.Is(err, model.ErrNotFound) {
		return "", fmt.Errorf("read credential: %w", err)
	}
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("make worker secret: %w", err)
	}
	issued = "alw_" + hex.EncodeToString(b[:])
	err = c.st.PutWorkerCredential(ctx, store.WorkerCredential{WorkerID: id, SecretHash: service.HashKey(issued), CreatedAt: now, UpdatedAt: now}, "")
	if errors.Is(err, model.ErrConflict) {
		return "", model.Errorf(model.ErrForbidden, "worker id %s was registered by another worker just now: a worker can register only as itself", id)
	}
	if err != nil {
		return "", fmt.Errorf("store credential: %w", err)
	}
	return issued, nil
}

// Register records a worker (and the templates it has) with a fresh
// heartbeat and returns the worker's own data-plane key and, on an id's
// first registration, its credential. An id registered before must prove
// its credential (req.Secret): nobody else may re-register it or change its
// data-plane URL.
func (c *Controller) Register(ctx context.Context, req workerapi.RegisterRequest) (_ workerapi.RegisterResponse, err error) {
	if req.ID == "" {
		var b [8]byte
		rand.Read(b[:])
		req.ID = "wkr-" + hex.EncodeToString(b[:])
	}
	if !workerIDPattern.MatchString(req.ID) {
		return workerapi.RegisterResponse{}, model.Errorf(model.ErrInvalid, "worker id %q: use 1-128 letters, digits, '.', '_' or '-'", req.ID)
	}
	if u, err := url.Parse(req.DataPlaneURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return workerapi.RegisterResponse{}, model.Errorf(model.ErrInvalid, "data_plane_url %q: want an absolute http(s) URL", req.DataPlaneURL)
	}
	if req.CapacityMiB < 0 || req.CapacityVCPUs < 0 || (req.FreeMiB != nil && *req.FreeMiB < 0) {
		return workerapi.RegisterResponse{}, model.Errorf(model.ErrInvalid, "capacity and free memory must not be negative")
	}
	if err := validTemplates(req.Templates); err != nil {
		return workerapi.RegisterResponse{}, err
	}
	now := c.now()
	issued, err := c.bindWorker(ctx, req.ID, req.Secret, now)
	if err != nil {
		return workerapi.RegisterResponse{}, fmt.Errorf("controller: register %s: %w", req.ID, err)
	}
	if issued != "" {
		// A registration that fails after its credential was stored gives
		// the id back: the worker never received the secret.
		defer func() {
			if err != nil {
				if derr := c.st.DeleteWorkerCredential(context.WithoutCancel(ctx), req.ID); derr != nil {
					c.log.Warn("controller: register: drop the credential of a failed registration", "worker", req.ID, "err", derr)
				}
			}
		}()
	}
	wk := model.Worker{
		ID:            req.ID,
		DataPlaneURL:  req.DataPlaneURL,
		Runtimes:      req.Offered(),
		Templates:     digests(req.Templates),
		CapacityMiB:   req.CapacityMiB,
		CapacityVCPUs: req.CapacityVCPUs,
		FreeMiB:       req.FreeMiB,
		BlobStore:     req.BlobStore,
		LastHeartbeat: now,
		CreatedAt:     now,
	}
	if old, err := c.st.GetWorker(ctx, req.ID); err == nil {
		wk.CreatedAt = old.CreatedAt
		wk.InternalURL = old.InternalURL
	} else if !errors.Is(err, model.ErrNotFound) {
		return workerapi.RegisterResponse{}, fmt.Errorf("controller: register %s: get worker: %w", req.ID, err)
	}
	if err := c.putTemplates(ctx, req.Templates, now); err != nil {
		return workerapi.RegisterResponse{}, fmt.Errorf("controller: register %s: %w", req.ID, err)
	}
	if err := c.st.UpsertWorker(ctx, wk); err != nil {
		return workerapi.RegisterResponse{}, fmt.Errorf("controller: register %s: upsert worker: %w", req.ID, err)
	}
	key, err := c.CurrentSigningKey(ctx)
	if err != nil {
		return workerapi.RegisterResponse{}, fmt.Errorf("controller: register %s: %w", req.ID, err)
	}
	keys, err := c.workerKeys(ctx, wk.ID)
	if err != nil {
		return workerapi.RegisterResponse{}, fmt.Errorf("controller: register %s: %w", req.ID, err)
	}
	c.log.Info("controller: worker registered", "worker", wk.ID, "data_plane", wk.DataPlaneURL, "runtimes", wk.RuntimeNames(),
		"templates", wk.Templates, "capacity_mib", wk.CapacityMiB, "capacity_vcpus", wk.CapacityVCPUs, "new_credential", issued != "")
	c.Kick()
	return workerapi.RegisterResponse{
		WorkerID:     wk.ID,
		SigningKey:   base64.StdEncoding.EncodeToString(token.WorkerKey(key, wk.ID)),
		WorkerSecret: issued,
		SigningKeys:  keys,
		// Lost after this long: the worker fences itself before.
		WorkerLossGraceS: int64(c.cfg.WorkerLossGrace / time.Second),
	}, nil
}

func validTemplates(ts []model.Template) error {
	for _, t := range ts {
		if t.Name == "" || t.Digest == "" {
			return model.Errorf(model.ErrInvalid, "template %s:%s@%s: name and digest are required", t.Name, t.Tag, t.Digest)
		}
	}
	return nil
}

// putTemplates records what a worker reports, but for templates deleted
// (template_deletions) after the reported copy was made: those the worker
// removes (SyncResponse.RemoveTemplates). A copy made after the deletion
// is a new import, which clears it.
func (c *Controller) putTemplates(ctx context.Context, ts []model.Template, now time.Time) error {
	deleted, err := c.st.ListTemplateDeletions(ctx)
	if err != nil {
		return err
	}
	for _, t := range ts {
		if t.Tag == "" {
			t.Tag = "latest"
		}
		if t.CreatedAt.IsZero() {
			t.CreatedAt = now
		}
		if at, ok := deleted[t.Digest]; ok {
			if !t.CreatedAt.After(at) {
				continue
			}
			if err := c.st.ClearTemplateDeletion(ctx, t.Digest); err != nil {
				return err
			}
			delete(deleted, t.Digest)
		}
		if err := c.st.PutTemplate(ctx, t); err != nil {
			return fmt.Errorf("put template %s:%s: %w", t.Name, t.Tag, err)
		}
	}
	return nil
}

func digests(ts []model.Template) []string {
	var ds []string
	for _, t := range ts {
		if !slices.Contains(ds, t.Digest) {
			ds = append(ds, t.Digest)
		}
	}
	slices.Sort(ds)
	return ds
}

// Heartbeat records that worker id is alive when its Sync body was too
// large to read (workerapi.Server): one runaway report does not mark the
// worker unreachable.
func (c *Controller) Heartbeat(ctx context.Context, id string) error {
	if _, err := c.heartbeat(ctx, id, nil, nil); err != nil {
		c.log.Warn("controller: heartbeat of an oversized sync", "worker", id, "err", err)
		return err
	}
	c.log.Warn("controller: sync body too large; heartbeat recorded, observations dropped", "worker", id, "limit", workerapi.MaxBody)
	return nil
}

// Sync records a heartbeat from worker id, applies what it observed and
// returns its assignments and signing keys. When the assignment version
// equals poll.Version (poll.HasVersion) and the observations changed
// nothing, it waits up to poll.Wait for the assignments to change,
// refreshing the heartbeat while it waits.
func (c *Controller) Sync(ctx context.Context, id string, req workerapi.SyncRequest, poll workerapi.Poll) (workerapi.SyncResponse, error) {
	resp, err := c.sync(ctx, id, req, poll.Version, poll.HasVersion, poll.Wait)
	if err != nil {
		return workerapi.SyncResponse{}, err
	}
	if resp.SigningKeys, err = c.workerKeys(ctx, id); err != nil {
		return workerapi.SyncResponse{}, err
	}
	return resp, nil
}

func (c *Controller) sync(ctx context.Context, id string, req workerapi.SyncRequest, version int64, hasVersion bool, wait time.Duration) (workerapi.SyncResponse, error) {
	if err := validTemplates(req.Templates); err != nil {
		return workerapi.SyncResponse{}, err
	}
	t0 := time.Now()
	if req.FreeMiB != nil && *req.FreeMiB < 0 {
		return workerapi.SyncResponse{}, model.Errorf(model.ErrInvalid, "free_mib must not be negative")
	}
	if c.order.Stale(id, req) {
		// Overtaken by a later Sync of the same worker (this one was cut
		// short and arrived late): what it says is older than what is
		// stored. Its denials were queued again by the worker.
		c.log.Debug("controller: stale sync ignored", "worker", id, "seq", req.Seq)
		req = workerapi.SyncRequest{}
	}
	wasFresh, err := c.heartbeat(ctx, id, req.Templates, req.FreeMiB)
	if err != nil {
		return workerapi.SyncResponse{}, err
	}
	tBeat := time.Since(t0)
	changed := false
	for _, o := range req.Observed {
		o = c.boundObserved(id, o)
		wrote, err := c.observe(ctx, id, o)
		if err != nil {
			c.log.Warn("controller: apply observed state", "worker", id, "sandbox", o.SandboxID, "observed", o.State, "err", err)
			continue
		}
		changed = changed || wrote
	}
	if len(req.NetDenied) > 0 {
		c.networkDenied(ctx, id, req.NetDenied) // netdenied.go
		changed = true                          // answered at once: the worker's next denials are not held up
	}
	if !wasFresh {
		c.Kick() // a worker came back: it may take pending sandboxes
	}
	if changed {
		c.log.Debug("controller: sync applied observations", "worker", id, "heartbeat", tBeat, "total", time.Since(t0))
	}

	timer := time.NewTimer(wait)
	defer timer.Stop()
	beat := time.NewTicker(max(c.cfg.HeartbeatTTL/3, 10*time.Millisecond))
	defer beat.Stop()
	for {
		wake := c.ev.Changed()
		resp, err := c.assignments(ctx, id)
		if err != nil {
			return workerapi.SyncResponse{}, err
		}
		if changed || !hasVersion || resp.Version != version || wait <= 0 {
			return resp, nil
		}
		c.waiting.Add(1)
		select {
		case <-ctx.Done():
			c.waiting.Add(-1)
			return workerapi.SyncResponse{}, ctx.Err()
		case <-timer.C:
			c.waiting.Add(-1)
			return resp, nil
		case <-c.stopping:
			c.waiting.Add(-1)
			return resp, nil
		case <-wake:
		case <-beat.C:
			if _, err := c.heartbeat(ctx, id, nil, nil); err != nil {
				c.waiting.Add(-1)
				return workerapi.SyncResponse{}, err
			}
		}
		c.waiting.Add(-1)
	}
}

// boundObserved truncates an observation's reason and task error to
// workerapi.MaxReason (a worker bounds them itself; one that does not must
// not store megabytes of guest text in the sandbox and its events).
func (c *Controller) boundObserved(wid string, o workerapi.Observed) workerapi.Observed {
	if len(o.Reason) > workerapi.MaxReason {
		c.log.Warn("controller: observed reason too long; truncated", "worker", wid, "sandbox", o.SandboxID, "bytes", len(o.Reason), "limit", workerapi.MaxReason)
		o.Reason = workerapi.TruncateReason(o.Reason)
	}
	if o.Action != nil && len(o.Action.Message) > workerapi.MaxReason {
		c.log.Warn("controller: observed action message too long; truncated", "worker", wid, "sandbox", o.SandboxID, "bytes", len(o.Action.Message), "limit", workerapi.MaxReason)
		a := *o.Action
		a.Message = workerapi.TruncateReason(a.Message)
		o.Action = &a
	}
	if o.Task != nil && len(o.Task.Error) > workerapi.MaxReason {
		c.log.Warn("controller: observed task error too long; truncated", "worker", wid, "sandbox", o.SandboxID, "bytes", len(o.Task.Error), "limit", workerapi.MaxReason)
		t := *o.Task
		t.Error = workerapi.TruncateReason(t.Error)
		o.Task = &t
	}
	return o
}

// heartbeat refreshes worker id's LastHeartbeat (and its templates when
// templates is not nil) and reports whether it was fresh before.
func (c *Controller) heartbeat(ctx context.Context, id string, templates []model.Template, free *int) (bool, error) {
	wk, err := c.st.GetWorker(ctx, id)
	if errors.Is(err, model.ErrNotFound) {
		return false, model.Errorf(model.ErrNotFound, "worker %s is not registered: register first", id)
	}
	if err != nil {
		return false, fmt.Errorf("controller: heartbeat %s: get worker: %w", id, err)
	}
	now := c.now()
	wasFresh := now.Sub(wk.LastHeartbeat) <= c.cfg.HeartbeatTTL
	freeMoved := freeChange(wk.FreeMiB, free)
	if templates == nil && freeMoved == 0 && wasFresh && now.Sub(wk.LastHeartbeat) < c.cfg.HeartbeatTTL/5 && !now.Before(wk.LastHeartbeat) {
		// Recent enough: a sync that reports observations quickly (a pause,
		// a resume) skips the write.
		return true, nil
	}
	wk.LastHeartbeat = now
	if free != nil || freeMoved != 0 {
		wk.FreeMiB = free
	}
	if freeMoved > 0 {
		wasFresh = false // memory came free: pending sandboxes may fit now
	}
	if templates != nil {
		if ds := digests(templates); !slices.Equal(ds, wk.Templates) {
			if err := c.putTemplates(ctx, templates, now); err != nil {
				return false, fmt.Errorf("controller: heartbeat %s: %w", id, err)
			}
			wk.Templates = ds
			wasFresh = false // new templates may unblock placement
		}
	}
	if err := c.st.UpsertWorker(ctx, wk); err != nil {
		return false, fmt.Errorf("controller: heartbeat %s: upsert worker: %w", id, err)
	}
	return wasFresh, nil
}

// freeChange compares a worker's stored free memory with its new report:
// 1 when the new one is at least workerapi.FreeReportStepMiB higher (or newly
// reported), -1 when that much lower, 0 otherwise (also when the report is
// absent: an older worker keeps what it had).
func freeChange(old, cur *int) int {
	switch {
	case cur == nil:
		return 0
	case old == nil || *cur-*old >= workerapi.FreeReportStepMiB:
		return 1
	case *old-*cur >= workerapi.FreeReportStepMiB:
		return -1
	}
	return 0
}

// observe applies what worker wid saw of one sandbox and reports whether it
// wrote anything. Lost races are retried a few times, then left to the
// worker's next Sync.
func (c *Controller) observe(ctx context.Context, wid string, o workerapi.Observed) (bool, error) {
	for range 3 {
		sb, err := c.st.GetSandbox(ctx, o.SandboxID)
		if errors.Is(err, model.ErrNotFound) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("controller: get sandbox %s: %w", o.SandboxID, err)
		}
		if sb.WorkerID != wid {
			return false, nil // not assigned here; the worker deletes it
		}
		// Only the open operations matter here (not the history read
		// computes the prior state from), and pauses and resumes come
		// through this path, so it stays short.
		open, err := c.st.ListOperations(ctx, store.OperationFilter{SandboxID: o.SandboxID, Open: true})
		if err != nil {
			return false, fmt.Errorf("controller: list operations of %s: %w", o.SandboxID, err)
		}
		if at := o.LastActivity; !at.IsZero() && at.After(sb.LastActivityAt) {
			// Activity on the data plane; the store keeps the latest.
			if now := c.now(); at.After(now) {
				at = now // a worker clock ahead of ours does not postpone idleness
			}
			if err := c.st.TouchSandbox(ctx, sb.ID, at.UTC()); err != nil && !errors.Is(err, model.ErrNotFound) {
				c.log.Warn("controller: record activity", "sandbox", sb.ID, "err", err)
			}
		}
		a := decideObserved(sb, open, wid, o, c.now(), c.cfg.OnWorkerLoss == OnLossRestore)
		if a.empty() {
			return false, nil
		}
		a.relate(open)
		err = c.apply(ctx, a, sb)
		if errors.Is(err, model.ErrConflict) {
			continue
		}
		return err == nil, err
	}
	return false, nil
}

// decideObserved returns the transition that observation o by worker wid
// causes on sb (assigned to wid), or an empty action. keepSnapshot: a woken
// sandbox keeps its snapshot in the blob store as the one it is restored
// from should its worker be lost (OnWorkerLoss restore).
func decideObserved(sb model.Sandbox, open []model.Operation, wid string, o workerapi.Observed, now time.Time, keepSnapshot bool) action {
	nsb := sb
	withOp := func(a action, match func(model.Operation) bool, s model.OperationState, reason string) action {
		a.sb = &nsb
		if op, ok := firstOp(open, match); ok {
			a.op = finish(op, s, reason, now)
		}
		return a
	}
	reaches := func(st model.SandboxState) func(model.Operation) bool {
		return func(op model.Operation) bool { return target(op) == st }
	}
	anyOp := func(model.Operation) bool { return true }
	if t := o.Task; t != nil && sb.Task != nil && t.OperationID == sb.Task.OperationID {
		return taskDone(sb, open, o, now)
	}
	switch {
	case o.State == model.StateRunning && sb.State == model.StateStarting:
		nsb.State = model.StateRunning
		nsb.Reason = ""
		nsb.StartedFrom = o.StartedFrom
		nsb.LastActivityAt = now
		return withOp(action{why: "worker reports running"}, reaches(model.StateRunning), model.OpSucceeded, "")

	// Lifecycle (see decide for the desired side).
	case o.State == model.StatePaused && sb.State == model.StateRunning && sb.DesiredState == model.StatePaused:
		nsb.State = model.StatePaused
		return withOp(action{why: "worker reports paused"}, reaches(model.StatePaused), model.OpSucceeded, "")

	case o.State == model.StateRunning && (sb.State == model.StatePaused || sb.State == model.StateWaking) && sb.DesiredState == model.StateRunning:
		nsb.State = model.StateRunning
		nsb.Reason = ""
		nsb.LastActivityAt = now
		if !keepSnapshot {
			nsb.SnapshotShared = false // the snapshot it woke from may go
		}
		return withOp(action{why: "worker reports running after " + string(sb.State)}, reaches(model.StateRunning), model.OpSucceeded, "")

	case o.State == model.StateSuspended && sb.State == model.StateSuspending:
		nsb.State = model.StateSuspended
		nsb.Reason = o.Reason // "" or a note (the snapshot did not reach the blob store, ...)
		nsb.SnapshotID = o.SnapshotID
		nsb.SnapshotBytes = o.SnapshotBytes
		nsb.SnapshotShared = o.SnapshotShared
		return withOp(action{why: "worker reports suspended"}, reaches(model.StateSuspended), model.OpSucceeded, "")

	case (o.State == model.StateRunning || o.State == model.StatePaused) && sb.State == model.StateSuspending:
		if sb.DesiredState == model.StateSuspended {
			reason, failed := actionFailed(o, model.OpSuspend)
			if !failed {
				return action{} // not started yet
			}
			// The suspend failed; the worker kept the runtime: never half
			// suspended.
			// The idle clock restarts, so auto-suspend does not retry at once.
			nsb.State = o.State
			nsb.DesiredState = o.State
			nsb.LastActivityAt = now
			return withOp(action{why: "worker reports suspend failed"}, reaches(model.StateSuspended), model.OpFailed, reason)
		}
		// The suspend was given up (deadline); the worker kept or returned
		// the runtime.
		nsb.State = o.State
		nsb.LastActivityAt = now
		return action{sb: &nsb, why: "worker reports " + string(o.State) + " after an abandoned suspend"}

	case o.State == model.StateSuspended && sb.State == model.StateWaking && wakeFailed(o):
		// The restore failed but the snapshot is intact: back to suspended,
		// still wakeable.
		nsb.State = model.StateSuspended
		nsb.DesiredState = model.StateSuspended
		reason, _ := actionFailed(o, model.OpWake)
		return withOp(action{why: "worker reports wake failed"}, reaches(model.StateRunning), model.OpFailed, reason)

	case o.State == model.StateDeleted && sb.State == model.StateDeleting:
		nsb.State = model.StateDeleted
		return withOp(action{why: "worker reports deleted"}, reaches(model.StateDeleted), model.OpSucceeded, "")

	case o.State == model.StateFailed && !sb.State.Terminal():
		reason := o.Reason
		if reason == "" {
			reason = "worker " + wid + " reported a failure without a reason"
		}
		if sb.DesiredState == model.StateDeleted {
			// Keep deleting: the assignment still says deleted, so the worker
			// retries; only record why it has not finished.
			if sb.Reason == reason {
				return action{}
			}
			nsb.Reason = reason
			return action{sb: &nsb, why: "worker reports delete failure"}
		}
		nsb.State = model.StateFailed
		nsb.Reason = reason
		return withOp(action{why: "worker reports failed"}, anyOp, model.OpFailed, reason)

	case o.State == model.StateDeleted && (sb.State == model.StateRunning || sb.State == model.StatePaused) &&
		(sb.DesiredState == model.StateRunning || sb.DesiredState == model.StatePaused):
		reason := "sandbox disappeared from worker " + wid
		nsb.State = model.StateFailed
		nsb.Reason = reason
		return withOp(action{why: "sandbox disappeared"}, anyOp, model.OpFailed, reason)
	}
	return action{}
}

// actionFailed reports whether o says the worker's action kind (a suspend
// or a wake) failed, and the reason to record. A typed result
// (workerapi.ActionResult) decides; an observation without one, from a
// worker before typed results, is read by its reason as it always was: a
// non-empty reason is the failure.
func actionFailed(o workerapi.Observed, kind model.OperationKind) (string, bool) {
	prefix := string(kind) + " failed"
	switch {
	case o.Action.Failed(kind):
		if o.Reason != "" {
			return o.Reason, true
		}
		return prefix + ": " + o.Action.Message, true
	case o.Action == nil && o.Reason != "":
		if !strings.HasPrefix(o.Reason, prefix) {
			return prefix + ": " + o.Reason, true
		}
		return o.Reason, true
	}
	return "", false
}

func wakeFailed(o workerapi.Observed) bool {
	_, failed := actionFailed(o, model.OpWake)
	return failed
}

// taskDone applies the outcome of sb's task (a checkpoint or a rollback)
// that its worker reports in o: the task is cleared, a checkpoint is added
// to the list, and the task's operation completes.
func taskDone(sb model.Sandbox, open []model.Operation, o workerapi.Observed, now time.Time) action {
	t, res := *sb.Task, *o.Task
	nsb := sb
	nsb.Task = nil
	a := action{sb: &nsb, why: string(t.Kind) + " task done"}
	state, reason := model.OpSucceeded, ""
	switch {
	case res.Error != "":
		state, reason = model.OpFailed, string(t.Kind)+" failed: "+res.Error
	case t.Kind == model.OpCheckpoint:
		nsb.Checkpoints = append(append([]model.Checkpoint(nil), sb.Checkpoints...),
			model.Checkpoint{Name: t.Checkpoint, SnapshotID: res.SnapshotID, Bytes: res.Bytes, CreatedAt: now})
	}
	switch o.State {
	case model.StateFailed:
		// The task took the runtime with it.
		nsb.State, nsb.Reason = model.StateFailed, o.Reason
		if nsb.Reason == "" {
			nsb.Reason = reason
		}
	case model.StateRunning, model.StatePaused:
		if t.Kind == model.OpRollback {
			nsb.State = o.State
			nsb.LastActivityAt = now
		}
	}
	if op, ok := firstOp(open, func(op model.Operation) bool { return op.ID == t.OperationID }); ok {
		a.op = finish(op, state, reason, now)
	}
	return a
}

// assignments lists every sandbox on worker id that is not deleted with
// what the worker should make of it, and a version that changes whenever
// any of them changes.
func (c *Controller) assignments(ctx context.Context, id string) (workerapi.SyncResponse, error) {
	sbs, err := c.listSandboxes(ctx, store.SandboxFilter{WorkerID: id})
	if err != nil {
		return workerapi.SyncResponse{}, err
	}
	slices.SortFunc(sbs, func(a, b model.Sandbox) int { return strings.Compare(a.ID, b.ID) })
	h := fnv.New64a()
	resp := workerapi.SyncResponse{Assignments: []workerapi.Assignment{}}
	for _, sb := range sbs {
		var desired model.SandboxState
		switch sb.State {
		case model.StateDeleted, model.StatePending, model.StateLost:
			// Lost: should its worker come back, it drops what it has left
			// of the sandbox (not assigned), before anything else of it runs.
			continue
		case model.StateDeleting, model.StateFailed:
			desired = model.StateDeleted
		default: // starting, running, paused, suspending, suspended, waking
			// A suspended sandbox stays assigned (desired suspended): its
			// runtime is released but the worker holds its snapshot, and a
			// worker deletes what is not assigned to it.
			desired = sb.DesiredState
			if desired == "" {
				desired = model.StateRunning
			}
		}
		a := workerapi.Assignment{Sandbox: workerapi.SpecOf(sb), Desired: desired}
		if a.Operation, err = c.operationRef(ctx, sb, desired); err != nil {
			return workerapi.SyncResponse{}, err
		}
		if desired != model.StateDeleted {
			if a.Egress, err = service.EgressOf(ctx, c.st, &c.cas, sb); err != nil {
				return workerapi.SyncResponse{}, fmt.Errorf("egress of sandbox %s: %w", sb.ID, err)
			}
		}
		resp.Assignments = append(resp.Assignments, a)
		fmt.Fprintf(h, "%s\x00%s\x00%d\x00", sb.ID, desired, sb.Generation)
		if a.Egress != nil { // a secret's new value reaches the gateway
			fmt.Fprintf(h, "%x\x00%x\x00", sha256.Sum256([]byte(a.Egress.CAKey)), secretsDigest(a.Egress.Secrets))
		}
	}
	if resp.RemoveTemplates, err = c.templateRemovals(ctx, id); err != nil {
		return workerapi.SyncResponse{}, err
	}
	for _, r := range resp.RemoveTemplates {
		fmt.Fprintf(h, "rm\x00%s\x00%d\x00", r.Digest, r.DeletedAt.UnixNano())
	}
	resp.Version = int64(h.Sum64() & math.MaxInt64)
	return resp, nil
}

// operationRef names sb's newest open operation for the worker's spans,
// when the controller traces and sb is on its way somewhere (a settled
// sandbox costs no query).
func (c *Controller) operationRef(ctx context.Context, sb model.Sandbox, desired model.SandboxState) (*workerapi.OperationRef, error) {
	if c.tracer == nil || (sb.State == desired && sb.Task == nil) {
		return nil, nil
	}
	open, err := c.st.ListOperations(ctx, store.OperationFilter{SandboxID: sb.ID, Open: true})
	if err != nil {
		return nil, fmt.Errorf("operations of sandbox %s: %w", sb.ID, err)
	}
	if len(open) == 0 || open[len(open)-1].TraceParent == "" {
		return nil, nil
	}
	op := open[len(open)-1]
	return &workerapi.OperationRef{ID: op.ID, Kind: op.Kind, OrgID: op.OrgID, TraceParent: op.TraceParent}, nil
}

// templateRemovals are the deleted templates worker id last reported.
func (c *Controller) templateRemovals(ctx context.Context, id string) ([]workerapi.TemplateRemoval, error) {
	deleted, err := c.st.ListTemplateDeletions(ctx)
	if err != nil || len(deleted) == 0 {
		return nil, err
	}
	wk, err := c.st.GetWorker(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("controller: template removals of %s: %w", id, err)
	}
	var out []workerapi.TemplateRemoval
	for _, d := range wk.Templates { // sorted
		if at, ok := deleted[d]; ok {
			out = append(out, workerapi.TemplateRemoval{Digest: d, DeletedAt: at})
		}
	}
	return out, nil
}

// secretsDigest is a digest of secret values, for the assignments' version.
func secretsDigest(m map[string]string) [32]byte {
	keys := slices.Sorted(maps.Keys(m))
	h := sha256.New()
	for _, k := range keys {
		fmt.Fprintf(h, "%d:%s%d:%s", len(k), k, len(m[k]), m[k])
	}
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// wakeSettleWait bounds how long Wake waits for a sandbox on its way to
// suspended or paused to get there before it can be woken.
const wakeSettleWait = 10 * time.Second

// Wake wakes (or resumes) a sandbox assigned to worker wid because a
// data-plane request arrived for it, or returns the operation already
// taking it to running. model.ErrConflict when the sandbox opted out of
// auto-wake or cannot be woken from its state.
func (c *Controller) Wake(ctx context.Context, wid string, req workerapi.WakeRequest) (_ model.Operation, err error) {
	if c.tracer != nil {
		// The wake's own trace (the worker's request is not traced), which
		// its operation keeps.
		var span trace.Span
		ctx, span = c.tracer.Start(ctx, "controller: auto-wake", trace.WithAttributes(
			tracing.SandboxID.String(req.SandboxID), tracing.WorkerID.String(wid)))
		defer func() { tracing.End(span, err) }()
	}
	sb, err := c.st.GetSandbox(ctx, req.SandboxID)
	if errors.Is(err, model.ErrNotFound) || err == nil && sb.WorkerID != wid {
		return model.Operation{}, model.Errorf(model.ErrNotFound, "sandbox %q is not assigned to worker %s", req.SandboxID, wid)
	}
	if err != nil {
		return model.Operation{}, fmt.Errorf("controller: wake %s: get sandbox: %w", req.SandboxID, err)
	}
	// The worker asks as soon as its own suspend (or pause) is done, which
	// can be before this server has recorded it: while the sandbox is still
	// on its way to suspended or paused, wait for that to settle (at most
	// wakeSettleWait) instead of refusing a wake that would be valid a
	// moment later.
	var op model.Operation
	var started bool
	settle := time.Now().Add(wakeSettleWait)
	for {
		op, started, err = service.StartLifecycle(ctx, c.st, c.ev, service.LifecycleRequest{
			SandboxID: sb.ID, Kind: model.OpWake, Join: true, RespectNoAutoWake: true,
			Reason: "auto-wake: data-plane request on worker " + wid, Now: c.now(), Deadline: c.cfg.OperationDeadline,
			Guard: service.WakeQuotaGuard(ctx, c.st),
		})
		if err == nil || !errors.Is(err, model.ErrConflict) || time.Now().After(settle) {
			break
		}
		cur, gerr := c.st.GetSandbox(ctx, sb.ID)
		if gerr != nil || cur.State == cur.DesiredState || cur.DesiredState != model.StateSuspended && cur.DesiredState != model.StatePaused {
			break
		}
		select {
		case <-ctx.Done():
			return model.Operation{}, err
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err != nil {
		return model.Operation{}, err
	}
	if err := c.st.TouchSandbox(ctx, sb.ID, c.now()); err != nil {
		c.log.Warn("controller: record activity", "sandbox", sb.ID, "err", err)
	}
	if started {
		c.log.InfoContext(ctx, "controller: auto-wake", "sandbox", sb.ID, "worker", wid, "operation", op.ID)
		c.Kick()
	}
	return op, nil
}
