package worker

// The reconciliation plan: what the worker does about its local sandboxes
// for one set of assignments, decided without I/O, locks or goroutines.
// reconcile (reconcile.go) copies the local state under Worker.mu, asks
// plan for the steps and carries them out.

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/workerapi"
)

// localState is what plan knows of one local sandbox: a copy of its
// record, taken under Worker.mu.
type localState struct {
	id    string
	state model.SandboxState
	busy  bool // an action is in flight
	// retryAt delays another delete, pause or resume; suspendRetryAt
	// another suspend; wakeRetryAt another wake.
	retryAt, suspendRetryAt, wakeRetryAt time.Time
	envDigest                            string // model.EnvDigest of its env
	// taskOp is the operation id of the task result it reports, while
	// hasTaskResult.
	hasTaskResult bool
	taskOp        string
	// source is the sandbox whose snapshot it starts from (spec.Source).
	source string
}

// foundSnapshot is a committed snapshot of an assigned sandbox the worker
// has no record of: the sandbox is suspended here.
type foundSnapshot struct {
	id    string
	bytes int64
}

// facts is what else plan decides on, gathered with the local state.
type facts struct {
	workerID string
	// first: no Sync had succeeded before (the assignments were not yet
	// authoritative); deletes of unassigned sandboxes are logged.
	first bool
	// canPause: the driver implements runtime.Pauser; canSnapshot: it
	// implements runtime.Snapshotter and the worker has a snapshot store.
	canPause, canSnapshot bool
	// unadopted holds why each runtime sandbox found at start-up could not
	// be adopted (Worker.unadopted).
	unadopted map[string]string
	// found holds the committed snapshots of assigned sandboxes without a
	// local record, for those needsSnapshotLookup names.
	found map[string]foundSnapshot
	// stored lists the sandboxes of the snapshot store with their last
	// change, when the orphan check is due (nil: not due).
	stored map[string]time.Time
	// canPull: the worker has a blob store to pull snapshots from
	// (Config.Blobs) and can restore them; pullWait names the sandboxes
	// whose last pull failed and is not to be retried yet.
	canPull  bool
	pullWait map[string]bool
}

// stepKind names one thing the executor does.
type stepKind string

const (
	// Records of assigned sandboxes the worker knew nothing of (rule 1).
	stepRecreate        stepKind = "recreate"         // forget why it was unadopted, log; a start follows
	stepForgetUnadopted stepKind = "forget-unadopted" // drop the unadopted entry
	stepReportFailed    stepKind = "report-failed"    // record it failed with reason
	stepFoundSuspended  stepKind = "found-suspended"  // record it suspended with its snapshot
	stepReportGone      stepKind = "report-gone"      // record it deleted with reason (and drop its snapshots)
	stepStart           stepKind = "start"            // record it starting and start it
	stepPull            stepKind = "pull"             // record it suspended and pull its snapshot from the blob store

	stepAssign        stepKind = "assign"         // record the assignment: spec, env, task result (rule 2)
	stepTask          stepKind = "task"           // run the assignment's task
	stepCannotTask    stepKind = "cannot-task"    // report the task failed: no snapshots here
	stepDelete        stepKind = "delete"         // delete the sandbox and its snapshots
	stepPause         stepKind = "pause"          // freeze
	stepResume        stepKind = "resume"         // thaw
	stepCannotPause   stepKind = "cannot-pause"   // neither: retry in a minute
	stepSuspend       stepKind = "suspend"        // snapshot and release the runtime
	stepCannotSuspend stepKind = "cannot-suspend" // report the suspend failed; retry later
	stepWake          stepKind = "wake"           // restore from the suspend snapshot
	stepUnsupported   stepKind = "unsupported"    // warn of a desired state the worker does not know

	stepDropOrphanSnapshots stepKind = "drop-orphan-snapshots" // remove a sandbox's snapshots (rule 6)
)

// step is one thing to do about sandbox id.
type step struct {
	kind stepKind
	id   string
	// sandbox is the assigned record (start, assign).
	sandbox workerapi.SandboxSpec
	// reason is recorded with the state (report-failed, report-gone).
	reason string
	// note is logged (Info) before the step is carried out.
	note string
	// envChanged (assign): the env differs from the one recorded, and
	// whoever waits on it is woken; clearTask: the task result reported
	// is dropped (the server has it).
	envChanged, clearTask bool
	// dropSnapshots (report-gone): the sandbox's snapshots are removed.
	dropSnapshots bool
	// snapshot (found-suspended).
	snapshot foundSnapshot
	// task (task, cannot-task).
	task model.Task
	// desired (unsupported).
	desired model.SandboxState
	// lastChange (drop-orphan-snapshots): of the sandbox's snapshots.
	lastChange time.Time
}

// String is the step in one line, for tests and logs.
func (s step) String() string {
	var b strings.Builder
	b.WriteString(string(s.kind) + " " + s.id)
	switch s.kind {
	case stepAssign:
		if s.envChanged {
			b.WriteString(" env-changed")
		}
		if s.clearTask {
			b.WriteString(" clear-task")
		}
	case stepReportGone:
		if s.dropSnapshots {
			b.WriteString(" drop-snapshots")
		}
	case stepFoundSuspended:
		fmt.Fprintf(&b, " %s", s.snapshot.id)
	case stepTask, stepCannotTask:
		fmt.Fprintf(&b, " %s", s.task.OperationID)
	case stepUnsupported:
		fmt.Fprintf(&b, " %s", s.desired)
	}
	if s.note != "" {
		b.WriteString(" [logged]")
	}
	if s.reason != "" {
		b.WriteString(": " + s.reason)
	}
	return b.String()
}

// plan returns the steps that move the local sandboxes toward the
// assignments as of now. Rules, per assignment in order, then for the
// rest:
//
//  1. an assigned sandbox without a local record is discovered:
//     a. one whose runtime could not be adopted at start-up is failed
//     with the reason it was not, unless it is a create the worker
//     died in (never ran, desired running, no snapshot): that is
//     created again;
//     b. one with a committed snapshot here (needsSnapshotLookup) is
//     suspended;
//     b'. one the server has suspended or waking with a snapshot id
//     that is not here, not desired deleted, on a worker with a blob
//     store: its snapshot is pulled from there (it was moved here to
//     wake, or this worker lost its copy); while a failed pull waits to
//     be retried nothing is recorded;
//     c. desired deleted: it is gone already and reported deleted, its
//     snapshots removed;
//     d. the server saw it running or paused: it was lost (the host
//     rebooted) and is reported deleted with a reason, never started
//     empty under its name;
//     e. any other state the server saw it in: failed (no runtime, no
//     snapshot);
//     f. never ran and desired running: it is started (and nothing
//     more this round); otherwise nothing is recorded;
//  2. every recorded assigned sandbox takes the assignment's spec and
//     env, and drops a task result the assignment no longer asks for;
//     one busy (an action in flight) or deleted gets nothing more;
//  3. a task not yet reported runs on a running or paused sandbox not
//     being deleted (or is reported failed when the worker cannot
//     snapshot), before any state change;
//  4. desired state: deleted → delete; running: paused → resume,
//     suspended → wake; paused: running → pause; suspended: running or
//     paused → suspend; each not before its retry time, a pause or
//     resume the driver cannot do is retried in a minute and a suspend
//     the worker cannot do is reported failed and retried after
//     SuspendRetryDelay; an unknown desired state is warned of;
//  5. a local sandbox not assigned, not busy, not deleted and past its
//     retry time is deleted; unadopted entries of sandboxes not
//     assigned are forgotten (their runtime is released);
//  6. when the orphan check is due, snapshots of sandboxes that are
//     neither assigned nor recorded nor the source of a starting one are
//     removed once OrphanSnapshotAge old (template images never).
//
// Steps are ordered: rules 1-4 per assignment as they come, then 5, then
// 6. plan follows its own steps, so an assignment listed twice is
// planned against the state the first left.
func plan(local []localState, as []workerapi.Assignment, now time.Time, f facts) []step {
	cur := make(map[string]*localState, len(local))
	for _, l := range local {
		cur[l.id] = &l
	}
	unadopted := maps.Clone(f.unadopted)
	assigned := make(map[string]bool, len(as))
	var steps []step
	add := func(s step) { steps = append(steps, s) }
	for _, a := range as {
		id := a.Sandbox.ID
		assigned[id] = true
		l := cur[id]
		if l == nil { // 1.
			var more bool
			l, more = discover(a, f, unadopted, add)
			if l != nil {
				cur[id] = l
			}
			if !more {
				continue
			}
		}
		// 2.
		t := a.Sandbox.Task
		rec := step{kind: stepAssign, id: id, sandbox: a.Sandbox}
		if d := model.EnvDigest(a.Sandbox.Env); d != l.envDigest {
			rec.envChanged, l.envDigest = true, d
		}
		if l.hasTaskResult && (t == nil || l.taskOp != t.OperationID) {
			rec.clearTask, l.hasTaskResult, l.taskOp = true, false, ""
		}
		l.source = sourceOf(a.Sandbox)
		add(rec)
		if l.busy || l.state == model.StateDeleted {
			continue
		}
		// 3.
		if t != nil && !l.hasTaskResult && a.Desired != model.StateDeleted &&
			(l.state == model.StateRunning || l.state == model.StatePaused) {
			if f.canSnapshot {
				add(step{kind: stepTask, id: id, task: *t})
				l.busy = true
			} else {
				add(step{kind: stepCannotTask, id: id, task: *t})
				l.hasTaskResult, l.taskOp = true, t.OperationID
			}
			continue
		}
		// 4.
		switch a.Desired {
		case model.StateDeleted:
			if !now.Before(l.retryAt) {
				add(step{kind: stepDelete, id: id})
				l.busy, l.state = true, model.StateDeleting
			}
		case model.StateRunning:
			switch {
			case l.state == model.StatePaused && !now.Before(l.retryAt):
				pauseStep(l, stepResume, now, f, add)
			case l.state == model.StateSuspended && !now.Before(l.wakeRetryAt):
				add(step{kind: stepWake, id: id})
				l.busy, l.state = true, model.StateWaking
			}
			// starting, running or failed: nothing to do
		case model.StatePaused:
			if l.state == model.StateRunning && !now.Before(l.retryAt) {
				pauseStep(l, stepPause, now, f, add)
			}
		case model.StateSuspended:
			if (l.state == model.StateRunning || l.state == model.StatePaused) && !now.Before(l.suspendRetryAt) {
				if f.canSnapshot {
					add(step{kind: stepSuspend, id: id})
					l.busy, l.state = true, model.StateSuspending
				} else {
					add(step{kind: stepCannotSuspend, id: id})
					l.suspendRetryAt = now.Add(SuspendRetryDelay)
				}
			}
		default:
			add(step{kind: stepUnsupported, id: id, desired: a.Desired})
		}
	}
	// 5.
	for _, l0 := range local {
		l := cur[l0.id]
		if assigned[l.id] || l.busy || l.state == model.StateDeleted || now.Before(l.retryAt) {
			continue
		}
		s := step{kind: stepDelete, id: l.id}
		if f.first {
			s.note = "sandbox not assigned to this worker; deleting it"
		}
		add(s)
		l.busy, l.state = true, model.StateDeleting
	}
	for _, id := range slices.Sorted(maps.Keys(unadopted)) {
		if !assigned[id] {
			add(step{kind: stepForgetUnadopted, id: id})
		}
	}
	// 6.
	for _, id := range slices.Sorted(maps.Keys(f.stored)) {
		mod := f.stored[id]
		if assigned[id] || cur[id] != nil || sourceInUse(cur, id) || now.Sub(mod) < OrphanSnapshotAge || strings.HasPrefix(id, templateSnapshotPrefix) {
			continue
		}
		add(step{kind: stepDropOrphanSnapshots, id: id, lastChange: mod})
	}
	return steps
}

// discover applies rule 1 to assignment a of a sandbox without a local
// record: it adds the steps that record it (consuming its unadopted
// entry) and returns its new local state (nil: nothing recorded) and
// whether rules 2-4 apply to it this round.
func discover(a workerapi.Assignment, f facts, unadopted map[string]string, add func(step)) (_ *localState, more bool) {
	id := a.Sandbox.ID
	if why, ok := unadopted[id]; ok { // 1a.
		delete(unadopted, id)
		// A create the worker died in has nothing to lose: its half-made
		// runtime is released, so it is created again. A sandbox that ran
		// is failed: what it held is gone.
		if needsSnapshotLookup(a) {
			add(step{kind: stepForgetUnadopted, id: id})
			add(step{kind: stepReportFailed, id: id, reason: why})
			return &localState{id: id, state: model.StateFailed}, true
		}
		add(step{kind: stepRecreate, id: id, note: "sandbox was being created when the worker stopped; creating it again"})
	}
	snap, found := f.found[id]
	found = found && needsSnapshotLookup(a)
	switch {
	case found: // 1b. Delete, wake or leave suspended: the rules go on from here.
		add(step{kind: stepFoundSuspended, id: id, snapshot: snap})
		return &localState{id: id, state: model.StateSuspended}, true
	case f.canPull && a.Sandbox.SnapshotID != "" && a.Desired != model.StateDeleted &&
		(a.Sandbox.State == model.StateSuspended || a.Sandbox.State == model.StateWaking): // 1b'.
		if f.pullWait[id] {
			return nil, false
		}
		add(step{kind: stepPull, id: id, sandbox: a.Sandbox})
		return &localState{id: id, state: model.StateSuspended, busy: true,
			envDigest: model.EnvDigest(a.Sandbox.Env), source: sourceOf(a.Sandbox)}, false
	case a.Desired == model.StateDeleted: // 1c. Maybe deleted before a restart: reporting deleted is idempotent.
		add(step{kind: stepReportGone, id: id, dropSnapshots: true})
		return &localState{id: id, state: model.StateDeleted}, true
	case a.Sandbox.State == model.StateRunning || a.Sandbox.State == model.StatePaused: // 1d.
		add(step{kind: stepReportGone, id: id, reason: "sandbox is gone from worker " + f.workerID + " (lost across a restart)"})
		return &localState{id: id, state: model.StateDeleted}, true
	case !neverRan(a.Sandbox.State): // 1e.
		add(step{kind: stepReportFailed, id: id,
			reason: "sandbox was " + string(a.Sandbox.State) + " but worker " + f.workerID + " has neither its runtime nor a committed snapshot of it"})
		return &localState{id: id, state: model.StateFailed}, true
	case a.Desired == model.StateRunning: // 1f.
		add(step{kind: stepStart, id: id, sandbox: a.Sandbox})
		return &localState{id: id, state: model.StateStarting, busy: true,
			envDigest: model.EnvDigest(a.Sandbox.Env), source: sourceOf(a.Sandbox)}, false
	default:
		return nil, false
	}
}

// pauseStep plans a pause or resume of l (rule 4).
func pauseStep(l *localState, kind stepKind, now time.Time, f facts, add func(step)) {
	if !f.canPause {
		add(step{kind: stepCannotPause, id: l.id})
		l.retryAt = now.Add(time.Minute)
		return
	}
	add(step{kind: kind, id: l.id})
	l.busy = true
}

// needsSnapshotLookup reports whether an assigned sandbox without a local
// record may be suspended here, so that its committed snapshot is looked
// for: one with a snapshot id, not desired running, or that ran. (A new
// sandbox to start costs no snapshot-store read.)
func needsSnapshotLookup(a workerapi.Assignment) bool {
	return a.Sandbox.SnapshotID != "" || a.Desired != model.StateRunning || !neverRan(a.Sandbox.State)
}

// neverRan reports a server-side state of a sandbox that was never started.
func neverRan(st model.SandboxState) bool {
	return st == "" || st == model.StatePending || st == model.StateStarting
}

// sourceOf names the sandbox whose snapshot s starts from ("" none).
func sourceOf(s workerapi.SandboxSpec) string {
	if s.Source == nil {
		return ""
	}
	return s.Source.SandboxID
}

// sourceInUse reports whether a starting sandbox starts from a snapshot of
// sandbox id.
func sourceInUse(cur map[string]*localState, id string) bool {
	for _, l := range cur {
		if l.state == model.StateStarting && l.source == id && id != "" {
			return true
		}
	}
	return false
}
