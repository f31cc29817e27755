package worker

// Lifecycle beyond start and delete: suspend to a snapshot, wake from one,
// data-plane activity, and waking a sandbox when a data-plane request
// arrives for it while it is paused or suspended.
//
// Suspend: state suspending → Snapshots.Begin → Checkpoint (the guest
// stops) → Commit → delete older suspend snapshots → Driver.Delete → state
// suspended with the snapshot. A failed checkpoint or commit aborts the
// pending snapshot; a runtime still running leaves the sandbox running (or
// paused) with the reason, one the checkpoint killed is released and the
// sandbox failed. Once the checkpoint has returned, the pending snapshot is
// marked complete, so a worker crash before the commit ends is repaired at
// the next start (Store.Recover commits it and the sandbox is found
// suspended). The mark is made by the runtime itself where it can (gVisor:
// the checkpoint runs in a helper process that outlives the worker, holds
// the pending snapshot's lock while it runs and marks it the moment `runsc
// checkpoint` succeeds; snapshot.Pending.Detach), else by the worker once
// the checkpoint has returned (snapshot.Pending.MarkComplete). So a worker
// SIGKILLed while `runsc checkpoint` runs loses nothing either: Recover
// waits for the helper, then commits; see docs/ARCHITECTURE.md.
//
// Wake: state waking → Snapshots.Get (a committed snapshot only) →
// Restore → the agent's WaitReady → running with a new handle and agent
// client (the agent redials the new channel). A failed restore releases
// what it left and reports suspended again with the reason (the snapshot
// is kept and the sandbox stays wakeable); a snapshot that is missing or
// fails its checks makes the sandbox failed.
//
// Invariant behind crash recovery: a committed suspend snapshot of a
// sandbox exists only while the sandbox is suspended, or waking and not
// yet reported running. Suspend deletes older ones once the new one is
// committed; wake deletes the one it restored before it reports running.
// So after a crash, a committed suspend snapshot means "suspended" whatever
// the runtime shows (adoption releases the runtime), and a restorable
// snapshot is never older than what a client has seen.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/snapshot"
	"github.com/airlock/airlock/internal/tracing"
	"github.com/airlock/airlock/internal/workerapi"
)

// Lifecycle timing.
const (
	// SuspendTimeout bounds checkpoint plus commit of one suspend.
	SuspendTimeout = 10 * time.Minute
	// WakeTimeout bounds restore plus the wait for the agent.
	WakeTimeout = 2 * time.Minute
	// SuspendRetryDelay spaces out suspends after one failed (the server
	// normally sets the desired state back to running meanwhile).
	SuspendRetryDelay = 30 * time.Second
	// WakeRetryDelay spaces out wakes after one failed (the server normally
	// sets the desired state back to suspended meanwhile).
	WakeRetryDelay = 5 * time.Second
	// WakeWaitTimeout bounds how long a data-plane request waits for its
	// sandbox to become running (woken, resumed or settled).
	WakeWaitTimeout = 2 * time.Minute
	// ActivityInterval is how often attached commands refresh their
	// sandbox's activity, and how often changed activity is reported.
	ActivityInterval = 5 * time.Second
)

// ---- suspend ----

// startSuspend begins suspending sb (running or paused); w.mu is held.
func (w *Worker) startSuspend(ctx context.Context, sb *sandbox) {
	snap, ok := w.cfg.Driver.(runtime.Snapshotter)
	if !ok || w.cfg.Snapshots == nil {
		w.cannotSuspend(sb)
		return
	}
	sb.busy = true
	sb.state, sb.reason = model.StateSuspending, ""
	w.changed()
	w.actions.Add(1)
	ctx, span := w.actionSpan(ctx, sb.id, "suspend")
	go func() {
		defer w.actions.Done()
		tracing.End(span, w.suspend(ctx, sb, snap))
	}()
}

// cannotSuspend reports that sb cannot be suspended here (no
// runtime.Snapshotter or no snapshot store) and delays a retry; w.mu is
// held.
func (w *Worker) cannotSuspend(sb *sandbox) {
	w.log.Warn("worker cannot suspend sandboxes", "sandbox", sb.id, "runtime", w.cfg.Driver.Name(), "store", w.cfg.Snapshots != nil)
	sb.actionFailed(model.OpSuspend, "suspend failed: worker "+w.cfg.ID+" cannot snapshot sandboxes",
		model.Errorf(model.ErrUnprocessable, "worker %s cannot snapshot sandboxes", w.cfg.ID))
	sb.suspendRetryAt = time.Now().Add(SuspendRetryDelay)
	w.retryAfter(SuspendRetryDelay)
	w.changed()
}

// suspend returns the suspend's failure, for its span (the outcome is
// recorded on sb).
func (w *Worker) suspend(ctx context.Context, sb *sandbox, snap runtime.Snapshotter) error {
	// A suspend finishes even when the worker is stopping: a checkpoint cut
	// short would leave the guest stopped without a snapshot.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), SuspendTimeout)
	defer cancel()
	w.mu.Lock()
	rt := sb.spec.Runtime
	w.mu.Unlock()
	if rt == "" {
		rt = w.cfg.Driver.Name()
	}
	t0 := time.Now()
	meta := snapshot.Meta{Kind: snapshot.KindSuspend, Runtime: rt}
	if s, ok := w.assigned(sb.id); ok {
		meta = w.snapshotMeta(s, snapshot.KindSuspend, "")
		meta.Runtime = rt
	}
	m, err := w.writeSnapshot(ctx, snap, sb.id, sb.id, false, meta)
	if err != nil {
		w.suspendFailed(ctx, sb, err)
		return err
	}
	w.mu.Lock()
	closeSandbox(sb) // the guest is stopped: its channel is useless
	w.mu.Unlock()
	removeOld := w.dropSuspendSnapshots(sb.id, m.ID)
	defer removeOld() // after the state is reported (LIFO: after the unlock below)
	var derr error
	tr := time.Now()
	for i := range 3 {
		if derr = w.deleteRuntime(ctx, sb.id); derr == nil {
			break
		}
		w.log.Warn("release suspended runtime", "sandbox", sb.id, "attempt", i+1, "err", derr)
		time.Sleep(time.Second)
	}
	shared, pushReason := w.pushSuspend(ctx, sb.id, m)
	w.log.InfoContext(ctx, "sandbox suspended", "sandbox", sb.id, "snapshot", m.ID, "bytes", m.Bytes, "shared", shared, "release", time.Since(tr).Round(time.Millisecond), "took", time.Since(t0))
	w.mu.Lock()
	defer w.mu.Unlock()
	sb.busy = false
	sb.state, sb.reason = model.StateSuspended, pushReason
	sb.snapshotID, sb.snapshotBytes, sb.snapshotShared = m.ID, m.Bytes, shared
	if derr != nil {
		// The snapshot is complete; wake releases the leftovers first.
		sb.reason = "runtime not fully released: " + derr.Error()
	}
	w.changed()
	return nil
}

// writeSnapshot checkpoints runtime sandbox id (leaving it running or
// not) into a snapshot filed under storeID in the store and commits it with
// meta (suspends, checkpoints, template images). On failure nothing of it
// is left in the store.
func (w *Worker) writeSnapshot(ctx context.Context, snap runtime.Snapshotter, storeID, id string, leaveRunning bool, meta snapshot.Meta) (m snapshot.Manifest, err error) {
	start := time.Now()
	defer func() { w.observer().Snapshot(string(meta.Kind), m.Bytes, time.Since(start), err) }()
	p, err := w.cfg.Snapshots.Begin(storeID)
	if err != nil {
		return snapshot.Manifest{}, fmt.Errorf("begin snapshot: %w", err)
	}
	// A runtime whose checkpoint outlives this process (gVisor's helper)
	// marks the snapshot complete itself the moment its checkpoint has
	// succeeded, so a worker killed while it runs loses nothing: Recover at
	// the next start waits for it and commits the snapshot.
	if err := p.Detach(meta); err != nil {
		w.log.Warn("prepare snapshot for a detached checkpoint", "sandbox", id, "err", err)
	}
	t0 := time.Now()
	cctx, end := w.stepSpan(ctx, id, "runtime.checkpoint")
	cerr := snap.Checkpoint(cctx, id, p.Dir(), leaveRunning)
	end(cerr)
	if err := cerr; err != nil {
		return snapshot.Manifest{}, errors.Join(fmt.Errorf("checkpoint: %w", err), abort(p))
	}
	t1 := time.Now()
	if !leaveRunning && !p.Completed() {
		// The guest is stopped: from here the snapshot is all there is of
		// it, so a crash before Commit must not lose it (Recover at worker
		// start). For a runtime that did not mark it itself.
		if err := p.MarkComplete(meta); err != nil {
			w.log.Warn("mark snapshot complete", "sandbox", id, "err", err)
		}
	}
	m, err = p.Commit(meta)
	if err != nil {
		return snapshot.Manifest{}, errors.Join(fmt.Errorf("commit snapshot: %w", err), abort(p))
	}
	// Where a suspend's time goes: the runtime's checkpoint, then the
	// store's fsync + sha256 of what it wrote.
	w.log.InfoContext(ctx, "snapshot written", "sandbox", id, "kind", meta.Kind, "snapshot", m.ID, "bytes", m.Bytes,
		"checkpoint", t1.Sub(t0).Round(time.Millisecond), "commit", time.Since(t1).Round(time.Millisecond))
	return m, nil
}

// assigned returns the spec sandbox id was last assigned with.
func (w *Worker) assigned(id string) (workerapi.SandboxSpec, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if sb := w.sandboxes[id]; sb != nil && sb.spec.ID != "" {
		return sb.spec, true
	}
	return workerapi.SandboxSpec{}, false
}

func abort(p *snapshot.Pending) error {
	if err := p.Abort(); err != nil {
		return fmt.Errorf("abort snapshot: %w", err)
	}
	return nil
}

// suspendFailed puts sb back to what its runtime is: running or paused
// with the reason (the server rolls the suspend back), or failed when the
// failed checkpoint took the guest with it.
func (w *Worker) suspendFailed(ctx context.Context, sb *sandbox, err error) {
	st, serr := w.cfg.Driver.Status(ctx, sb.id)
	alive := serr == nil && (st == runtime.StatusRunning || st == runtime.StatusPaused)
	if !alive {
		w.log.Error("suspend failed and the sandbox was lost", "sandbox", sb.id, "status", st, "err", err)
		w.mu.Lock()
		closeSandbox(sb)
		w.mu.Unlock()
		if derr := w.deleteRuntime(ctx, sb.id); derr != nil {
			w.log.Error("release lost sandbox", "sandbox", sb.id, "err", derr)
		}
	} else {
		w.log.Warn("suspend failed; sandbox keeps running", "sandbox", sb.id, "status", st, "err", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	sb.busy = false
	switch {
	case !alive:
		sb.state, sb.reason = model.StateFailed, "suspend failed and the sandbox was lost: "+err.Error()
	case st == runtime.StatusPaused:
		sb.state = model.StatePaused
		sb.actionFailed(model.OpSuspend, "suspend failed: "+err.Error(), err)
	default:
		sb.state = model.StateRunning
		sb.actionFailed(model.OpSuspend, "suspend failed: "+err.Error(), err)
	}
	sb.suspendRetryAt = time.Now().Add(SuspendRetryDelay)
	w.retryAfter(SuspendRetryDelay)
	w.changed()
}

// latestSuspend returns the newest committed suspend snapshot of id.
func (w *Worker) latestSuspend(id string) (snapshot.Manifest, bool) {
	if w.cfg.Snapshots == nil {
		return snapshot.Manifest{}, false
	}
	ms, err := w.cfg.Snapshots.List(id)
	if err != nil {
		w.log.Warn("list snapshots", "sandbox", id, "err", err)
		return snapshot.Manifest{}, false
	}
	var best snapshot.Manifest
	found := false
	for _, m := range ms {
		if m.Kind != snapshot.KindSuspend {
			continue
		}
		if !found || m.CreatedAt.After(best.CreatedAt) {
			best, found = m, true
		}
	}
	return best, found
}

// dropSuspendSnapshots takes the suspend snapshots of id except keep out
// of the store (Store.Retire) and returns the function that removes their
// files, for the caller to run once it has reported the new state.
func (w *Worker) dropSuspendSnapshots(id, keep string) (remove func()) {
	if w.cfg.Snapshots == nil {
		return func() {}
	}
	ms, err := w.cfg.Snapshots.List(id)
	if err != nil {
		w.log.Warn("list snapshots", "sandbox", id, "err", err)
		return func() {}
	}
	var removes []func() error
	for _, m := range ms {
		if m.Kind == snapshot.KindSuspend && m.ID != keep {
			rm, err := w.cfg.Snapshots.Retire(id, m.ID)
			if err != nil {
				w.log.Warn("delete old suspend snapshot", "sandbox", id, "snapshot", m.ID, "err", err)
				continue
			}
			removes = append(removes, rm)
		}
	}
	return func() {
		for _, rm := range removes {
			if err := rm(); err != nil {
				w.log.Warn("delete old suspend snapshot", "sandbox", id, "err", err)
			}
		}
	}
}

// ---- wake ----

// startWake begins restoring suspended sb; w.mu is held.
func (w *Worker) startWake(ctx context.Context, sb *sandbox) {
	snapID, spec := sb.snapshotID, sb.spec
	sb.busy = true
	sb.state, sb.reason = model.StateWaking, ""
	w.changed()
	w.actions.Add(1)
	ctx, span := w.actionSpan(ctx, sb.id, "wake")
	go func() {
		defer w.actions.Done()
		tracing.End(span, w.wake(ctx, sb, spec, snapID))
	}()
}

// wake returns the wake's failure, for its span (the outcome is recorded
// on sb).
func (w *Worker) wake(ctx context.Context, sb *sandbox, s workerapi.SandboxSpec, snapID string) error {
	t0 := time.Now()
	h, ac, unusable, err := w.restore(ctx, s, snapID)
	w.observer().Snapshot("restore", 0, time.Since(t0), err)
	if err == nil {
		// The guest runs on: the snapshot it came from goes before anyone
		// sees it running (see the invariant above); its files are removed
		// once it is reported running.
		defer w.dropSuspendSnapshots(sb.id, "")()
	}
	w.mu.Lock()
	sb.busy = false
	switch {
	case err != nil && ctx.Err() != nil:
		// Stopping: still suspended; the next worker process wakes it.
		sb.state = model.StateSuspended
	case err != nil && unusable:
		w.log.Error("wake failed: no usable snapshot", "sandbox", sb.id, "snapshot", snapID, "err", err)
		sb.state, sb.reason = model.StateFailed, "wake failed: "+err.Error()
	case err != nil:
		w.log.Warn("wake failed; still suspended", "sandbox", sb.id, "snapshot", snapID, "err", err)
		sb.state = model.StateSuspended
		sb.actionFailed(model.OpWake, "wake failed: "+err.Error(), err)
		sb.wakeRetryAt = time.Now().Add(WakeRetryDelay)
		w.retryAfter(WakeRetryDelay)
	default:
		w.log.InfoContext(ctx, "sandbox woken", "sandbox", sb.id, "snapshot", snapID, "took", time.Since(t0))
		sb.state, sb.reason, sb.handle, sb.agent = model.StateRunning, "", h, ac
		sb.snapshotID, sb.snapshotBytes, sb.snapshotShared = "", 0, false
	}
	w.changed()
	w.mu.Unlock()
	return err
}

// restore starts s from its committed snapshot snapID and waits for the
// agent. On failure nothing of the runtime sandbox is left; unusable says
// the snapshot itself is missing or failed its checks.
func (w *Worker) restore(ctx context.Context, s workerapi.SandboxSpec, snapID string) (_ runtime.Sandbox, _ *agentclient.Client, unusable bool, err error) {
	snap, ok := w.cfg.Driver.(runtime.Snapshotter)
	if !ok || w.cfg.Snapshots == nil {
		return nil, nil, false, fmt.Errorf("worker %s cannot restore snapshots", w.cfg.ID)
	}
	if snapID == "" {
		return nil, nil, true, fmt.Errorf("no committed snapshot of %s on worker %s", s.ID, w.cfg.ID)
	}
	m, dir, err := w.cfg.Snapshots.Get(s.ID, snapID)
	if err != nil {
		return nil, nil, true, fmt.Errorf("open snapshot %s: %w", snapID, err)
	}
	h, ac, err := w.restoreFrom(ctx, s, m, dir, snap)
	return h, ac, false, err
}

func (w *Worker) restoreFrom(ctx context.Context, s workerapi.SandboxSpec, m snapshot.Manifest, dir string, snap runtime.Snapshotter) (_ runtime.Sandbox, _ *agentclient.Client, err error) {
	rootfs := w.cfg.RootFS(s.TemplateDigest)
	if rootfs == "" {
		return nil, nil, fmt.Errorf("template %s (%s) is not present on worker %s", s.Template, s.TemplateDigest, w.cfg.ID)
	}
	rctx, cancel := context.WithTimeout(ctx, WakeTimeout)
	defer cancel()
	rt := m.Runtime
	if rt == "" {
		rt = s.Runtime
	}
	spec := runtime.Spec{
		ID:        s.ID,
		Runtime:   rt,
		RootFS:    rootfs,
		VCPUs:     s.Resources.VCPUs,
		MemoryMiB: s.Resources.MemoryMiB,
		DiskMiB:   s.Resources.DiskMiB,
		Hostname:  s.ID,
	}
	defer func() {
		if err != nil { // never leave a half-restored sandbox behind
			if derr := w.deleteRuntime(context.WithoutCancel(ctx), s.ID); derr != nil {
				err = errors.Join(err, fmt.Errorf("clean up: %w", derr))
			}
		}
	}()
	t0 := time.Now()
	h, err := w.restoreRuntime(rctx, snap, spec, dir, s.Network)
	if errors.Is(err, model.ErrConflict) {
		// Leftovers of the suspended runtime (a release that failed) block
		// the restore: release them and try once more. (Asking first would
		// cost every wake a runtime listing.)
		if derr := w.deleteRuntime(rctx, s.ID); derr != nil {
			return nil, nil, fmt.Errorf("restore runtime: %w; release the leftovers: %w", err, derr)
		}
		h, err = w.restoreRuntime(rctx, snap, spec, dir, s.Network)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("restore runtime: %w", err)
	}
	tRestore := time.Since(t0)
	ac := w.newAgentClient(h)
	if err := w.waitAgent(rctx, s.ID, ac); err != nil {
		ac.Close()
		h.Close()
		return nil, nil, fmt.Errorf("agent after restore: %w", err)
	}
	w.log.Debug("restored", "sandbox", s.ID, "snapshot", m.ID, "bytes", m.Bytes, "runtime", tRestore, "agent", time.Since(t0)-tRestore)
	return h, ac, nil
}

// ---- activity ----

// touch records data-plane use of sandbox id.
func (w *Worker) touch(id string) {
	w.mu.Lock()
	if sb := w.sandboxes[id]; sb != nil {
		sb.lastActivity = time.Now()
		w.activity.Store(true)
	}
	w.mu.Unlock()
}

// reportActivity syncs at most every ActivityInterval while activity
// changes, so the server's idle clocks stay current without a sync per
// request.
func (w *Worker) reportActivity(ctx context.Context) {
	t := time.NewTicker(ActivityInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if w.activity.Swap(false) {
				w.kickSync()
			}
		}
	}
}

// ---- waiting for a sandbox on the data plane ----

// wakeCall is one wake request to the server; done is closed when err is set.
type wakeCall struct {
	done chan struct{}
	err  error
}

// awaitAgent returns the agent of sandbox id once it is running: a paused
// or suspended sandbox is woken through the server (which may refuse: the
// request then fails with its message, a conflict), and one in transition
// (starting, suspending, waking) is waited for, at most WakeWaitTimeout.
// EnvSyncTimeout bounds how long an attach waits for the assignment that
// carries the sandbox env its command token was signed against.
const EnvSyncTimeout = 30 * time.Second

// awaitEnv returns the env of sandbox id once it is the one whose
// model.EnvDigest is digest: a command signed right after a warm-pool claim
// can reach the worker before the Sync that brings the claimed env.
func (w *Worker) awaitEnv(ctx context.Context, id, digest string) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, EnvSyncTimeout)
	defer cancel()
	for {
		changed := w.stateChanged()
		w.mu.Lock()
		var env map[string]string
		sb := w.sandboxes[id]
		if sb != nil {
			env = sb.env
		}
		w.mu.Unlock()
		if sb == nil {
			return nil, model.Errorf(model.ErrNotFound, "sandbox %s is not on this worker", id)
		}
		if model.EnvDigest(env) == digest {
			return env, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, model.Errorf(model.ErrUnavailable, "sandbox %s: this worker has not received the sandbox's current env from the server yet; retry", id)
		}
	}
}

func (w *Worker) awaitAgent(ctx context.Context, id string) (*agentclient.Client, map[string]string, error) {
	w.touch(id)
	ctx, cancel := context.WithTimeout(ctx, WakeWaitTimeout)
	defer cancel()
	var call *wakeCall
	for {
		changed := w.stateChanged()
		w.mu.Lock()
		sb := w.sandboxes[id]
		synced := w.synced
		var st model.SandboxState
		wake := false
		switch {
		case sb == nil && !synced:
			// Right after a restart: suspended sandboxes become known at the
			// first sync.
		case sb == nil || sb.state == model.StateDeleted || sb.state == model.StateDeleting:
			w.mu.Unlock()
			return nil, nil, model.Errorf(model.ErrNotFound, "sandbox %s is not on this worker", id)
		case sb.state == model.StateRunning && sb.agent != nil && !sb.busy:
			ac, env := sb.agent, sb.env
			w.mu.Unlock()
			return ac, env, nil
		case sb.state == model.StateFailed:
			reason := sb.reason
			w.mu.Unlock()
			return nil, nil, model.Errorf(model.ErrUnavailable, "sandbox %s failed: %s", id, reason)
		case (sb.state == model.StatePaused || sb.state == model.StateSuspended) && !sb.busy && call == nil:
			wake = true
			if sb.wakeCall == nil {
				sb.wakeCall = &wakeCall{done: make(chan struct{})}
				go w.requestWake(sb, sb.wakeCall)
			}
			call = sb.wakeCall
		}
		if sb != nil {
			st = sb.state
		}
		w.mu.Unlock()
		if wake {
			select {
			case <-call.done:
			case <-ctx.Done():
				return nil, nil, w.notReady(id, st)
			}
			if call.err != nil {
				return nil, nil, call.err
			}
			continue
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, nil, w.notReady(id, st)
		}
	}
}

func (w *Worker) notReady(id string, st model.SandboxState) error {
	if st == "" {
		st = "unknown"
	}
	return model.Errorf(model.ErrUnavailable, "sandbox %s is %s and did not become running within %v; try again", id, st, WakeWaitTimeout)
}

// requestWake asks the server to wake (or resume) sb and records the
// outcome in call. A refusal (409: the sandbox opted out of auto-wake or
// cannot be woken) fails the waiting requests with the server's message.
func (w *Worker) requestWake(sb *sandbox, call *wakeCall) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w.mu.Lock()
	wid := w.workerID
	w.mu.Unlock()
	w.log.Info("data-plane request for a sandbox that is not running; asking the server to wake it", "sandbox", sb.id)
	_, err := w.api.Wake(ctx, wid, workerapi.WakeRequest{SandboxID: sb.id})
	var se *workerapi.Error
	switch {
	case err == nil:
	case errors.As(err, &se) && errors.Is(err, model.ErrConflict):
		err = model.Errorf(model.ErrConflict, "%s", se.Message)
	case errors.As(err, &se):
		kind := se.Unwrap()
		switch kind {
		case model.ErrNotFound, model.ErrUnauthorized, model.ErrForbidden, model.ErrInvalid:
		default:
			// Any other answer (the server failing, or a kind the worker
			// API never gave a wake before httperr) fails the data-plane
			// request as unavailable, as it always did: retry later.
			kind = model.ErrUnavailable
		}
		err = model.Errorf(kind, "wake sandbox %s: %s", sb.id, se.Message)
	default:
		err = model.Errorf(model.ErrUnavailable, "wake sandbox %s: %v", sb.id, err)
	}
	if err != nil {
		w.log.Warn("wake request refused", "sandbox", sb.id, "err", err)
	}
	w.mu.Lock()
	call.err = err
	close(call.done)
	if sb.wakeCall == call {
		sb.wakeCall = nil
	}
	w.mu.Unlock()
}
