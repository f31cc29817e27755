package worker

// Snapshots in the shared blob store (Config.Blobs, package blob): a
// suspend pushes its snapshot there before the sandbox is reported
// suspended, so the server may wake it on another worker on the same store
// (model.Sandbox.SnapshotShared); that worker, assigned a suspended
// sandbox whose snapshot it does not have, pulls it (plan rule 1b') and
// then wakes it as its own.
//
// A push that fails leaves the suspend done (the snapshot is committed
// here) and unshared: the sandbox wakes only here, and the reason says why.
// A pull that finds no such snapshot, or one that fails its hashes, fails
// the sandbox with the reason; any other failure (the store unreachable)
// forgets the record and retries after PullRetryDelay.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/snapshot"
	"github.com/airlock/airlock/internal/tracing"
	"github.com/airlock/airlock/internal/workerapi"
)

// Blob store timing.
const (
	// PushTimeout bounds the upload of one suspend snapshot.
	PushTimeout = 10 * time.Minute
	// PullTimeout bounds the download of one.
	PullTimeout = 10 * time.Minute
	// PullRetryDelay spaces out pulls after one failed for a passing
	// reason.
	PullRetryDelay = 5 * time.Second
)

// pushSuspend copies suspend snapshot m of sandbox id to the blob store and
// reports whether it is there, with the reason when it is not.
func (w *Worker) pushSuspend(ctx context.Context, id string, m snapshot.Manifest) (shared bool, reason string) {
	if w.cfg.Blobs == nil {
		return false, ""
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), PushTimeout)
	defer cancel()
	ctx, end := w.stepSpan(ctx, id, "blob.push")
	t0 := time.Now()
	st, err := w.cfg.Snapshots.Push(ctx, w.cfg.Blobs, id, m.ID)
	end(err)
	if err != nil {
		w.log.Warn("suspend snapshot not copied to the blob store; the sandbox wakes only on this worker", "sandbox", id, "snapshot", m.ID, "blob_store", w.cfg.Blobs.String(), "err", err)
		return false, "snapshot not copied to the blob store (it wakes only on worker " + w.cfg.ID + "): " + err.Error()
	}
	w.log.InfoContext(ctx, "suspend snapshot in the blob store", "sandbox", id, "snapshot", m.ID,
		"artifacts", st.Artifacts, "uploaded", st.Uploaded, "bytes", st.Bytes, "took", time.Since(t0).Round(time.Millisecond))
	return true, ""
}

// startPull records suspended sandbox s (assigned here, its snapshot not
// here) and pulls its snapshot from the blob store; w.mu is held.
func (w *Worker) startPull(ctx context.Context, s workerapi.SandboxSpec) {
	sb := &sandbox{id: s.ID, state: model.StateSuspended, env: s.Env, spec: s, busy: true}
	w.record(sb)
	w.actions.Add(1)
	ctx, span := w.actionSpan(ctx, s.ID, "pull")
	go func() {
		defer w.actions.Done()
		tracing.End(span, w.pull(ctx, sb, s))
	}()
}

func (w *Worker) pull(ctx context.Context, sb *sandbox, s workerapi.SandboxSpec) error {
	pctx, cancel := context.WithTimeout(ctx, PullTimeout)
	defer cancel()
	t0 := time.Now()
	m, err := w.cfg.Snapshots.Pull(pctx, w.cfg.Blobs, s.ID, s.SnapshotID)
	w.mu.Lock()
	defer w.mu.Unlock()
	// The assignments have not changed meanwhile, so the long poll would
	// hold them back: plan again at once (the wake follows the pull).
	w.resync.Store(true)
	defer w.changed()
	switch {
	case err == nil:
		w.log.InfoContext(ctx, "pulled a suspend snapshot from the blob store", "sandbox", s.ID, "snapshot", m.ID, "bytes", m.Bytes, "took", time.Since(t0).Round(time.Millisecond))
		sb.busy = false
		sb.snapshotID, sb.snapshotBytes, sb.snapshotShared = m.ID, m.Bytes, true
		return nil
	case ctx.Err() == nil && (errors.Is(err, snapshot.ErrNotFound) || errors.Is(err, snapshot.ErrCorrupt)):
		w.log.Error("no usable snapshot to wake from", "sandbox", s.ID, "snapshot", s.SnapshotID, "err", err)
		sb.busy = false
		sb.state = model.StateFailed
		sb.reason = fmt.Sprintf("cannot wake on worker %s: snapshot %s is not here and not usable from the blob store: %v", w.cfg.ID, s.SnapshotID, err)
		return err
	default:
		// The store unreachable, or the worker stopping: forget the
		// record; the next round pulls again after the delay.
		w.log.Warn("pull of a suspend snapshot failed; retrying", "sandbox", s.ID, "snapshot", s.SnapshotID, "err", err)
		if w.sandboxes[s.ID] == sb {
			delete(w.sandboxes, s.ID)
		}
		w.pullRetryAt[s.ID] = time.Now().Add(PullRetryDelay)
		w.retryAfter(PullRetryDelay)
		return err
	}
}
