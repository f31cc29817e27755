package controller

import (
	"errors"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/store"
	"github.com/airlock/airlock/internal/workerapi"
)

// Warm-pool tests: the service configures pools and claims members, the
// controller fills and drains them, the fake worker runs what it is told.

var operator = service.Principal{OrgID: service.DefaultOrgID, Admin: true}

func newPoolEnv(t *testing.T) (*env, *fakeWorker) {
	t.Helper()
	e := newEnv(t)
	if err := e.st.PutTemplate(e.ctx, baseTemplate); err != nil {
		t.Fatalf("put template: %v", err)
	}
	w := e.worker("w1")
	w.register(baseTemplate)
	return e, w
}

func (e *env) setPool(size int) {
	e.t.Helper()
	if _, err := e.service().SetPool(e.ctx, operator, "base", service.PoolParams{Size: size}); err != nil {
		e.t.Fatalf("set pool base %d: %v", size, err)
	}
}

// members returns the pool members that are not deleted, by state.
func (e *env) members() (live, leaving []model.Sandbox) {
	e.t.Helper()
	sbs, _, err := e.st.ListSandboxes(e.ctx, store.SandboxFilter{OrgID: service.PoolOrgID})
	if err != nil {
		e.t.Fatalf("list pool members: %v", err)
	}
	for _, sb := range sbs {
		if sb.Pool != baseDigest {
			e.t.Errorf("member %s has pool %q, want %q", sb.ID, sb.Pool, baseDigest)
		}
		if sb.DesiredState == model.StateDeleted {
			leaving = append(leaving, sb)
		} else {
			live = append(live, sb)
		}
	}
	return live, leaving
}

// fill reconciles and lets the worker start (or delete) every assignment
// until nothing changes, and returns the live members.
func (e *env) fill(w *fakeWorker) []model.Sandbox {
	e.t.Helper()
	for range 10 {
		e.reconcile()
		resp := w.sync(-1, 0)
		var obs []workerapi.Observed
		for _, a := range resp.Assignments {
			st := model.StateRunning
			if a.Desired == model.StateDeleted {
				st = model.StateDeleted
			}
			obs = append(obs, workerapi.Observed{SandboxID: a.Sandbox.ID, State: st})
		}
		w.sync(-1, 0, obs...)
	}
	e.reconcile()
	live, _ := e.members()
	for _, sb := range live {
		if sb.State != model.StateRunning {
			e.t.Fatalf("member %s is %s after fill", sb.ID, sb.State)
		}
	}
	return live
}

func (e *env) poolStatus() service.PoolStatus {
	e.t.Helper()
	pools, err := e.service().ListPools(e.ctx, operator)
	if err != nil {
		e.t.Fatalf("list pools: %v", err)
	}
	if len(pools) != 1 {
		e.t.Fatalf("pools = %+v, want 1", pools)
	}
	return pools[0]
}

func TestPoolFillClaimRefill(t *testing.T) {
	e, w := newPoolEnv(t)
	e.setPool(3)
	e.reconcile()
	if live, _ := e.members(); len(live) != 3 {
		t.Fatalf("after one round, %d members, want 3", len(live))
	}
	members := e.fill(w)
	if len(members) != 3 {
		t.Fatalf("filled pool has %d members, want 3", len(members))
	}
	if p := e.poolStatus(); p.Ready != 3 || p.Starting != 0 || p.Size != 3 || p.Template != "base:latest" || p.Resources != (model.Resources{VCPUs: 1, MemoryMiB: 512, DiskMiB: 4096}) {
		t.Fatalf("pool status = %+v, want 3 ready", p)
	}

	svc := e.service()
	req := service.CreateParams{Template: "base", Env: map[string]string{"K": "v"}, Metadata: map[string]string{"m": "1"}, TimeoutS: 60}
	sb, op, err := svc.CreateSandbox(e.ctx, testPrincipal, req, "key-1")
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	isMember := false
	for _, m := range members {
		isMember = isMember || m.ID == sb.ID
	}
	if !isMember || sb.State != model.StateRunning || sb.OrgID != testOrg || sb.Pool != "" || sb.Env["K"] != "v" || sb.Metadata["m"] != "1" || sb.ExpiresAt == nil || sb.WorkerID != "w1" {
		t.Fatalf("claimed sandbox = %+v, want a running member of %s with env, metadata and expiry", sb, testOrg)
	}
	if op.Kind != model.OpCreate || op.State != model.OpSucceeded || op.OrgID != testOrg || op.SandboxID != sb.ID {
		t.Fatalf("claim operation = %+v, want a succeeded create", op)
	}
	if got, err := svc.GetSandbox(e.ctx, testPrincipal, sb.ID); err != nil || got.State != model.StateRunning {
		t.Fatalf("get claimed sandbox: %+v, %v", got, err)
	}
	// The same key returns the same claim.
	again, againOp, err := svc.CreateSandbox(e.ctx, testPrincipal, req, "key-1")
	if err != nil || again.ID != sb.ID || againOp.ID != op.ID {
		t.Fatalf("repeat create = %s %s %v, want %s %s", again.ID, againOp.ID, err, sb.ID, op.ID)
	}
	// The worker's assignment carries the new env.
	resp := w.sync(-1, 0)
	for _, a := range resp.Assignments {
		if a.Sandbox.ID == sb.ID && (a.Sandbox.Env["K"] != "v" || a.Desired != model.StateRunning) {
			t.Fatalf("assignment of the claimed sandbox = %+v", a)
		}
	}
	// The pool refills.
	if live, _ := e.members(); len(live) != 2 {
		t.Fatalf("after the claim, %d members, want 2", len(live))
	}
	refilled := e.fill(w)
	if len(refilled) != 3 {
		t.Fatalf("refilled pool has %d members, want 3", len(refilled))
	}
	for _, m := range refilled {
		if m.ID == sb.ID {
			t.Fatalf("claimed sandbox %s is still a member", sb.ID)
		}
	}
	e.wantSandbox(sb.ID, model.StateRunning, "w1", "")
}

func TestPoolCreateFallsBack(t *testing.T) {
	e, w := newPoolEnv(t)
	svc := e.service()
	e.setPool(2)
	e.reconcile() // members pending: nothing to claim yet
	sb, op, err := svc.CreateSandbox(e.ctx, testPrincipal, service.CreateParams{Template: "base"}, "")
	if err != nil || sb.State != model.StatePending || op.State != model.OpPending || sb.Pool != "" {
		t.Fatalf("create with no ready member = %+v %+v %v, want a pending sandbox", sb, op, err)
	}
	e.fill(w)
	for _, tc := range []struct {
		name string
		req  service.CreateParams
	}{
		{"other memory", service.CreateParams{Template: "base", Resources: model.Resources{MemoryMiB: 1024}}},
		{"other vcpus", service.CreateParams{Template: "base", Resources: model.Resources{VCPUs: 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb, op, err := svc.CreateSandbox(e.ctx, testPrincipal, tc.req, "")
			if err != nil || sb.State != model.StatePending || op.State != model.OpPending {
				t.Fatalf("create = %+v %+v %v, want a pending sandbox", sb, op, err)
			}
		})
	}
	if live, _ := e.members(); len(live) != 2 {
		t.Fatalf("%d members after non-matching creates, want 2", len(live))
	}
}

func TestPoolMembersInvisible(t *testing.T) {
	e, w := newPoolEnv(t)
	svc := e.service()
	e.setPool(2)
	members := e.fill(w)
	for _, p := range []service.Principal{testPrincipal, operator} {
		sbs, _, err := svc.ListSandboxes(e.ctx, p, service.ListParams{})
		if err != nil || len(sbs) != 0 {
			t.Fatalf("org %s lists %d sandboxes (%v), want none", p.OrgID, len(sbs), err)
		}
		if _, err := svc.GetSandbox(e.ctx, p, members[0].ID); !errors.Is(err, model.ErrNotFound) {
			t.Fatalf("org %s gets a pool member: err = %v", p.OrgID, err)
		}
		if _, err := svc.DeleteSandbox(e.ctx, p, members[0].ID); !errors.Is(err, model.ErrNotFound) {
			t.Fatalf("org %s deletes a pool member: err = %v", p.OrgID, err)
		}
	}
	for _, p := range []service.Principal{testPrincipal, {OrgID: testOrg, Admin: true}, {OrgID: service.DefaultOrgID}} {
		if _, err := svc.SetPool(e.ctx, p, "base", service.PoolParams{Size: 1}); !errors.Is(err, model.ErrForbidden) {
			t.Errorf("SetPool by %+v: err = %v, want forbidden", p, err)
		}
		if _, err := svc.ListPools(e.ctx, p); !errors.Is(err, model.ErrForbidden) {
			t.Errorf("ListPools by %+v: err = %v, want forbidden", p, err)
		}
		if err := svc.DeletePool(e.ctx, p, "base"); !errors.Is(err, model.ErrForbidden) {
			t.Errorf("DeletePool by %+v: err = %v, want forbidden", p, err)
		}
	}
}

func TestPoolResizeAndRemove(t *testing.T) {
	e, w := newPoolEnv(t)
	e.setPool(3)
	if n := len(e.fill(w)); n != 3 {
		t.Fatalf("%d members, want 3", n)
	}
	e.setPool(1)
	e.reconcile()
	live, leaving := e.members()
	if len(live) != 1 || len(leaving) != 2 {
		t.Fatalf("after resize to 1: %d live, %d leaving, want 1 and 2", len(live), len(leaving))
	}
	e.fill(w)
	if p := e.poolStatus(); p.Ready != 1 {
		t.Fatalf("pool status = %+v, want 1 ready", p)
	}
	if err := e.service().DeletePool(e.ctx, operator, "base"); err != nil {
		t.Fatalf("delete pool: %v", err)
	}
	if err := e.service().DeletePool(e.ctx, operator, "base"); !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("delete pool again: err = %v, want not found", err)
	}
	e.fill(w)
	if live, _ := e.members(); len(live) != 0 {
		t.Fatalf("after removing the pool, %d live members", len(live))
	}
}

func TestPoolReplacesFailedMember(t *testing.T) {
	e, w := newPoolEnv(t)
	e.setPool(1)
	members := e.fill(w)
	w.sync(-1, 0, workerapi.Observed{SandboxID: members[0].ID, State: model.StateFailed, Reason: "boom"})
	e.reconcile()
	live, leaving := e.members()
	if len(live) != 1 || live[0].ID == members[0].ID || len(leaving) != 1 || leaving[0].ID != members[0].ID {
		t.Fatalf("after a member failed: live %v, leaving %v", live, leaving)
	}
}

func TestCreateOtherRuntime(t *testing.T) {
	e, w := newPoolEnv(t)
	svc := e.service()
	e.setPool(1)
	e.fill(w)
	_, _, err := svc.CreateSandbox(e.ctx, testPrincipal, service.CreateParams{Runtime: "qemu"}, "")
	if !errors.Is(err, model.ErrUnprocessable) || !strings.Contains(err.Error(), "workers offer gvisor") {
		t.Fatalf("create with runtime qemu and no qemu worker: err = %v", err)
	}
	if err := e.st.UpsertWorker(e.ctx, model.Worker{ID: "w-vm", Runtimes: model.NamedRuntimes("qemu"), Templates: []string{baseDigest},
		CapacityMiB: 4096, CapacityVCPUs: 4, LastHeartbeat: e.clock.Now(), CreatedAt: e.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	sb, op, err := svc.CreateSandbox(e.ctx, testPrincipal, service.CreateParams{Runtime: "qemu"}, "")
	if err != nil || sb.Runtime != "qemu" || sb.State != model.StatePending || op.State != model.OpPending {
		t.Fatalf("create with runtime qemu = %+v %+v %v, want a pending qemu sandbox (not a claim)", sb, op, err)
	}
	e.reconcile()
	e.wantSandbox(sb.ID, model.StateStarting, "w-vm", "")
	if live, _ := e.members(); len(live) != 1 {
		t.Fatalf("%d members, want 1 (untouched)", len(live))
	}
}
