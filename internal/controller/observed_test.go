package controller

import (
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/workerapi"
)

// TestDecideObservedActionResults: a failed suspend or wake is told by the
// worker's typed result (workerapi.ActionResult), not by its reason's
// text; an observation without one (a worker before typed results) is read
// by its reason as before.
func TestDecideObservedActionResults(t *testing.T) {
	now := time.Now()
	suspending := model.Sandbox{ID: "sb1", WorkerID: "w1", State: model.StateSuspending, DesiredState: model.StateSuspended}
	waking := model.Sandbox{ID: "sb1", WorkerID: "w1", State: model.StateWaking, DesiredState: model.StateRunning}
	suspendOp := model.Operation{ID: "op-s", SandboxID: "sb1", Kind: model.OpSuspend, State: model.OpRunning, Target: model.StateSuspended}
	wakeOp := model.Operation{ID: "op-w", SandboxID: "sb1", Kind: model.OpWake, State: model.OpRunning, Target: model.StateRunning}
	failedSuspend := &workerapi.ActionResult{Kind: model.OpSuspend, ErrorCode: "internal", Message: "disk full"}
	failedWake := &workerapi.ActionResult{Kind: model.OpWake, ErrorCode: "internal", Message: "restore: bad image"}
	for _, c := range []struct {
		name       string
		sb         model.Sandbox
		op         model.Operation
		o          workerapi.Observed
		wantState  model.SandboxState // "": no transition
		wantReason string
	}{
		{"suspend not started", suspending, suspendOp,
			workerapi.Observed{State: model.StateRunning}, "", ""},
		{"suspend failed, typed", suspending, suspendOp,
			workerapi.Observed{State: model.StateRunning, Reason: "suspend failed: disk full", Action: failedSuspend},
			model.StateRunning, "suspend failed: disk full"},
		{"suspend failed, typed, no reason", suspending, suspendOp,
			workerapi.Observed{State: model.StatePaused, Action: failedSuspend},
			model.StatePaused, "suspend failed: disk full"},
		{"suspend failed, older worker", suspending, suspendOp,
			workerapi.Observed{State: model.StateRunning, Reason: "disk full"},
			model.StateRunning, "suspend failed: disk full"},
		{"a wake's result is no suspend failure", suspending, suspendOp,
			workerapi.Observed{State: model.StateRunning, Reason: "wake failed: earlier", Action: failedWake}, "", ""},
		{"wake not finished", waking, wakeOp,
			workerapi.Observed{State: model.StateSuspended}, "", ""},
		{"wake failed, typed", waking, wakeOp,
			workerapi.Observed{State: model.StateSuspended, Reason: "wake failed: restore: bad image", Action: failedWake},
			model.StateSuspended, "wake failed: restore: bad image"},
		{"wake failed, typed, no reason", waking, wakeOp,
			workerapi.Observed{State: model.StateSuspended, Action: failedWake},
			model.StateSuspended, "wake failed: restore: bad image"},
		{"wake failed, older worker", waking, wakeOp,
			workerapi.Observed{State: model.StateSuspended, Reason: "restore: bad image"},
			model.StateSuspended, "wake failed: restore: bad image"},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.o.SandboxID = "sb1"
			a := decideObserved(c.sb, []model.Operation{c.op}, "w1", c.o, now, false)
			if c.wantState == "" {
				if !a.empty() {
					t.Fatalf("want no transition, got %s (sandbox %+v)", a.why, a.sb)
				}
				return
			}
			if a.sb == nil || a.sb.State != c.wantState || a.sb.DesiredState != c.wantState {
				t.Fatalf("sandbox %+v, want state and desired %s", a.sb, c.wantState)
			}
			if a.op == nil || a.op.State != model.OpFailed || a.op.Reason != c.wantReason {
				t.Fatalf("operation %+v, want failed with %q", a.op, c.wantReason)
			}
		})
	}
}
