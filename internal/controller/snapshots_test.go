package controller

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/workerapi"
)

// enableSnapshots turns the "snapshots" feature gate on for the test org.
func (e *env) enableSnapshots() {
	e.t.Helper()
	org, err := e.st.GetOrg(e.ctx, testOrg)
	if err != nil {
		e.t.Fatal(err)
	}
	org.Features = []string{model.FeatureSnapshots}
	if err := e.st.UpdateOrg(e.ctx, org); err != nil {
		e.t.Fatal(err)
	}
}

// TestCheckpointTask: a checkpoint is a task in the assignment; its
// operation completes only when the worker reports the outcome (not because
// the sandbox is running), the checkpoint is then listed, and other
// lifecycle requests wait for it.
func TestCheckpointTask(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	e.runningSandbox(w, "sb1")
	svc := e.service()

	_, err := svc.CreateCheckpoint(e.ctx, testPrincipal, "sb1", "c1")
	if !errors.Is(err, model.ErrForbidden) || !strings.Contains(err.Error(), `"snapshots"`) {
		t.Fatalf("checkpoint without the gate: %v", err)
	}
	e.enableSnapshots()
	op, err := svc.CreateCheckpoint(e.ctx, testPrincipal, "sb1", "c1")
	if err != nil {
		t.Fatal(err)
	}
	if op.Kind != model.OpCheckpoint || op.State != model.OpRunning || op.Target != model.StateRunning {
		t.Fatalf("checkpoint op %+v", op)
	}
	if again, err := svc.CreateCheckpoint(e.ctx, testPrincipal, "sb1", "c1"); err != nil || again.ID != op.ID {
		t.Fatalf("repeated checkpoint: %v, %v; want the open %s", again.ID, err, op.ID)
	}
	if _, err := svc.CreateCheckpoint(e.ctx, testPrincipal, "sb1", "c2"); !errors.Is(err, model.ErrConflict) {
		t.Fatalf("second checkpoint while one runs: %v, want a conflict", err)
	}
	e.wantConflict(model.OpPause, "sb1", "has a checkpoint operation "+op.ID+" in progress")
	e.reconcile()
	e.wantOp(op.ID, model.OpRunning, "") // running and target reached, but no outcome yet
	resp := w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning})
	if len(resp.Assignments) != 1 || resp.Assignments[0].Sandbox.Task == nil || resp.Assignments[0].Sandbox.Task.Checkpoint != "c1" {
		t.Fatalf("assignment %+v, want the checkpoint task", resp.Assignments)
	}
	w.sync(resp.Version, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning,
		Task: &workerapi.TaskResult{OperationID: op.ID, SnapshotID: "snap-1", Bytes: 4096}})
	e.wantOp(op.ID, model.OpSucceeded, "")
	sb := e.sandbox("sb1")
	if sb.Task != nil || len(sb.Checkpoints) != 1 || sb.Checkpoints[0].Name != "c1" || sb.Checkpoints[0].SnapshotID != "snap-1" || sb.Checkpoints[0].Bytes != 4096 {
		t.Fatalf("after the checkpoint: task %+v, checkpoints %+v", sb.Task, sb.Checkpoints)
	}
	if _, err := svc.CreateCheckpoint(e.ctx, testPrincipal, "sb1", "c1"); !errors.Is(err, model.ErrConflict) || !strings.Contains(err.Error(), "already has a checkpoint") {
		t.Fatalf("duplicate name: %v", err)
	}
	if _, err := svc.CreateCheckpoint(e.ctx, testPrincipal, "sb1", "Bad/Name"); !errors.Is(err, model.ErrUnprocessable) {
		t.Fatalf("invalid name: %v", err)
	}

	// A failed checkpoint fails its operation and leaves the sandbox running.
	op2, err := svc.CreateCheckpoint(e.ctx, testPrincipal, "sb1", "c2")
	if err != nil {
		t.Fatal(err)
	}
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning,
		Task: &workerapi.TaskResult{OperationID: op2.ID, Error: "disk full"}})
	e.wantOp(op2.ID, model.OpFailed, "checkpoint failed: disk full")
	e.wantSandbox("sb1", model.StateRunning, "w1", "")
	if sb := e.sandbox("sb1"); len(sb.Checkpoints) != 1 || sb.Task != nil {
		t.Fatalf("after a failed checkpoint: %+v", sb)
	}

	// A checkpoint past its deadline fails; the sandbox stays running.
	op3, err := svc.CreateCheckpoint(e.ctx, testPrincipal, "sb1", "c3")
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(e.c.OperationDeadline() + time.Minute)
	e.reconcile()
	e.wantOp(op3.ID, model.OpFailed, "deadline")
	e.wantSandbox("sb1", model.StateRunning, "w1", "")
	if sb := e.sandbox("sb1"); sb.Task != nil {
		t.Fatalf("task kept after its deadline: %+v", sb.Task)
	}
}

// TestRollbackTask: a rollback of a paused sandbox names the checkpoint's
// snapshot, wants the sandbox running, and completes on the outcome.
func TestRollbackTask(t *testing.T) {
	e := newEnv(t)
	e.enableSnapshots()
	w := e.worker("w1")
	w.register(baseTemplate)
	e.runningSandbox(w, "sb1")
	svc := e.service()
	op, _ := svc.CreateCheckpoint(e.ctx, testPrincipal, "sb1", "c1")
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning,
		Task: &workerapi.TaskResult{OperationID: op.ID, SnapshotID: "snap-1", Bytes: 1}})
	e.mustLifecycle(model.OpPause, "sb1")
	e.reconcile()
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StatePaused})
	e.wantSandbox("sb1", model.StatePaused, "w1", "")

	if _, err := svc.RollbackSandbox(e.ctx, testPrincipal, "sb1", "nope"); !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("rollback to a missing checkpoint: %v", err)
	}
	rb, err := svc.RollbackSandbox(e.ctx, testPrincipal, "sb1", "c1")
	if err != nil {
		t.Fatal(err)
	}
	sb := e.wantDesired("sb1", model.StateRunning)
	if sb.Task == nil || sb.Task.Kind != model.OpRollback || sb.Task.SnapshotID != "snap-1" {
		t.Fatalf("rollback task %+v", sb.Task)
	}
	e.reconcile()
	e.wantOp(rb.ID, model.OpRunning, "")
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning,
		Task: &workerapi.TaskResult{OperationID: rb.ID}})
	e.wantOp(rb.ID, model.OpSucceeded, "")
	e.wantSandbox("sb1", model.StateRunning, "w1", "")

	// A rollback that loses the runtime fails the sandbox.
	rb2, _ := svc.RollbackSandbox(e.ctx, testPrincipal, "sb1", "c1")
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateFailed, Reason: "rollback failed and the sandbox was lost: boom",
		Task: &workerapi.TaskResult{OperationID: rb2.ID, Error: "boom"}})
	e.wantOp(rb2.ID, model.OpFailed, "rollback failed: boom")
	e.wantSandbox("sb1", model.StateFailed, "w1", "lost")
}

// TestForkPlacement: forks are pinned to the worker that holds the
// checkpoint, even when another worker has more room, and wait (with a
// reason) while that worker is full.
func TestForkPlacement(t *testing.T) {
	e := newEnv(t)
	e.enableSnapshots()
	w1, w2 := e.worker("w1"), e.worker("w2")
	w1.register(baseTemplate)
	e.runningSandbox(w1, "sb1")
	w2.register(baseTemplate)
	svc := e.service()
	op, _ := svc.CreateCheckpoint(e.ctx, testPrincipal, "sb1", "c1")
	w1.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning,
		Task: &workerapi.TaskResult{OperationID: op.ID, SnapshotID: "snap-1", Bytes: 1}})

	forks, err := svc.ForkSandboxes(e.ctx, testPrincipal, service.CreateParams{
		FromCheckpoint: &service.CheckpointRef{SandboxID: "sb1", Checkpoint: "c1"}, Count: 3}, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(forks) != 3 {
		t.Fatalf("%d forks", len(forks))
	}
	e.reconcile()
	for _, f := range forks {
		sb := e.sandbox(f.Sandbox.ID)
		if sb.WorkerID != "w1" || sb.State != model.StateStarting || sb.Source == nil || sb.Source.SnapshotID != "snap-1" || sb.Resources != e.sandbox("sb1").Resources {
			t.Fatalf("fork %+v: want starting on w1 from snap-1 with the source's resources", sb)
		}
		if f.Operation.Kind != model.OpFork {
			t.Fatalf("fork operation %+v", f.Operation)
		}
	}
	if _, err := svc.ForkSandboxes(e.ctx, testPrincipal, service.CreateParams{
		FromCheckpoint: &service.CheckpointRef{SandboxID: "sb1", Checkpoint: "c1"}, Count: service.MaxForks + 1}, ""); !errors.Is(err, model.ErrUnprocessable) {
		t.Fatalf("too many forks: %v", err)
	}
	if _, err := svc.ForkSandboxes(e.ctx, testPrincipal, service.CreateParams{
		FromCheckpoint: &service.CheckpointRef{SandboxID: "sb1", Checkpoint: "c1"}, Template: "base"}, ""); !errors.Is(err, model.ErrUnprocessable) {
		t.Fatalf("fork with a template: %v", err)
	}
	if _, err := svc.ForkSandboxes(e.ctx, testPrincipal, service.CreateParams{
		FromCheckpoint: &service.CheckpointRef{SandboxID: "sb1", Checkpoint: "zz"}}, ""); !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("fork of a missing checkpoint: %v", err)
	}
	// A fork whose worker is full waits with a reason naming it.
	big := e.sandbox("sb1")
	big.Resources.MemoryMiB = 1 << 20
	if _, err := e.st.UpdateSandbox(e.ctx, big); err != nil {
		t.Fatal(err)
	}
	more, err := svc.ForkSandboxes(e.ctx, testPrincipal, service.CreateParams{
		FromCheckpoint: &service.CheckpointRef{SandboxID: "sb1", Checkpoint: "c1"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	e.reconcile()
	e.wantSandbox(more[0].Sandbox.ID, model.StatePending, "", "waiting for worker w1")
}
