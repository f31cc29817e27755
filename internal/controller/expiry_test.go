package controller

import (
	"slices"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
	"github.com/airlock/airlock/internal/workerapi"
)

// TestDecideExpiry tables rule 5: what decide does to a sandbox whose
// ExpiresAt has passed (the E2B timeout semantics: kill, or pause with
// autoPause).
func TestDecideExpiry(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	past, future := now.Add(-time.Second), now.Add(time.Minute)
	c := New(Config{OperationDeadline: time.Hour, Now: func() time.Time { return now }})
	w := model.Worker{ID: "w1", LastHeartbeat: now}
	r := &round{now: now, workers: []model.Worker{w}, byID: map[string]model.Worker{"w1": w}, load: nil}
	sandbox := func(st, desired model.SandboxState, exp *time.Time, on model.ExpiryAction) model.Sandbox {
		wid := "w1"
		if st == model.StatePending {
			wid = ""
		}
		return model.Sandbox{ID: "sb1", OrgID: "org1", State: st, DesiredState: desired, WorkerID: wid, ExpiresAt: exp, OnExpiry: on, Generation: 3}
	}
	open := func(kind model.OperationKind, target model.SandboxState) []model.Operation {
		return []model.Operation{{ID: "op-open", SandboxID: "sb1", Kind: kind, State: model.OpRunning, Target: target, CreatedAt: now, Deadline: now.Add(time.Hour)}}
	}
	checkpointing := sandbox(model.StateRunning, model.StateRunning, &past, model.ExpirySuspend)
	checkpointing.Task = &model.Task{OperationID: "op-open", Kind: model.OpCheckpoint, Checkpoint: "c1"}
	type want struct {
		none    bool               // no action at all
		desired model.SandboxState // the sandbox written with this desired state
		expiry  bool               // the written sandbox keeps its expiry
		newOp   model.OperationKind
	}
	for _, tt := range []struct {
		name string
		sb   model.Sandbox
		open []model.Operation
		want want
	}{
		{"not yet", sandbox(model.StateRunning, model.StateRunning, &future, ""), nil, want{none: true}},
		{"no expiry", sandbox(model.StateRunning, model.StateRunning, nil, ""), nil, want{none: true}},
		{"running: delete", sandbox(model.StateRunning, model.StateRunning, &past, ""), nil,
			want{desired: model.StateDeleted, expiry: true, newOp: model.OpDelete}},
		{"explicit delete", sandbox(model.StateRunning, model.StateRunning, &past, model.ExpiryDelete), nil,
			want{desired: model.StateDeleted, expiry: true, newOp: model.OpDelete}},
		{"exactly at expiry", sandbox(model.StateRunning, model.StateRunning, &now, ""), nil,
			want{desired: model.StateDeleted, expiry: true, newOp: model.OpDelete}},
		{"paused: delete", sandbox(model.StatePaused, model.StatePaused, &past, ""), nil,
			want{desired: model.StateDeleted, expiry: true, newOp: model.OpDelete}},
		{"waking: delete", sandbox(model.StateWaking, model.StateRunning, &past, ""), open(model.OpWake, model.StateRunning),
			want{desired: model.StateDeleted, expiry: true, newOp: model.OpDelete}},
		{"suspended: stays", sandbox(model.StateSuspended, model.StateSuspended, &past, ""), nil, want{none: true}},
		{"suspending: stays", sandbox(model.StateSuspending, model.StateSuspended, &past, ""), open(model.OpSuspend, model.StateSuspended), want{none: true}},
		{"failed: stays", sandbox(model.StateFailed, model.StateRunning, &past, ""), nil, want{none: true}},
		{"running: suspend", sandbox(model.StateRunning, model.StateRunning, &past, model.ExpirySuspend), nil,
			want{desired: model.StateSuspended, newOp: model.OpSuspend}},
		{"running, suspend open: joined", sandbox(model.StateRunning, model.StateSuspended, &past, model.ExpirySuspend), open(model.OpSuspend, model.StateSuspended),
			want{desired: model.StateSuspended}},
		{"running, checkpoint open: cannot suspend, deleted", checkpointing, open(model.OpCheckpoint, model.StateRunning),
			want{desired: model.StateDeleted, expiry: true, newOp: model.OpDelete}},
		{"running, converging: cannot suspend, deleted", sandbox(model.StateRunning, model.StatePaused, &past, model.ExpirySuspend), nil,
			want{desired: model.StateDeleted, expiry: true, newOp: model.OpDelete}},
		{"paused: suspend clears the expiry", sandbox(model.StatePaused, model.StatePaused, &past, model.ExpirySuspend), nil,
			want{desired: model.StatePaused}},
		{"starting: suspend waits", sandbox(model.StateStarting, model.StateRunning, &past, model.ExpirySuspend), open(model.OpCreate, model.StateRunning), want{none: true}},
		{"waking: suspend waits", sandbox(model.StateWaking, model.StateRunning, &past, model.ExpirySuspend), open(model.OpWake, model.StateRunning), want{none: true}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := c.decide(r, tt.sb, tt.open, model.StateRunning)
			if tt.want.none {
				if !a.empty() && (a.newOp || a.sb != nil && (a.sb.DesiredState != tt.sb.DesiredState || a.sb.ExpiresAt != tt.sb.ExpiresAt)) {
					t.Fatalf("decide = %+v (%s), want no expiry action", a, a.why)
				}
				return
			}
			if a.sb == nil {
				t.Fatalf("decide = %+v (%s), want the sandbox written", a, a.why)
			}
			if a.sb.DesiredState != tt.want.desired || (a.sb.ExpiresAt != nil) != tt.want.expiry || a.sb.Generation != tt.sb.Generation {
				t.Errorf("sandbox written with desired %s, expiry %v, generation %d; want desired %s, expiry kept %v, generation %d",
					a.sb.DesiredState, a.sb.ExpiresAt, a.sb.Generation, tt.want.desired, tt.want.expiry, tt.sb.Generation)
			}
			switch {
			case tt.want.newOp == "" && a.op != nil:
				t.Errorf("operation %+v, want none", *a.op)
			case tt.want.newOp != "" && (a.op == nil || !a.newOp):
				t.Errorf("operation %+v (new %v), want a new %s", a.op, a.newOp, tt.want.newOp)
			case tt.want.newOp != "":
				op := *a.op
				wantTarget := map[model.OperationKind]model.SandboxState{model.OpDelete: model.StateDeleted, model.OpSuspend: model.StateSuspended}[tt.want.newOp]
				if op.Kind != tt.want.newOp || op.State != model.OpPending || op.Target != wantTarget || op.SandboxID != "sb1" || op.OrgID != "org1" ||
					!op.Deadline.Equal(now.Add(time.Hour)) || op.Reason != "expired at "+tt.sb.ExpiresAt.Format(time.RFC3339) {
					t.Errorf("new operation %+v", op)
				}
			}
		})
	}
}

// TestExpiryThroughReconcile: expiry runs in the controller's rounds
// through the ordinary lifecycle: an expired sandbox gets a delete
// operation (recorded, with events) and is deleted; an autoPause one gets
// a suspend operation, loses its expiry and reaches suspending.
func TestExpiryThroughReconcile(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	exp := e.clock.Now().Add(time.Minute)
	for _, id := range []string{"kill", "pause", "keep"} {
		e.createSandbox(id, 256)
		sb := e.sandbox(id)
		sb.ExpiresAt = &exp
		if id == "pause" {
			sb.OnExpiry = model.ExpirySuspend
		}
		if id == "keep" {
			later := exp.Add(time.Hour)
			sb.ExpiresAt = &later
		}
		if _, err := e.st.UpdateSandbox(e.ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	e.reconcile()
	var running []workerapi.Observed
	for _, id := range []string{"kill", "pause", "keep"} {
		running = append(running, workerapi.Observed{SandboxID: id, State: model.StateRunning})
	}
	w.sync(-1, 0, running...)
	e.reconcile()
	e.wantSandbox("kill", model.StateRunning, "w1", "")
	e.clock.Advance(2 * time.Minute)
	e.reconcile()

	e.wantSandbox("kill", model.StateDeleting, "w1", "")
	e.wantSandbox("keep", model.StateRunning, "w1", "")
	p := e.wantSandbox("pause", model.StateSuspending, "w1", "")
	if p.ExpiresAt != nil || p.DesiredState != model.StateSuspended {
		t.Fatalf("autoPause sandbox after expiry: desired %s, expires_at %v; want suspended and no expiry", p.DesiredState, p.ExpiresAt)
	}
	for id, kind := range map[string]model.OperationKind{"kill": model.OpDelete, "pause": model.OpSuspend} {
		ops, err := e.st.ListOperations(e.ctx, store.OperationFilter{SandboxID: id, Open: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(ops) != 1 || ops[0].Kind != kind || ops[0].Reason != "expired at "+exp.UTC().Format(time.RFC3339) {
			t.Fatalf("%s: open operations %+v, want one %s for the expiry", id, ops, kind)
		}
		if h := e.history(id); !slices.Contains(h, "operation:"+string(kind)+":pending") {
			t.Errorf("%s: events %q, want one for the expiry's %s operation", id, h, kind)
		}
	}
}
