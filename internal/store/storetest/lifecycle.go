package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
)

// Lifecycle cases (migration 0002): org feature gates and idle settings,
// sandbox lifecycle columns, and the atomic desired-state + operation write.

func testOrgSettings(t *testing.T, s store.Store) {
	ctx := context.Background()
	six := int64(6 * 3600)
	zero := int64(0)
	withAll := model.Org{ID: "org-a", Name: "Alpha", CreatedAt: at(0), Features: []string{"snapshots", "x"}, IdleSuspendS: &six}
	plain := model.Org{ID: "org-b", Name: "Beta", CreatedAt: at(time.Second)}
	must(t, "create a", s.CreateOrg(ctx, withAll))
	must(t, "create b", s.CreateOrg(ctx, plain))

	got, err := s.GetOrg(ctx, "org-a")
	must(t, "get a", err)
	if !reflect.DeepEqual(got.Features, withAll.Features) || got.IdleSuspendS == nil || *got.IdleSuspendS != six {
		t.Errorf("get a = %+v, want features %v idle %d", got, withAll.Features, six)
	}
	got, err = s.GetOrg(ctx, "org-b")
	must(t, "get b", err)
	if got.Features != nil || got.IdleSuspendS != nil {
		t.Errorf("get b = %+v, want no features and nil idle", got)
	}

	// 0 (never) is distinct from nil (the default).
	got.IdleSuspendS = &zero
	got.Features = []string{"snapshots"}
	got.Name = "Beta 2"
	must(t, "update b", s.UpdateOrg(ctx, got))
	list, err := s.ListOrgs(ctx)
	must(t, "list", err)
	if len(list) != 2 {
		t.Fatalf("list = %+v, want 2 orgs", list)
	}
	b := list[1]
	if b.ID != "org-b" || b.Name != "Beta 2" || b.IdleSuspendS == nil || *b.IdleSuspendS != 0 ||
		!reflect.DeepEqual(b.Features, []string{"snapshots"}) {
		t.Errorf("org-b after update = %+v, want name Beta 2, idle 0, features [snapshots]", b)
	}
	sameTime(t, "created_at kept", b.CreatedAt, plain.CreatedAt)

	b.IdleSuspendS = nil
	b.Features = nil
	must(t, "clear b", s.UpdateOrg(ctx, b))
	got, err = s.GetOrg(ctx, "org-b")
	must(t, "get b cleared", err)
	if got.IdleSuspendS != nil || len(got.Features) != 0 {
		t.Errorf("org-b cleared = %+v, want nil idle and no features", got)
	}
	wantErr(t, "update missing", s.UpdateOrg(ctx, model.Org{ID: "nope", Name: "x"}), model.ErrNotFound)
}

func testSandboxLifecycleFields(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkOrg(t, s, "org-a")
	sb := newSandbox("org-a", "sb-1", at(0))
	sb.IdleSuspendS = 3600
	sb.NoAutoWake = true
	sb.Pool = "sha256:pool"
	created := mkSandbox(t, s, sb)
	sameSandbox(t, "create", created, sb)
	got, err := s.GetSandbox(ctx, "sb-1")
	must(t, "get", err)
	sameSandbox(t, "get", got, sb)

	got.State = model.StateSuspended
	got.SnapshotID = "snap-1"
	got.SnapshotBytes = 1 << 40
	got.SnapshotShared = true
	got.MoveFrom = "w-9"
	got.IdleSuspendS = 0
	got.NoAutoWake = false
	got.Pool = ""
	upd, err := s.UpdateSandbox(ctx, got)
	must(t, "update", err)
	if upd.SnapshotID != "snap-1" || upd.SnapshotBytes != 1<<40 || !upd.SnapshotShared || upd.MoveFrom != "w-9" || upd.IdleSuspendS != 0 || upd.NoAutoWake || upd.Pool != "" {
		t.Errorf("update result = %+v, want snapshot snap-1/%d, idle 0, auto-wake, no pool", upd, int64(1<<40))
	}
	list, _, err := s.ListSandboxes(ctx, store.SandboxFilter{OrgID: "org-a"})
	must(t, "list", err)
	if len(list) != 1 {
		t.Fatalf("list = %v, want 1", ids(list))
	}
	sameSandbox(t, "list", list[0], upd)

	bare := mkSandbox(t, s, newSandbox("org-a", "sb-2", at(time.Second)))
	if bare.IdleSuspendS != 0 || bare.NoAutoWake || bare.SnapshotID != "" || bare.SnapshotBytes != 0 || bare.SnapshotShared || bare.Pool != "" {
		t.Errorf("bare sandbox = %+v, want zero lifecycle fields", bare)
	}
}

func testSandboxSnapshotFields(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkOrg(t, s, "org-a")
	sb := newSandbox("org-a", "sb-fork", at(0))
	sb.Source = &model.Source{WorkerID: "w-1", SandboxID: "sb-src", Checkpoint: "cp1", SnapshotID: "snap-src"}
	created := mkSandbox(t, s, sb)
	sameSandbox(t, "create", created, sb)
	got, err := s.GetSandbox(ctx, "sb-fork")
	must(t, "get", err)
	sameSandbox(t, "get", got, sb)

	got.Task = &model.Task{OperationID: "op-9", Kind: model.OpCheckpoint, Checkpoint: "cp2"}
	got.Checkpoints = []model.Checkpoint{
		{Name: "cp0", SnapshotID: "snap-0", Bytes: 1 << 33, CreatedAt: at(time.Second)},
		{Name: "cp1", SnapshotID: "snap-1", Bytes: 7, CreatedAt: at(2 * time.Second)},
	}
	upd, err := s.UpdateSandbox(ctx, got)
	must(t, "update", err)
	if len(upd.Checkpoints) != 2 || upd.Checkpoints[0] != got.Checkpoints[0] || upd.Checkpoints[1] != got.Checkpoints[1] ||
		upd.Task == nil || *upd.Task != *got.Task || upd.Source == nil || *upd.Source != *sb.Source {
		t.Errorf("update result = %+v\nwant checkpoints %+v, task %+v, source %+v", upd, got.Checkpoints, got.Task, sb.Source)
	}
	upd.Task, upd.Source = nil, nil
	cleared, err := s.UpdateSandbox(ctx, upd)
	must(t, "clear", err)
	list, _, err := s.ListSandboxes(ctx, store.SandboxFilter{OrgID: "org-a"})
	must(t, "list", err)
	if len(list) != 1 || list[0].Task != nil || list[0].Source != nil || len(list[0].Checkpoints) != 2 {
		t.Errorf("list after clearing task and source = %+v", list)
	}
	sameSandbox(t, "list", list[0], cleared)
}

func lifecycleOp(sb model.Sandbox, id string, kind model.OperationKind, target model.SandboxState) model.Operation {
	op := newOp(sb, id)
	op.Kind, op.Target = kind, target
	return op
}

func testUpdateSandboxCreateOperation(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkOrg(t, s, "org-a")
	sb := mkSandbox(t, s, newSandbox("org-a", "sb-1", at(0)))
	sb.State = model.StateRunning
	sb, err := s.UpdateSandbox(ctx, sb)
	must(t, "to running", err)

	want := sb
	want.DesiredState = model.StatePaused
	op := lifecycleOp(sb, "op-pause", model.OpPause, model.StatePaused)
	gotSB, gotOp, err := updateAndCreate(ctx, s, want, op)
	must(t, "pause", err)
	if gotSB.DesiredState != model.StatePaused || gotSB.Generation != sb.Generation+1 {
		t.Errorf("sandbox = desired %s gen %d, want paused gen %d", gotSB.DesiredState, gotSB.Generation, sb.Generation+1)
	}
	if g, w := normOp(gotOp), normOp(op); !reflect.DeepEqual(g, w) {
		t.Errorf("op = %+v, want %+v", g, w)
	}

	// A stale generation writes neither the sandbox nor the operation.
	stale := sb
	stale.DesiredState = model.StateSuspended
	_, _, err = updateAndCreate(ctx, s, stale, lifecycleOp(sb, "op-stale", model.OpSuspend, model.StateSuspended))
	wantErr(t, "stale generation", err, model.ErrConflict)
	if _, err := s.GetOperation(ctx, "op-stale"); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("operation of a lost race: err = %v, want not found", err)
	}
	// A duplicate operation id rolls the sandbox write back.
	dup := gotSB
	dup.Reason = "should not stick"
	_, _, err = updateAndCreate(ctx, s, dup, lifecycleOp(sb, "op-pause", model.OpPause, model.StatePaused))
	wantErr(t, "duplicate operation id", err, model.ErrConflict)
	now, err := s.GetSandbox(ctx, "sb-1")
	must(t, "get", err)
	if now.Generation != gotSB.Generation || now.Reason != "" {
		t.Errorf("sandbox after failed insert: gen %d reason %q, want gen %d and no reason (rolled back)", now.Generation, now.Reason, gotSB.Generation)
	}
	_, _, err = updateAndCreate(ctx, s, model.Sandbox{ID: "nope", Generation: 1}, lifecycleOp(sb, "op-x", model.OpPause, model.StatePaused))
	wantErr(t, "missing sandbox", err, model.ErrNotFound)
}

func testUpdateSandboxCreateOperationConcurrent(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkOrg(t, s, "org-a")
	sb := mkSandbox(t, s, newSandbox("org-a", "sb-1", at(0)))
	const writers = 8
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := sb
			w.DesiredState = model.StatePaused
			_, _, errs[i] = updateAndCreate(ctx, s, w, lifecycleOp(sb, fmt.Sprintf("op-%d", i), model.OpPause, model.StatePaused))
		}()
	}
	wg.Wait()
	wins := 0
	for i, err := range errs {
		switch {
		case err == nil:
			wins++
		case !errors.Is(err, model.ErrConflict):
			t.Errorf("writer %d: err = %v, want nil or conflict", i, err)
		}
	}
	if wins != 1 {
		t.Fatalf("%d writers won with the same generation, want exactly 1", wins)
	}
	open, err := s.ListOperations(ctx, store.OperationFilter{SandboxID: "sb-1", Open: true})
	must(t, "list open", err)
	pauses := 0
	for _, op := range open {
		if op.Kind == model.OpPause {
			pauses++
		}
	}
	if pauses != 1 {
		t.Errorf("%d pause operations stored, want exactly 1 (losers write nothing)", pauses)
	}
}
