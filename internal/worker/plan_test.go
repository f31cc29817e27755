package worker

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/workerapi"
)

// TestPlan covers every rule of plan, in its doc comment's numbering.
// Nothing here needs root, a runtime or a snapshot store: plan is pure.
func TestPlan(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	later, earlier := now.Add(time.Second), now.Add(-time.Second)
	env := map[string]string{"K": "v"}
	// assign returns an assignment of id, which the server saw in state
	// st, desired des.
	assign := func(id string, st, des model.SandboxState, opts ...func(*workerapi.Assignment)) workerapi.Assignment {
		a := workerapi.Assignment{Sandbox: workerapi.SandboxSpec{ID: id, State: st}, Desired: des}
		for _, o := range opts {
			o(&a)
		}
		return a
	}
	withEnv := func(a *workerapi.Assignment) { a.Sandbox.Env = env }
	withSnapshot := func(a *workerapi.Assignment) { a.Sandbox.SnapshotID = "snap-9" }
	withTask := func(op string) func(*workerapi.Assignment) {
		return func(a *workerapi.Assignment) { a.Sandbox.Task = &model.Task{OperationID: op, Kind: model.OpCheckpoint} }
	}
	withSource := func(src string) func(*workerapi.Assignment) {
		return func(a *workerapi.Assignment) { a.Sandbox.Source = &model.Source{SandboxID: src, SnapshotID: "s"} }
	}
	running := func(id string) localState { return localState{id: id, state: model.StateRunning} }
	in := func(st model.SandboxState, l localState) localState { l.state = st; return l }
	const gone = "report-gone sbx-a: sandbox is gone from worker w1 (lost across a restart)"

	cases := []struct {
		name  string
		local []localState
		as    []workerapi.Assignment
		f     func(*facts)
		want  []string
	}{
		// 1a. Unadopted at start-up.
		{name: "1a unadopted that ran is failed with why", as: []workerapi.Assignment{assign("sbx-a", model.StateRunning, model.StateRunning)},
			f:    func(f *facts) { f.unadopted = map[string]string{"sbx-a": "could not be adopted"} },
			want: []string{"forget-unadopted sbx-a", "report-failed sbx-a: could not be adopted", "assign sbx-a"}},
		{name: "1a unadopted desired deleted is failed, then deleted", as: []workerapi.Assignment{assign("sbx-a", model.StateStarting, model.StateDeleted)},
			f:    func(f *facts) { f.unadopted = map[string]string{"sbx-a": "why"} },
			want: []string{"forget-unadopted sbx-a", "report-failed sbx-a: why", "assign sbx-a", "delete sbx-a"}},
		{name: "1a unadopted with a snapshot id is failed", as: []workerapi.Assignment{assign("sbx-a", model.StateStarting, model.StateRunning, withSnapshot)},
			f:    func(f *facts) { f.unadopted = map[string]string{"sbx-a": "why"} },
			want: []string{"forget-unadopted sbx-a", "report-failed sbx-a: why", "assign sbx-a"}},
		{name: "1a interrupted create is created again", as: []workerapi.Assignment{assign("sbx-a", model.StateStarting, model.StateRunning)},
			f:    func(f *facts) { f.unadopted = map[string]string{"sbx-a": "why"} },
			want: []string{"recreate sbx-a [logged]", "start sbx-a"}},
		{name: "1a pending create is created again", as: []workerapi.Assignment{assign("sbx-a", model.StatePending, model.StateRunning)},
			f:    func(f *facts) { f.unadopted = map[string]string{"sbx-a": "why"} },
			want: []string{"recreate sbx-a [logged]", "start sbx-a"}},
		// 1b. A committed snapshot here.
		{name: "1b found suspended stays suspended", as: []workerapi.Assignment{assign("sbx-a", model.StateSuspended, model.StateSuspended, withEnv)},
			f:    func(f *facts) { f.found = map[string]foundSnapshot{"sbx-a": {id: "snap-1", bytes: 10}} },
			want: []string{"found-suspended sbx-a snap-1", "assign sbx-a env-changed"}},
		{name: "1b found suspended and desired running wakes", as: []workerapi.Assignment{assign("sbx-a", model.StateSuspended, model.StateRunning)},
			f:    func(f *facts) { f.found = map[string]foundSnapshot{"sbx-a": {id: "snap-1"}} },
			want: []string{"found-suspended sbx-a snap-1", "assign sbx-a", "wake sbx-a"}},
		{name: "1b found suspended and desired deleted is deleted", as: []workerapi.Assignment{assign("sbx-a", model.StateSuspended, model.StateDeleted)},
			f:    func(f *facts) { f.found = map[string]foundSnapshot{"sbx-a": {id: "snap-1"}} },
			want: []string{"found-suspended sbx-a snap-1", "assign sbx-a", "delete sbx-a"}},
		{name: "1b found by the assignment's snapshot id", as: []workerapi.Assignment{assign("sbx-a", model.StateStarting, model.StateRunning, withSnapshot)},
			f:    func(f *facts) { f.found = map[string]foundSnapshot{"sbx-a": {id: "snap-9"}} },
			want: []string{"found-suspended sbx-a snap-9", "assign sbx-a", "wake sbx-a"}},
		{name: "1b a new sandbox is not looked up", as: []workerapi.Assignment{assign("sbx-a", model.StateStarting, model.StateRunning)},
			f:    func(f *facts) { f.found = map[string]foundSnapshot{"sbx-a": {id: "snap-1"}} },
			want: []string{"start sbx-a"}},
		// 1b'. Not here: pulled from the blob store.
		{name: "1b' moved here waking is pulled, then nothing more", as: []workerapi.Assignment{assign("sbx-a", model.StateWaking, model.StateRunning, withSnapshot)},
			f:    func(f *facts) { f.canPull = true },
			want: []string{"pull sbx-a"}},
		{name: "1b' suspended here without its copy is pulled", as: []workerapi.Assignment{assign("sbx-a", model.StateSuspended, model.StateSuspended, withSnapshot)},
			f:    func(f *facts) { f.canPull = true },
			want: []string{"pull sbx-a"}},
		{name: "1b' a found copy is not pulled", as: []workerapi.Assignment{assign("sbx-a", model.StateWaking, model.StateRunning, withSnapshot)},
			f:    func(f *facts) { f.canPull = true; f.found = map[string]foundSnapshot{"sbx-a": {id: "snap-9"}} },
			want: []string{"found-suspended sbx-a snap-9", "assign sbx-a", "wake sbx-a"}},
		{name: "1b' a failed pull waits, recording nothing", as: []workerapi.Assignment{assign("sbx-a", model.StateWaking, model.StateRunning, withSnapshot)},
			f:    func(f *facts) { f.canPull = true; f.pullWait = map[string]bool{"sbx-a": true} },
			want: nil},
		{name: "1b' desired deleted is not pulled", as: []workerapi.Assignment{assign("sbx-a", model.StateSuspended, model.StateDeleted, withSnapshot)},
			f:    func(f *facts) { f.canPull = true },
			want: []string{"report-gone sbx-a drop-snapshots", "assign sbx-a"}},
		{name: "1b' without a blob store it is failed", as: []workerapi.Assignment{assign("sbx-a", model.StateWaking, model.StateRunning, withSnapshot)},
			want: []string{"report-failed sbx-a: sandbox was waking but worker w1 has neither its runtime nor a committed snapshot of it", "assign sbx-a"}},
		// 1c-1e.
		{name: "1c desired deleted is gone already", as: []workerapi.Assignment{assign("sbx-a", model.StateDeleting, model.StateDeleted)},
			want: []string{"report-gone sbx-a drop-snapshots", "assign sbx-a"}},
		{name: "1d ran and is lost", as: []workerapi.Assignment{assign("sbx-a", model.StateRunning, model.StateRunning)},
			want: []string{gone, "assign sbx-a"}},
		{name: "1d paused and is lost", as: []workerapi.Assignment{assign("sbx-a", model.StatePaused, model.StateSuspended)},
			want: []string{gone, "assign sbx-a"}},
		{name: "1e suspended without a snapshot is failed", as: []workerapi.Assignment{assign("sbx-a", model.StateSuspended, model.StateRunning)},
			want: []string{"report-failed sbx-a: sandbox was suspended but worker w1 has neither its runtime nor a committed snapshot of it", "assign sbx-a"}},
		// 1f.
		{name: "1f new and desired running starts", as: []workerapi.Assignment{assign("sbx-a", "", model.StateRunning, withEnv, withTask("op-1"))},
			want: []string{"start sbx-a"}},
		{name: "1f new and desired paused records nothing", as: []workerapi.Assignment{assign("sbx-a", model.StatePending, model.StatePaused)},
			want: nil},
		// 2.
		{name: "2 a changed env wakes waiters", local: []localState{running("sbx-a")}, as: []workerapi.Assignment{assign("sbx-a", model.StateRunning, model.StateRunning, withEnv)},
			want: []string{"assign sbx-a env-changed"}},
		{name: "2 the same env does not", local: []localState{{id: "sbx-a", state: model.StateRunning, envDigest: model.EnvDigest(env)}},
			as:   []workerapi.Assignment{assign("sbx-a", model.StateRunning, model.StateRunning, withEnv)},
			want: []string{"assign sbx-a"}},
		{name: "2 a task result the assignment dropped is cleared", local: []localState{{id: "sbx-a", state: model.StateRunning, hasTaskResult: true, taskOp: "op-1"}},
			as:   []workerapi.Assignment{assign("sbx-a", model.StateRunning, model.StateRunning)},
			want: []string{"assign sbx-a clear-task"}},
		{name: "2 a task result of another task is cleared and the task runs", local: []localState{{id: "sbx-a", state: model.StateRunning, hasTaskResult: true, taskOp: "op-1"}},
			as:   []workerapi.Assignment{assign("sbx-a", model.StateRunning, model.StateRunning, withTask("op-2"))},
			want: []string{"assign sbx-a clear-task", "task sbx-a op-2"}},
		{name: "2 a busy sandbox gets only its assignment", local: []localState{{id: "sbx-a", state: model.StateRunning, busy: true}},
			as:   []workerapi.Assignment{assign("sbx-a", model.StateRunning, model.StateDeleted, withTask("op-1"))},
			want: []string{"assign sbx-a"}},
		{name: "2 a deleted sandbox gets only its assignment", local: []localState{in(model.StateDeleted, running("sbx-a"))},
			as:   []workerapi.Assignment{assign("sbx-a", model.StateRunning, model.StateDeleted)},
			want: []string{"assign sbx-a"}},
		// 3.
		{name: "3 a task runs before a state change", local: []localState{running("sbx-a")}, as: []workerapi.Assignment{assign("sbx-a", model.StateRunning, model.StatePaused, withTask("op-1"))},
			want: []string{"assign sbx-a", "task sbx-a op-1"}},
		{name: "3 a task runs on a paused sandbox", local: []localState{in(model.StatePaused, running("sbx-a"))}, as: []workerapi.Assignment{assign("sbx-a", model.StatePaused, model.StatePaused, withTask("op-1"))},
			want: []string{"assign sbx-a", "task sbx-a op-1"}},
		{name: "3 a task reported is not run again", local: []localState{{id: "sbx-a", state: model.StateRunning, hasTaskResult: true, taskOp: "op-1"}},
			as:   []workerapi.Assignment{assign("sbx-a", model.StateRunning, model.StateRunning, withTask("op-1"))},
			want: []string{"assign sbx-a"}},
		{name: "3 no task for a sandbox being deleted", local: []localState{running("sbx-a")}, as: []workerapi.Assignment{assign("sbx-a", model.StateRunning, model.StateDeleted, withTask("op-1"))},
			want: []string{"assign sbx-a", "delete sbx-a"}},
		{name: "3 no task for a suspended sandbox", local: []localState{in(model.StateSuspended, running("sbx-a"))}, as: []workerapi.Assignment{assign("sbx-a", model.StateSuspended, model.StateRunning, withTask("op-1"))},
			want: []string{"assign sbx-a", "wake sbx-a"}},
		{name: "3 a worker that cannot snapshot fails the task", local: []localState{running("sbx-a")}, as: []workerapi.Assignment{assign("sbx-a", model.StateRunning, model.StateRunning, withTask("op-1"))},
			f:    func(f *facts) { f.canSnapshot = false },
			want: []string{"assign sbx-a", "cannot-task sbx-a op-1"}},
		// 4.
		{name: "4 desired deleted deletes", local: []localState{in(model.StateFailed, running("sbx-a"))}, as: []workerapi.Assignment{assign("sbx-a", model.StateFailed, model.StateDeleted)},
			want: []string{"assign sbx-a", "delete sbx-a"}},
		{name: "4 a delete waits for its retry time", local: []localState{{id: "sbx-a", state: model.StateFailed, retryAt: later}},
			as:   []workerapi.Assignment{assign("sbx-a", model.StateFailed, model.StateDeleted)},
			want: []string{"assign sbx-a"}},
		{name: "4 a delete past its retry time runs", local: []localState{{id: "sbx-a", state: model.StateFailed, retryAt: earlier}},
			as:   []workerapi.Assignment{assign("sbx-a", model.StateFailed, model.StateDeleted)},
			want: []string{"assign sbx-a", "delete sbx-a"}},
		{name: "4 paused and desired running resumes", local: []localState{in(model.StatePaused, running("sbx-a"))}, as: []workerapi.Assignment{assign("sbx-a", model.StatePaused, model.StateRunning)},
			want: []string{"assign sbx-a", "resume sbx-a"}},
		{name: "4 a resume waits for its retry time", local: []localState{{id: "sbx-a", state: model.StatePaused, retryAt: later}},
			as:   []workerapi.Assignment{assign("sbx-a", model.StatePaused, model.StateRunning)},
			want: []string{"assign sbx-a"}},
		{name: "4 a driver that cannot pause cannot resume", local: []localState{in(model.StatePaused, running("sbx-a"))}, as: []workerapi.Assignment{assign("sbx-a", model.StatePaused, model.StateRunning)},
			f:    func(f *facts) { f.canPause = false },
			want: []string{"assign sbx-a", "cannot-pause sbx-a"}},
		{name: "4 suspended and desired running wakes", local: []localState{in(model.StateSuspended, running("sbx-a"))}, as: []workerapi.Assignment{assign("sbx-a", model.StateSuspended, model.StateRunning)},
			want: []string{"assign sbx-a", "wake sbx-a"}},
		{name: "4 a wake waits for its retry time", local: []localState{{id: "sbx-a", state: model.StateSuspended, wakeRetryAt: later, retryAt: earlier}},
			as:   []workerapi.Assignment{assign("sbx-a", model.StateSuspended, model.StateRunning)},
			want: []string{"assign sbx-a"}},
		{name: "4 running, starting or failed and desired running: nothing", local: []localState{running("sbx-a"), in(model.StateStarting, running("sbx-b")), in(model.StateFailed, running("sbx-c"))},
			as:   []workerapi.Assignment{assign("sbx-a", model.StateRunning, model.StateRunning), assign("sbx-b", model.StateStarting, model.StateRunning), assign("sbx-c", model.StateFailed, model.StateRunning)},
			want: []string{"assign sbx-a", "assign sbx-b", "assign sbx-c"}},
		{name: "4 running and desired paused pauses", local: []localState{running("sbx-a")}, as: []workerapi.Assignment{assign("sbx-a", model.StateRunning, model.StatePaused)},
			want: []string{"assign sbx-a", "pause sbx-a"}},
		{name: "4 a pause waits for its retry time", local: []localState{{id: "sbx-a", state: model.StateRunning, retryAt: later}},
			as:   []workerapi.Assignment{assign("sbx-a", model.StateRunning, model.StatePaused)},
			want: []string{"assign sbx-a"}},
		{name: "4 a driver that cannot pause", local: []localState{running("sbx-a")}, as: []workerapi.Assignment{assign("sbx-a", model.StateRunning, model.StatePaused)},
			f:    func(f *facts) { f.canPause = false },
			want: []string{"assign sbx-a", "cannot-pause sbx-a"}},
		{name: "4 suspended and desired paused: nothing", local: []localState{in(model.StateSuspended, running("sbx-a"))}, as: []workerapi.Assignment{assign("sbx-a", model.StateSuspended, model.StatePaused)},
			want: []string{"assign sbx-a"}},
		{name: "4 running and desired suspended suspends", local: []localState{running("sbx-a")}, as: []workerapi.Assignment{assign("sbx-a", model.StateRunning, model.StateSuspended)},
			want: []string{"assign sbx-a", "suspend sbx-a"}},
		{name: "4 paused and desired suspended suspends", local: []localState{in(model.StatePaused, running("sbx-a"))}, as: []workerapi.Assignment{assign("sbx-a", model.StatePaused, model.StateSuspended)},
			want: []string{"assign sbx-a", "suspend sbx-a"}},
		{name: "4 a suspend waits for its retry time", local: []localState{{id: "sbx-a", state: model.StateRunning, suspendRetryAt: later}},
			as:   []workerapi.Assignment{assign("sbx-a", model.StateRunning, model.StateSuspended)},
			want: []string{"assign sbx-a"}},
		{name: "4 a worker that cannot snapshot cannot suspend", local: []localState{running("sbx-a")}, as: []workerapi.Assignment{assign("sbx-a", model.StateRunning, model.StateSuspended)},
			f:    func(f *facts) { f.canSnapshot = false },
			want: []string{"assign sbx-a", "cannot-suspend sbx-a"}},
		{name: "4 failed and desired suspended: nothing", local: []localState{in(model.StateFailed, running("sbx-a"))}, as: []workerapi.Assignment{assign("sbx-a", model.StateFailed, model.StateSuspended)},
			want: []string{"assign sbx-a"}},
		{name: "4 an unknown desired state is warned of", local: []localState{running("sbx-a")}, as: []workerapi.Assignment{assign("sbx-a", model.StateRunning, "frozen")},
			want: []string{"assign sbx-a", "unsupported sbx-a frozen"}},
		// 5.
		{name: "5 unassigned is deleted", local: []localState{running("sbx-a"), in(model.StateFailed, running("sbx-b"))},
			want: []string{"delete sbx-a", "delete sbx-b"}},
		{name: "5 the first round logs it", local: []localState{running("sbx-a")}, f: func(f *facts) { f.first = true },
			want: []string{"delete sbx-a [logged]"}},
		{name: "5 unassigned busy, deleted or before its retry time is left", local: []localState{{id: "sbx-a", state: model.StateStarting, busy: true}, in(model.StateDeleted, running("sbx-b")), {id: "sbx-c", state: model.StateFailed, retryAt: later}},
			want: nil},
		{name: "5 unadopted and unassigned is forgotten", f: func(f *facts) { f.unadopted = map[string]string{"sbx-b": "x", "sbx-a": "y"} },
			want: []string{"forget-unadopted sbx-a", "forget-unadopted sbx-b"}},
		{name: "5 unadopted with a local record is left to it", local: []localState{running("sbx-a")}, as: []workerapi.Assignment{assign("sbx-a", model.StateRunning, model.StateRunning)},
			f:    func(f *facts) { f.unadopted = map[string]string{"sbx-a": "y"} },
			want: []string{"assign sbx-a"}},
		// 6.
		{name: "6 old orphan snapshots go; young, assigned, local and template ones stay",
			local: []localState{in(model.StateFailed, running("sbx-l"))}, as: []workerapi.Assignment{assign("sbx-as", model.StateSuspended, model.StateSuspended)},
			f: func(f *facts) {
				f.found = map[string]foundSnapshot{"sbx-as": {id: "s"}}
				old := now.Add(-OrphanSnapshotAge)
				f.stored = map[string]time.Time{"sbx-old": old, "sbx-young": now.Add(-OrphanSnapshotAge + time.Second),
					"sbx-as": old, "sbx-l": old, templateSnapshotPrefix + "x": old}
			},
			want: []string{"found-suspended sbx-as s", "assign sbx-as", "delete sbx-l", "drop-orphan-snapshots sbx-old"}},
		{name: "6 the source of a starting sandbox stays", local: []localState{{id: "sbx-b", state: model.StateStarting, busy: true, source: "sbx-src1"}},
			as: []workerapi.Assignment{assign("sbx-c", model.StateStarting, model.StateRunning, withSource("sbx-src2"))},
			f: func(f *facts) {
				old := now.Add(-2 * OrphanSnapshotAge)
				f.stored = map[string]time.Time{"sbx-src1": old, "sbx-src2": old, "sbx-src3": old}
			},
			want: []string{"start sbx-c", "drop-orphan-snapshots sbx-src3"}},
		{name: "6 the source of a sandbox no longer starting goes", local: []localState{{id: "sbx-b", state: model.StateRunning, source: "sbx-src1"}},
			as:   []workerapi.Assignment{assign("sbx-b", model.StateRunning, model.StateRunning, withSource("sbx-src1"))},
			f:    func(f *facts) { f.stored = map[string]time.Time{"sbx-src1": now.Add(-2 * OrphanSnapshotAge)} },
			want: []string{"assign sbx-b", "drop-orphan-snapshots sbx-src1"}},
		// Steps are followed: an assignment listed twice.
		{name: "an assignment listed twice is planned once", local: []localState{running("sbx-a")},
			as:   []workerapi.Assignment{assign("sbx-a", model.StateRunning, model.StateDeleted), assign("sbx-a", model.StateRunning, model.StateDeleted)},
			want: []string{"assign sbx-a", "delete sbx-a", "assign sbx-a"}},
		{name: "a sandbox listed twice is started once", as: []workerapi.Assignment{assign("sbx-a", "", model.StateRunning), assign("sbx-a", "", model.StateRunning)},
			want: []string{"start sbx-a", "assign sbx-a"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := facts{workerID: "w1", canPause: true, canSnapshot: true}
			if c.f != nil {
				c.f(&f)
			}
			unadopted := maps.Clone(f.unadopted)
			var got []string
			for _, s := range plan(c.local, c.as, now, f) {
				got = append(got, s.String())
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("steps:\n  got  %s\n  want %s", strings.Join(got, "\n       "), strings.Join(c.want, "\n       "))
			}
			if !maps.Equal(f.unadopted, unadopted) {
				t.Errorf("plan changed its input: unadopted %v, was %v", f.unadopted, unadopted)
			}
		})
	}
}

// TestPlanStepCarriesTheAssignment checks what the executor needs beyond
// the kind: the assigned record, the snapshot and the reason.
func TestPlanStepCarriesTheAssignment(t *testing.T) {
	now := time.Now()
	a := workerapi.Assignment{Sandbox: workerapi.SandboxSpec{ID: "sbx-a", State: model.StateSuspended, Env: map[string]string{"K": "v"}, Runtime: "gvisor"}, Desired: model.StateRunning}
	steps := plan(nil, []workerapi.Assignment{a}, now, facts{found: map[string]foundSnapshot{"sbx-a": {id: "snap-1", bytes: 42}}})
	if len(steps) != 3 {
		t.Fatalf("steps %v", steps)
	}
	if s := steps[0]; s.kind != stepFoundSuspended || s.snapshot != (foundSnapshot{id: "snap-1", bytes: 42}) {
		t.Errorf("found: %+v", s)
	}
	if s := steps[1]; s.kind != stepAssign || s.sandbox.Runtime != "gvisor" || s.sandbox.Env["K"] != "v" || !s.envChanged {
		t.Errorf("assign: %+v", s)
	}
	start := plan(nil, []workerapi.Assignment{{Sandbox: workerapi.SandboxSpec{ID: "sbx-b", Runtime: "qemu"}, Desired: model.StateRunning}}, now, facts{})
	if len(start) != 1 || start[0].kind != stepStart || start[0].sandbox.Runtime != "qemu" {
		t.Errorf("start: %v", start)
	}
	lost := plan(nil, []workerapi.Assignment{{Sandbox: workerapi.SandboxSpec{ID: "sbx-c", State: model.StateRunning}, Desired: model.StateRunning}}, now, facts{workerID: "w9"})
	if len(lost) == 0 || lost[0].kind != stepReportGone || lost[0].dropSnapshots || !strings.Contains(lost[0].reason, "worker w9") {
		t.Errorf("lost: %v", lost)
	}
}
