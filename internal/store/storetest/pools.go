package storetest

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
)

func testPools(t *testing.T, s store.Store) {
	ctx := context.Background()
	got, err := s.ListPools(ctx)
	must(t, "list pools (empty)", err)
	if len(got) != 0 {
		t.Fatalf("empty store lists %d pools", len(got))
	}
	a := model.Pool{Template: "base:latest", Digest: "sha256:aaa", Size: 4, Resources: model.Resources{VCPUs: 1, MemoryMiB: 512}, CreatedAt: at(0), UpdatedAt: at(0)}
	b := model.Pool{Template: "alpha:v1", Digest: "sha256:bbb", Size: 1, Resources: model.Resources{VCPUs: 2, MemoryMiB: 1024}, CreatedAt: at(1), UpdatedAt: at(1)}
	must(t, "put pool a", s.PutPool(ctx, a))
	must(t, "put pool b", s.PutPool(ctx, b))
	// Update a: size and template change, CreatedAt is kept.
	a2 := a
	a2.Size, a2.Template, a2.CreatedAt, a2.UpdatedAt = 2, "base:v2", at(5), at(5)
	must(t, "update pool a", s.PutPool(ctx, a2))
	got, err = s.ListPools(ctx)
	must(t, "list pools", err)
	if len(got) != 2 {
		t.Fatalf("list pools = %+v, want 2", got)
	}
	if got[0].Digest != b.Digest || got[0].Size != 1 || got[0].Resources != b.Resources {
		t.Errorf("pools[0] = %+v, want %+v (ordered by template)", got[0], b)
	}
	if got[1].Digest != a.Digest || got[1].Size != 2 || got[1].Template != "base:v2" || got[1].Resources != a.Resources {
		t.Errorf("pools[1] = %+v, want size 2 template base:v2", got[1])
	}
	sameTime(t, "pool created_at after update", got[1].CreatedAt, at(0))
	sameTime(t, "pool updated_at after update", got[1].UpdatedAt, at(5))
	must(t, "delete pool a", s.DeletePool(ctx, a.Digest))
	wantErr(t, "delete pool a again", s.DeletePool(ctx, a.Digest), model.ErrNotFound)
	got, err = s.ListPools(ctx)
	must(t, "list pools after delete", err)
	if len(got) != 1 || got[0].Digest != b.Digest {
		t.Errorf("after delete, pools = %+v, want only %s", got, b.Digest)
	}
}

// poolMember creates a running pool member of org-pool.
func poolMember(t *testing.T, s store.Store, id string) model.Sandbox {
	t.Helper()
	sb := newSandbox("org-pool", id, at(0))
	sb.Pool = "sha256:aaa"
	sb = mkSandbox(t, s, sb)
	sb.State, sb.WorkerID = model.StateRunning, "w1"
	sb, err := s.UpdateSandbox(context.Background(), sb)
	must(t, "run pool member", err)
	return sb
}

func claimOp(sb model.Sandbox, org, id string) model.Operation {
	op := newOp(sb, id)
	op.OrgID = org
	op.State = model.OpSucceeded
	return op
}

func testClaimSandbox(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkOrg(t, s, "org-pool")
	mkOrg(t, s, "org-a")
	mkOrg(t, s, "org-b")
	member := poolMember(t, s, "sb-m1")

	claim := member
	claim.OrgID, claim.Pool = "org-a", ""
	claim.Env = map[string]string{"K": "v"}
	claim.Metadata = map[string]string{"m": "1"}
	got, op, existed, err := s.ClaimSandbox(ctx, claim, claimOp(member, "org-a", "op-c1"), "key-1")
	must(t, "claim", err)
	if existed {
		t.Fatal("first claim: existed = true")
	}
	if got.OrgID != "org-a" || got.Pool != "" || got.Env["K"] != "v" || got.Metadata["m"] != "1" || got.Generation != member.Generation+1 || got.State != model.StateRunning {
		t.Errorf("claimed sandbox = %+v", got)
	}
	if op.ID != "op-c1" || op.OrgID != "org-a" || op.State != model.OpSucceeded {
		t.Errorf("claim operation = %+v", op)
	}
	stored, err := s.GetSandbox(ctx, member.ID)
	must(t, "get claimed", err)
	sameSandbox(t, "stored claimed sandbox", stored, got)
	page, _, err := s.ListSandboxes(ctx, store.SandboxFilter{OrgID: "org-pool"})
	must(t, "list org-pool", err)
	if len(page) != 0 {
		t.Errorf("org-pool still lists %v", ids(page))
	}

	// The same key by the same org returns the first claim, writing nothing.
	other := poolMember(t, s, "sb-m2")
	again := other
	again.OrgID, again.Pool = "org-a", ""
	got2, op2, existed, err := s.ClaimSandbox(ctx, again, claimOp(other, "org-a", "op-c2"), "key-1")
	must(t, "repeat claim", err)
	if !existed || got2.ID != member.ID || op2.ID != "op-c1" {
		t.Errorf("repeat claim = %s %s existed=%v, want %s op-c1 existed", got2.ID, op2.ID, existed, member.ID)
	}
	if cur, _ := s.GetSandbox(ctx, other.ID); cur.OrgID != "org-pool" || cur.Generation != other.Generation {
		t.Errorf("repeat claim wrote the second member: %+v", cur)
	}
	// The key is per org; a stale generation or a non-member is a conflict.
	stale := again
	stale.OrgID, stale.Generation = "org-b", other.Generation-1
	_, _, _, err = s.ClaimSandbox(ctx, stale, claimOp(other, "org-b", "op-c3"), "key-1")
	wantErr(t, "claim at a stale generation", err, model.ErrConflict)
	_, _, _, err = s.ClaimSandbox(ctx, got, claimOp(got, "org-b", "op-c4"), "")
	wantErr(t, "claim of a claimed sandbox", err, model.ErrConflict)
	if _, err := s.GetOperation(ctx, "op-c4"); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("failed claim left its operation: err = %v", err)
	}
	b := again
	b.OrgID = "org-b"
	got3, _, existed, err := s.ClaimSandbox(ctx, b, claimOp(other, "org-b", "op-c5"), "key-1")
	must(t, "claim by org-b with the same key", err)
	if existed || got3.OrgID != "org-b" {
		t.Errorf("org-b claim = %+v existed=%v", got3, existed)
	}
}

func testClaimSandboxConcurrent(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkOrg(t, s, "org-pool")
	mkOrg(t, s, "org-a")
	member := poolMember(t, s, "sb-m1")
	const n = 8
	var wg sync.WaitGroup
	wins := make(chan string, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := member
			c.OrgID, c.Pool = "org-a", ""
			id := "op-" + string(rune('a'+i))
			if _, _, _, err := s.ClaimSandbox(ctx, c, claimOp(member, "org-a", id), ""); err == nil {
				wins <- id
			} else if !errors.Is(err, model.ErrConflict) {
				t.Errorf("claim %s: %v", id, err)
			}
		}()
	}
	wg.Wait()
	close(wins)
	var won []string
	for id := range wins {
		won = append(won, id)
	}
	if len(won) != 1 {
		t.Fatalf("%d claims won (%v), want exactly 1", len(won), won)
	}
}
