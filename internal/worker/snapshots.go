package worker

// Snapshot features (feature gate "snapshots"): the worker's side.
//
// Tasks: an assignment may carry a model.Task. A checkpoint writes a
// committed snapshot of kind checkpoint (Snapshotter.Checkpoint with
// leaveRunning: the sandbox keeps running, or stays paused); a rollback
// releases the runtime and restores the sandbox under its own id from a
// checkpoint. The outcome is reported in Observed.Task until the
// assignment drops the task. A checkpoint task that finds a committed
// checkpoint of that name (a worker restart after it committed) reports it
// instead of writing another.
//
// Crashes: a checkpoint whose worker died while the runtime wrote it is
// committed at the next start if the runtime marked it complete (see
// writeSnapshot and snapshot.Pending.Detach). A rollback is recorded in the
// snapshot store (Store.MarkRestoring) before the runtime is released, and
// a worker that died before the restore was done finishes it at its next
// start (finishRestore, from adopt).
//
// Sources: a sandbox whose assignment has a model.Source (a fork, an
// import) starts by restoring that snapshot under its own id instead of
// booting its template.
//
// Data plane, for the server only (token scope "snapshot"):
//
//	GET    /v1/sandboxes/{sid}/snapshots/{snap}/export  → application/x-tar (snapshot.Store.Export)
//	POST   /v1/sandboxes/{sid}/snapshots  tar body      → 201 snapshot.Manifest (snapshot.Store.Import)
//	DELETE /v1/sandboxes/{sid}/snapshots                → 204 (only for a sandbox the worker does not run)
//
// Snapshots of sandboxes that are neither assigned nor known here (an
// import whose sandbox was never recorded) are removed once they are
// OrphanSnapshotAge old.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/snapshot"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/tracing"
	"github.com/airlock/airlock/internal/workerapi"
)

// OrphanSnapshotAge is how old the snapshots of a sandbox nobody assigned
// to this worker must be before they are removed.
const OrphanSnapshotAge = time.Hour

// templateSnapshotPrefix starts the store ids under which template
// images are kept (never orphans).
const templateSnapshotPrefix = "tpl-"

// TaskTimeout bounds one checkpoint or rollback.
const TaskTimeout = 10 * time.Minute

// startTask runs task t on sb (running or paused); w.mu is held.
func (w *Worker) startTask(ctx context.Context, sb *sandbox, t model.Task) {
	snap, ok := w.cfg.Driver.(runtime.Snapshotter)
	if !ok || w.cfg.Snapshots == nil {
		w.cannotTask(sb, t)
		return
	}
	sb.busy = true
	spec, paused := sb.spec, sb.state == model.StatePaused
	w.actions.Add(1)
	ctx, span := w.actionSpan(ctx, sb.id, string(t.Kind))
	go func() {
		defer w.actions.Done()
		// Like a suspend, a task finishes even when the worker stops.
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), TaskTimeout)
		defer cancel()
		var res workerapi.TaskResult
		switch t.Kind {
		case model.OpCheckpoint:
			res = w.checkpointTask(tctx, sb, snap, spec, t, paused)
		case model.OpRollback:
			res = w.rollbackTask(tctx, sb, snap, spec, t)
		default:
			res = workerapi.TaskResult{Error: fmt.Sprintf("unknown task %q", t.Kind)}
		}
		res.OperationID = t.OperationID
		var terr error
		if res.Error != "" {
			terr = errors.New(res.Error)
		}
		tracing.End(span, terr)
		w.mu.Lock()
		sb.busy = false
		sb.taskResult = &res
		w.changed()
		w.mu.Unlock()
	}()
}

// cannotTask reports task t of sb failed: the worker cannot snapshot
// sandboxes; w.mu is held.
func (w *Worker) cannotTask(sb *sandbox, t model.Task) {
	sb.taskResult = &workerapi.TaskResult{OperationID: t.OperationID, Error: "worker " + w.cfg.ID + " cannot snapshot sandboxes"}
	w.changed()
}

// checkpointTask writes checkpoint t.Checkpoint of sb, which keeps running
// (or stays paused).
func (w *Worker) checkpointTask(ctx context.Context, sb *sandbox, snap runtime.Snapshotter, s workerapi.SandboxSpec, t model.Task, paused bool) workerapi.TaskResult {
	if m, ok := w.findCheckpoint(sb.id, t.Checkpoint); ok {
		return workerapi.TaskResult{SnapshotID: m.ID, Bytes: m.Bytes}
	}
	t0 := time.Now()
	m, err := w.writeSnapshot(ctx, snap, sb.id, sb.id, true, w.snapshotMeta(s, snapshot.KindCheckpoint, t.Checkpoint))
	// The agent's channel was re-established (see runtime.Snapshotter): a
	// new client dials the new connection.
	w.mu.Lock()
	if sb.agent != nil {
		sb.agent.Close()
		sb.agent = nil
	}
	if sb.handle != nil {
		sb.agent = w.newAgentClient(sb.handle)
	}
	ac := sb.agent
	w.mu.Unlock()
	if err != nil {
		w.taskLostRuntime(ctx, sb, "checkpoint", err)
		return workerapi.TaskResult{Error: err.Error()}
	}
	if !paused && ac != nil {
		// Data-plane requests wait while the task is busy; let them find
		// the agent answering.
		if err := ac.WaitReady(ctx); err != nil {
			w.log.Warn("agent after checkpoint", "sandbox", sb.id, "err", err)
		}
	}
	w.log.Info("checkpoint written", "sandbox", sb.id, "checkpoint", t.Checkpoint, "snapshot", m.ID, "bytes", m.Bytes, "took", time.Since(t0))
	return workerapi.TaskResult{SnapshotID: m.ID, Bytes: m.Bytes}
}

// rollbackTask restores sb under its own id from checkpoint t.SnapshotID.
func (w *Worker) rollbackTask(ctx context.Context, sb *sandbox, snap runtime.Snapshotter, s workerapi.SandboxSpec, t model.Task) workerapi.TaskResult {
	t0 := time.Now()
	m, dir, err := w.cfg.Snapshots.Get(sb.id, t.SnapshotID)
	if err != nil {
		// Nothing was touched: the sandbox runs on as it was.
		return workerapi.TaskResult{Error: fmt.Sprintf("checkpoint %q (snapshot %s): %v", t.Checkpoint, t.SnapshotID, err)}
	}
	// From the release of the runtime until the restore is done, nothing
	// of the sandbox runs: a worker that dies meanwhile must find the
	// rollback to finish at its next start (finishRestore).
	spec, err := json.Marshal(s)
	if err == nil {
		err = w.cfg.Snapshots.MarkRestoring(sb.id, snapshot.Restoring{SnapshotID: m.ID, Spec: spec})
	}
	if err != nil {
		return workerapi.TaskResult{Error: "record the rollback: " + err.Error()}
	}
	defer func() {
		if err := w.cfg.Snapshots.ClearRestoring(sb.id); err != nil {
			w.log.Warn("clear the rollback record", "sandbox", sb.id, "err", err)
		}
	}()
	w.mu.Lock()
	closeSandbox(sb)
	w.mu.Unlock()
	if err := w.deleteRuntime(ctx, sb.id); err != nil {
		w.taskLostRuntime(ctx, sb, "rollback", err)
		return workerapi.TaskResult{Error: "release the runtime: " + err.Error()}
	}
	h, ac, err := w.restoreFrom(ctx, s, m, dir, snap)
	if err != nil {
		w.mu.Lock()
		sb.state, sb.reason = model.StateFailed, "rollback to checkpoint "+t.Checkpoint+" failed and the sandbox was lost: "+err.Error()
		w.mu.Unlock()
		return workerapi.TaskResult{Error: err.Error()}
	}
	w.mu.Lock()
	sb.state, sb.reason, sb.handle, sb.agent = model.StateRunning, "", h, ac
	w.mu.Unlock()
	w.log.Info("sandbox rolled back", "sandbox", sb.id, "checkpoint", t.Checkpoint, "took", time.Since(t0))
	return workerapi.TaskResult{}
}

// finishRestore completes a rollback of sandbox id that a worker crash
// interrupted (recorded by rollbackTask with Store.MarkRestoring): whatever
// the runtime has of it is released and it is restored from the recorded
// checkpoint. It is called at adoption, before the first sync; the
// retried rollback task then rolls back once more to the same checkpoint.
func (w *Worker) finishRestore(ctx context.Context, id string, r snapshot.Restoring) {
	sb := &sandbox{id: id}
	err := func() error {
		snap, ok := w.cfg.Driver.(runtime.Snapshotter)
		if !ok {
			return fmt.Errorf("worker %s cannot restore snapshots", w.cfg.ID)
		}
		var s workerapi.SandboxSpec
		if err := json.Unmarshal(r.Spec, &s); err != nil || s.ID != id {
			return fmt.Errorf("the rollback record names no sandbox spec of %s (%v)", id, err)
		}
		m, dir, err := w.cfg.Snapshots.Get(id, r.SnapshotID)
		if err != nil {
			return fmt.Errorf("open checkpoint snapshot %s: %w", r.SnapshotID, err)
		}
		if err := w.deleteRuntime(context.WithoutCancel(ctx), id); err != nil {
			return fmt.Errorf("release the runtime: %w", err)
		}
		h, ac, err := w.restoreFrom(ctx, s, m, dir, snap)
		if err != nil {
			return err
		}
		sb.handle, sb.agent = h, ac
		return nil
	}()
	if err != nil {
		w.log.Error("cannot finish a rollback interrupted by a worker restart", "sandbox", id, "snapshot", r.SnapshotID, "err", err)
		sb.state, sb.reason = model.StateFailed, workerapi.TruncateReason("rollback interrupted by a worker restart could not be finished: "+err.Error())
	} else {
		w.log.Info("finished a rollback interrupted by a worker restart", "sandbox", id, "snapshot", r.SnapshotID)
		sb.state = model.StateRunning
	}
	if err := w.cfg.Snapshots.ClearRestoring(id); err != nil {
		w.log.Warn("clear the rollback record", "sandbox", id, "err", err)
	}
	w.mu.Lock()
	w.sandboxes[id] = sb
	w.mu.Unlock()
	w.changed()
}

// taskLostRuntime marks sb failed when a failed task took its runtime
// with it (and releases what is left); a runtime still there is kept.
func (w *Worker) taskLostRuntime(ctx context.Context, sb *sandbox, what string, cause error) {
	st, err := w.cfg.Driver.Status(ctx, sb.id)
	if err == nil && (st == runtime.StatusRunning || st == runtime.StatusPaused) {
		w.log.Warn(what+" failed; the sandbox runs on", "sandbox", sb.id, "err", cause)
		return
	}
	w.log.Error(what+" failed and the sandbox was lost", "sandbox", sb.id, "status", st, "err", cause)
	w.mu.Lock()
	closeSandbox(sb)
	sb.state, sb.reason = model.StateFailed, what+" failed and the sandbox was lost: "+cause.Error()
	w.mu.Unlock()
	if err := w.deleteRuntime(context.WithoutCancel(ctx), sb.id); err != nil {
		w.log.Error("release lost sandbox", "sandbox", sb.id, "err", err)
	}
}

// snapshotMeta describes a snapshot of s for its manifest.
func (w *Worker) snapshotMeta(s workerapi.SandboxSpec, kind, name string) snapshot.Meta {
	rt := s.Runtime
	if rt == "" {
		rt = w.cfg.Driver.Name()
	}
	return snapshot.Meta{Kind: kind, Name: name, Runtime: rt, Template: s.Template, TemplateDigest: s.TemplateDigest,
		VCPUs: s.Resources.VCPUs, MemoryMiB: s.Resources.MemoryMiB}
}

// findCheckpoint returns the committed checkpoint of sandbox id named name.
func (w *Worker) findCheckpoint(id, name string) (snapshot.Manifest, bool) {
	ms, err := w.cfg.Snapshots.List(id)
	if err != nil {
		return snapshot.Manifest{}, false
	}
	for _, m := range ms {
		if m.Kind == snapshot.KindCheckpoint && m.Name == name {
			return m, true
		}
	}
	return snapshot.Manifest{}, false
}

// startFromSource restores s from its Source snapshot (a fork or an
// import) under its own id.
func (w *Worker) startFromSource(ctx context.Context, s workerapi.SandboxSpec) (runtime.Sandbox, *agentclient.Client, error) {
	snap, ok := w.cfg.Driver.(runtime.Snapshotter)
	if !ok || w.cfg.Snapshots == nil {
		return nil, nil, fmt.Errorf("worker %s cannot restore snapshots", w.cfg.ID)
	}
	src := s.Source
	m, dir, err := w.cfg.Snapshots.Get(src.SandboxID, src.SnapshotID)
	if err != nil {
		return nil, nil, fmt.Errorf("the snapshot to start from (checkpoint %q of %s) is not usable: %w", src.Checkpoint, src.SandboxID, err)
	}
	return w.restoreFrom(ctx, s, m, dir, snap)
}

// ---- data plane ----

func (w *Worker) snapshotHandlers(mux *http.ServeMux) {
	mux.HandleFunc(workerapi.RouteExport, w.handleExport)
	mux.HandleFunc(workerapi.RouteImport, w.handleImport)
	mux.HandleFunc(workerapi.RouteDropSnapshots, w.handleDropSnapshots)
	mux.HandleFunc(workerapi.RouteDropSnapshot, w.handleDropSnapshot)
}

// handleDropSnapshot deletes one snapshot (a checkpoint the server has
// removed from the sandbox's record); never the one a suspended sandbox
// wakes from.
func (w *Worker) handleDropSnapshot(rw http.ResponseWriter, r *http.Request) {
	c, err := w.authorize(r, token.ScopeSnapshot)
	if err != nil {
		writeError(rw, err)
		return
	}
	sid, snap := r.PathValue("sid"), r.PathValue("snap")
	if c.Snapshot != snap {
		writeError(rw, model.Errorf(model.ErrForbidden, "token is for another snapshot"))
		return
	}
	w.mu.Lock()
	current := ""
	if sb := w.sandboxes[sid]; sb != nil {
		current = sb.snapshotID
	}
	w.mu.Unlock()
	if current == snap {
		writeError(rw, model.Errorf(model.ErrConflict, "snapshot %s is the one sandbox %s wakes from", snap, sid))
		return
	}
	if w.cfg.Snapshots != nil {
		if err := w.cfg.Snapshots.Delete(sid, snap); err != nil && !errors.Is(err, snapshot.ErrNotFound) {
			writeError(rw, err)
			return
		}
	}
	w.log.Info("checkpoint snapshot dropped", "sandbox", sid, "snapshot", snap)
	rw.WriteHeader(http.StatusNoContent)
}

func (w *Worker) handleExport(rw http.ResponseWriter, r *http.Request) {
	c, err := w.authorize(r, token.ScopeSnapshot)
	if err != nil {
		writeError(rw, err)
		return
	}
	sid, snap := r.PathValue("sid"), r.PathValue("snap")
	if c.Snapshot != snap {
		writeError(rw, model.Errorf(model.ErrForbidden, "token is for another snapshot"))
		return
	}
	if w.cfg.Snapshots == nil {
		writeError(rw, model.Errorf(model.ErrNotFound, "worker %s has no snapshot store", w.cfg.ID))
		return
	}
	if _, _, err := w.cfg.Snapshots.Get(sid, snap); err != nil {
		writeError(rw, snapshotError(err, sid, snap))
		return
	}
	rw.Header().Set("Content-Type", "application/x-tar")
	rw.WriteHeader(http.StatusOK)
	if err := w.cfg.Snapshots.Export(r.Context(), sid, snap, rw); err != nil {
		// Headers are out: cutting the stream short is all that is left;
		// the importer's checks reject a truncated archive.
		w.log.Warn("export cut short", "sandbox", sid, "snapshot", snap, "err", err)
		panic(http.ErrAbortHandler)
	}
}

func (w *Worker) handleImport(rw http.ResponseWriter, r *http.Request) {
	if _, err := w.authorize(r, token.ScopeSnapshot); err != nil {
		writeError(rw, err)
		return
	}
	sid := r.PathValue("sid")
	if w.cfg.Snapshots == nil {
		writeError(rw, model.Errorf(model.ErrConflict, "worker %s has no snapshot store", w.cfg.ID))
		return
	}
	w.mu.Lock()
	known := w.sandboxes[sid] != nil
	w.mu.Unlock()
	if known {
		writeError(rw, model.Errorf(model.ErrConflict, "sandbox %s already exists on worker %s", sid, w.cfg.ID))
		return
	}
	m, err := w.cfg.Snapshots.Import(r.Context(), sid, r.Body)
	if err != nil {
		writeError(rw, importError(err))
		return
	}
	if w.cfg.RootFS(m.TemplateDigest) == "" {
		_ = w.cfg.Snapshots.DeleteSandbox(sid)
		writeError(rw, model.Errorf(model.ErrUnprocessable, "the archive was taken on template %s (%s), which worker %s does not have", m.Template, m.TemplateDigest, w.cfg.ID))
		return
	}
	w.log.Info("snapshot imported", "sandbox", sid, "snapshot", m.ID, "bytes", m.Bytes)
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(rw).Encode(m)
}

func (w *Worker) handleDropSnapshots(rw http.ResponseWriter, r *http.Request) {
	if _, err := w.authorize(r, token.ScopeSnapshot); err != nil {
		writeError(rw, err)
		return
	}
	sid := r.PathValue("sid")
	w.mu.Lock()
	known := w.sandboxes[sid] != nil
	w.mu.Unlock()
	if known {
		writeError(rw, model.Errorf(model.ErrConflict, "sandbox %s runs on worker %s; delete the sandbox instead", sid, w.cfg.ID))
		return
	}
	if w.cfg.Snapshots != nil {
		if err := w.cfg.Snapshots.DeleteSandbox(sid); err != nil {
			writeError(rw, err)
			return
		}
	}
	rw.WriteHeader(http.StatusNoContent)
}

// importError keeps an archive's faults as 422 with their message.
func importError(err error) error {
	if errors.Is(err, model.ErrInvalid) {
		msg := strings.TrimSuffix(err.Error(), ": invalid")
		if _, rest, ok := strings.Cut(msg, "snapshot: import into "); ok {
			if _, rest, ok = strings.Cut(rest, ": "); ok {
				msg = rest // drop the id of a sandbox that will not exist
			}
		}
		return model.Errorf(model.ErrUnprocessable, "the archive was rejected: %s", msg)
	}
	return err
}

func snapshotError(err error, sid, snap string) error {
	if errors.Is(err, snapshot.ErrNotFound) {
		return model.Errorf(model.ErrNotFound, "snapshot %s of %s is not on this worker", snap, sid)
	}
	return err
}
