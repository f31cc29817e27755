// Package storetest is the conformance suite every store.Store backend
// passes. A backend's test calls Run with a function that opens a fresh,
// empty store for one subtest (and closes it at t.Cleanup):
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store { ... })
//	}
package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
)

// Opened is how a backend's test takes a store it opened: it fails t on
// err and closes s when t ends.
func Opened[S interface{ Close() error }](t testing.TB, s S, err error) S {
	t.Helper()
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	return s
}

// RunBackend runs every suite on one backend, as subtests of t: Run's
// conformance cases, then Clock (RunClock) and Notify (RunNotify, two
// stores on one database). database returns the address of a new, empty
// database for t; open opens a store on one (now: its clock, nil for
// time.Now) and closes it when t ends.
func RunBackend(t *testing.T, database func(t testing.TB) string, open func(t *testing.T, db string, now func() time.Time) store.Store) {
	Run(t, func(t *testing.T) store.Store { return open(t, database(t), nil) })
	t.Run("Clock", func(t *testing.T) {
		RunClock(t, func(t *testing.T, now func() time.Time) store.Store { return open(t, database(t), now) })
	})
	t.Run("Notify", func(t *testing.T) {
		RunNotify(t, func(t *testing.T) (store.Store, store.Store) {
			db := database(t)
			return open(t, db, nil), open(t, db, nil)
		})
	})
}

// Run runs the whole suite; each subtest gets its own store from open.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"Orgs", testOrgs},
		{"OrgQuotas", testOrgQuotas},
		{"APIKeys", testAPIKeys},
		{"WorkerCredentials", testWorkerCredentials},
		{"Templates", testTemplates},
		{"SandboxRoundTrip", testSandboxRoundTrip},
		{"ListSandboxesFilters", testListFilters},
		{"ListSandboxesPagination", testPagination},
		{"UpdateSandboxCAS", testUpdateCAS},
		{"UpdateSandboxConcurrent", testUpdateConcurrent},
		{"TouchSandbox", testTouch},
		{"IdempotentCreate", testIdempotent},
		{"IdempotentCreateConcurrent", testIdempotentConcurrent},
		{"Operations", testOperations},
		{"UpdateSandboxAndOperation", testUpdateBoth},
		{"Workers", testWorkers},
		{"Leases", testLeases},
		{"Events", testEvents},
		{"EventsConcurrent", testEventsConcurrent},
		{"Settings", testSettings},
		{"OrgSettings", testOrgSettings},
		{"SandboxLifecycleFields", testSandboxLifecycleFields},
		{"SandboxSnapshotFields", testSandboxSnapshotFields},
		{"UpdateSandboxCreateOperation", testUpdateSandboxCreateOperation},
		{"UpdateSandboxCreateOperationConcurrent", testUpdateSandboxCreateOperationConcurrent},
		{"Pools", testPools},
		{"Network", testNetwork},
		{"Secrets", testSecrets},
		{"ClaimSandbox", testClaimSandbox},
		{"ClaimSandboxConcurrent", testClaimSandboxConcurrent},
		{"InTx", testInTx},
		{"BuildFiles", testBuildFiles},
		{"Builds", testBuilds},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, open(t))
		})
	}
}

// base has nanoseconds on purpose: stores keep at least microseconds.
var base = time.Date(2026, 3, 4, 5, 6, 7, 123456789, time.UTC)

func at(d time.Duration) time.Time { return base.Add(d) }

// us normalizes a time the way every store must round-trip it.
func us(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

func sameTime(t *testing.T, what string, got, want time.Time) {
	t.Helper()
	if !us(got).Equal(us(want)) {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

func wantErr(t *testing.T, what string, err, kind error) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("%s: err = %v, want %v", what, err, kind)
	}
}

func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func mkOrg(t *testing.T, s store.Store, id string) model.Org {
	t.Helper()
	o := model.Org{ID: id, Name: "org " + id, CreatedAt: at(0)}
	must(t, "create org "+id, s.CreateOrg(context.Background(), o))
	return o
}

func newSandbox(org, id string, created time.Time) model.Sandbox {
	return model.Sandbox{
		ID: id, OrgID: org, Template: "base", TemplateDigest: "sha256:aaa", Runtime: "gvisor",
		State: model.StatePending, DesiredState: model.StateRunning,
		Resources:  model.Resources{VCPUs: 1, MemoryMiB: 512},
		Generation: 1, CreatedAt: created, UpdatedAt: created, LastActivityAt: created,
	}
}

func newOp(sb model.Sandbox, id string) model.Operation {
	return model.Operation{
		ID: id, OrgID: sb.OrgID, SandboxID: sb.ID, Kind: model.OpCreate, State: model.OpPending,
		Target: model.StateRunning, CreatedAt: sb.CreatedAt, UpdatedAt: sb.CreatedAt,
		Deadline: sb.CreatedAt.Add(model.DefaultOperationDeadline),
	}
}

func mkSandbox(t *testing.T, s store.Store, sb model.Sandbox) model.Sandbox {
	t.Helper()
	got, _, existed, err := s.CreateSandbox(context.Background(), sb, newOp(sb, "op-"+sb.ID), "")
	must(t, "create sandbox "+sb.ID, err)
	if existed {
		t.Fatalf("create sandbox %s: existed = true without a key", sb.ID)
	}
	return got
}

// normSB makes a sandbox comparable with reflect.DeepEqual.
func normSB(sb model.Sandbox) model.Sandbox {
	sb.CreatedAt, sb.UpdatedAt, sb.LastActivityAt = us(sb.CreatedAt), us(sb.UpdatedAt), us(sb.LastActivityAt)
	if sb.ExpiresAt != nil {
		e := us(*sb.ExpiresAt)
		sb.ExpiresAt = &e
	}
	return sb
}

func normOp(op model.Operation) model.Operation {
	op.CreatedAt, op.UpdatedAt, op.Deadline = us(op.CreatedAt), us(op.UpdatedAt), us(op.Deadline)
	return op
}

func sameSandbox(t *testing.T, what string, got, want model.Sandbox) {
	t.Helper()
	if g, w := normSB(got), normSB(want); !reflect.DeepEqual(g, w) {
		t.Errorf("%s:\n got  %+v\n want %+v", what, g, w)
	}
}

func ids(sbs []model.Sandbox) []string {
	out := make([]string, len(sbs))
	for i, sb := range sbs {
		out[i] = sb.ID
	}
	return out
}

func testOrgs(t *testing.T, s store.Store) {
	ctx := context.Background()
	a := model.Org{ID: "org-a", Name: "Alpha", CreatedAt: at(time.Second)}
	b := model.Org{ID: "org-b", Name: "Beta", CreatedAt: at(0)}
	must(t, "create a", s.CreateOrg(ctx, a))
	must(t, "create b", s.CreateOrg(ctx, b))
	wantErr(t, "create duplicate", s.CreateOrg(ctx, a), model.ErrConflict)

	got, err := s.GetOrg(ctx, "org-a")
	must(t, "get", err)
	if got.ID != a.ID || got.Name != a.Name {
		t.Errorf("get = %+v, want %+v", got, a)
	}
	sameTime(t, "created_at", got.CreatedAt, a.CreatedAt)
	_, err = s.GetOrg(ctx, "nope")
	wantErr(t, "get missing", err, model.ErrNotFound)

	list, err := s.ListOrgs(ctx)
	must(t, "list", err)
	if len(list) != 2 || list[0].ID != "org-b" || list[1].ID != "org-a" {
		t.Errorf("list = %+v, want org-b then org-a (oldest first)", list)
	}
}

// testOrgQuotas: an org's quotas round-trip through create, update, get
// and list; an org created without them has none (unlimited).
func testOrgQuotas(t *testing.T, s store.Store) {
	ctx := context.Background()
	q := model.Quotas{Sandboxes: 3, VCPUs: 4, MemoryMiB: 2048, DiskMiB: 8192, Checkpoints: 5, Transfers: 1}
	must(t, "create a", s.CreateOrg(ctx, model.Org{ID: "org-a", Name: "A", CreatedAt: at(0), Quotas: q}))
	mkOrg(t, s, "org-b")
	got, err := s.GetOrg(ctx, "org-a")
	must(t, "get a", err)
	if got.Quotas != q {
		t.Errorf("org-a quotas = %+v, want %+v", got.Quotas, q)
	}
	b, err := s.GetOrg(ctx, "org-b")
	must(t, "get b", err)
	if b.Quotas != (model.Quotas{}) {
		t.Errorf("org-b quotas = %+v, want none", b.Quotas)
	}
	b.Quotas = model.Quotas{Sandboxes: 1}
	must(t, "update b", s.UpdateOrg(ctx, b))
	list, err := s.ListOrgs(ctx)
	must(t, "list", err)
	for _, o := range list {
		if o.ID == "org-b" && o.Quotas != b.Quotas {
			t.Errorf("listed org-b quotas = %+v, want %+v", o.Quotas, b.Quotas)
		}
	}
}

func testAPIKeys(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkOrg(t, s, "org-a")
	k := model.APIKey{ID: "key-1", OrgID: "org-a", Name: "ci", Prefix: "al_ab", Hash: "abc123", Admin: true, CreatedAt: at(0)}
	must(t, "create", s.CreateAPIKey(ctx, k))
	got, err := s.GetAPIKeyByHash(ctx, "abc123")
	must(t, "get by hash", err)
	sameTime(t, "created_at", got.CreatedAt, k.CreatedAt)
	got.CreatedAt = k.CreatedAt
	if got != k {
		t.Errorf("get = %+v, want %+v", got, k)
	}
	_, err = s.GetAPIKeyByHash(ctx, "other")
	wantErr(t, "get missing", err, model.ErrNotFound)

	dupHash := k
	dupHash.ID = "key-2"
	wantErr(t, "duplicate hash", s.CreateAPIKey(ctx, dupHash), model.ErrConflict)
	wantErr(t, "duplicate id", s.CreateAPIKey(ctx, model.APIKey{ID: "key-1", OrgID: "org-a", Hash: "zzz", CreatedAt: at(0)}), model.ErrConflict)
	wantErr(t, "unknown org", s.CreateAPIKey(ctx, model.APIKey{ID: "key-3", OrgID: "ghost", Hash: "yyy", CreatedAt: at(0)}), model.ErrInvalid)

	plain := model.APIKey{ID: "key-4", OrgID: "org-a", Name: "user", Prefix: "al_cd", Hash: "def456", CreatedAt: at(time.Second)}
	must(t, "create non-admin", s.CreateAPIKey(ctx, plain))
	got, err = s.GetAPIKeyByHash(ctx, "def456")
	must(t, "get non-admin", err)
	if got.Admin || got.ID != "key-4" {
		t.Errorf("non-admin key = %+v", got)
	}

	// Expiry and revocation are stored and listed; revoking twice keeps the
	// first time; another org's key is not found.
	exp := at(time.Hour)
	expiring := model.APIKey{ID: "key-5", OrgID: "org-a", Name: "ttl", Prefix: "al_ef", Hash: "ghi789", CreatedAt: at(2 * time.Second), ExpiresAt: &exp}
	must(t, "create expiring", s.CreateAPIKey(ctx, expiring))
	got, err = s.GetAPIKeyByHash(ctx, "ghi789")
	must(t, "get expiring", err)
	if got.ExpiresAt == nil || got.RevokedAt != nil {
		t.Fatalf("expiring key = %+v, want expires_at and no revoked_at", got)
	}
	sameTime(t, "expires_at", *got.ExpiresAt, exp)
	mkOrg(t, s, "org-b")
	_, err = s.RevokeAPIKey(ctx, "org-b", "key-4", at(time.Minute))
	wantErr(t, "revoke another org's key", err, model.ErrNotFound)
	_, err = s.RevokeAPIKey(ctx, "org-a", "key-404", at(time.Minute))
	wantErr(t, "revoke missing key", err, model.ErrNotFound)
	rev, err := s.RevokeAPIKey(ctx, "org-a", "key-4", at(time.Minute))
	must(t, "revoke", err)
	if rev.ID != "key-4" || rev.RevokedAt == nil {
		t.Fatalf("revoked = %+v", rev)
	}
	sameTime(t, "revoked_at", *rev.RevokedAt, at(time.Minute))
	rev, err = s.RevokeAPIKey(ctx, "org-a", "key-4", at(2*time.Minute))
	must(t, "revoke again", err)
	sameTime(t, "revoked_at kept", *rev.RevokedAt, at(time.Minute))
	got, err = s.GetAPIKeyByHash(ctx, "def456")
	must(t, "get revoked", err)
	if got.RevokedAt == nil {
		t.Errorf("revoked key read back without revoked_at: %+v", got)
	}
	keys, err := s.ListAPIKeys(ctx, "org-a")
	must(t, "list", err)
	var ids []string
	for _, k := range keys {
		ids = append(ids, k.ID)
	}
	if strings.Join(ids, ",") != "key-1,key-4,key-5" {
		t.Errorf("list org-a = %v, want key-1,key-4,key-5 (oldest first)", ids)
	}
	if keys, err := s.ListAPIKeys(ctx, "org-b"); err != nil || keys == nil || len(keys) != 0 {
		t.Errorf("list org-b = %v, %v; want an empty list", keys, err)
	}
}

func testWorkerCredentials(t *testing.T, s store.Store) {
	ctx := context.Background()
	_, err := s.GetWorkerCredential(ctx, "w-1")
	wantErr(t, "get missing", err, model.ErrNotFound)
	c := store.WorkerCredential{WorkerID: "w-1", SecretHash: "h1", CreatedAt: at(0), UpdatedAt: at(0)}
	must(t, "put first", s.PutWorkerCredential(ctx, c, ""))
	wantErr(t, "put first again", s.PutWorkerCredential(ctx, store.WorkerCredential{WorkerID: "w-1", SecretHash: "h2", CreatedAt: at(1), UpdatedAt: at(1)}, ""), model.ErrConflict)
	wantErr(t, "replace with a wrong old hash", s.PutWorkerCredential(ctx, store.WorkerCredential{WorkerID: "w-1", SecretHash: "h2", UpdatedAt: at(1)}, "nope"), model.ErrConflict)
	got, err := s.GetWorkerCredential(ctx, "w-1")
	must(t, "get", err)
	if got.SecretHash != "h1" {
		t.Fatalf("hash = %q after refused writes, want h1", got.SecretHash)
	}
	sameTime(t, "created_at", got.CreatedAt, at(0))
	must(t, "replace", s.PutWorkerCredential(ctx, store.WorkerCredential{WorkerID: "w-1", SecretHash: "h2", UpdatedAt: at(time.Second)}, "h1"))
	got, err = s.GetWorkerCredential(ctx, "w-1")
	must(t, "get replaced", err)
	if got.SecretHash != "h2" {
		t.Fatalf("hash = %q, want h2", got.SecretHash)
	}
	sameTime(t, "created_at kept", got.CreatedAt, at(0))
	sameTime(t, "updated_at", got.UpdatedAt, at(time.Second))
	must(t, "delete", s.DeleteWorkerCredential(ctx, "w-1"))
	wantErr(t, "delete again", s.DeleteWorkerCredential(ctx, "w-1"), model.ErrNotFound)
	must(t, "put after delete", s.PutWorkerCredential(ctx, c, ""))
}

func testTemplates(t *testing.T, s store.Store) {
	ctx := context.Background()
	v1 := model.Template{Name: "base", Tag: "latest", Digest: "sha256:111", SizeBytes: 1 << 30, CreatedAt: at(0)}
	must(t, "put base:latest", s.PutTemplate(ctx, v1))
	must(t, "put base:v1", s.PutTemplate(ctx, model.Template{Name: "base", Tag: "v1", Digest: "sha256:111", SizeBytes: 1 << 30, CreatedAt: at(0)}))
	must(t, "put py:3", s.PutTemplate(ctx, model.Template{Name: "py", Tag: "3", Digest: "sha256:333", SizeBytes: 7, CreatedAt: at(time.Second)}))

	got, err := s.GetTemplate(ctx, "base", "latest")
	must(t, "get", err)
	sameTime(t, "created_at", got.CreatedAt, v1.CreatedAt)
	got.CreatedAt = v1.CreatedAt
	if got != v1 {
		t.Errorf("get = %+v, want %+v", got, v1)
	}
	_, err = s.GetTemplate(ctx, "base", "nope")
	wantErr(t, "get missing tag", err, model.ErrNotFound)

	byDigest, err := s.GetTemplateByDigest(ctx, "sha256:333")
	must(t, "get by digest", err)
	if byDigest.Name != "py" || byDigest.Tag != "3" {
		t.Errorf("by digest = %+v, want py:3", byDigest)
	}
	_, err = s.GetTemplateByDigest(ctx, "sha256:999")
	wantErr(t, "get missing digest", err, model.ErrNotFound)

	// Moving a tag: upsert replaces the digest.
	v2 := model.Template{Name: "base", Tag: "latest", Digest: "sha256:222", SizeBytes: 42, CreatedAt: at(2 * time.Second)}
	must(t, "move base:latest", s.PutTemplate(ctx, v2))
	got, err = s.GetTemplate(ctx, "base", "latest")
	must(t, "get moved", err)
	if got.Digest != "sha256:222" || got.SizeBytes != 42 {
		t.Errorf("moved = %+v, want digest sha256:222 size 42", got)
	}
	byDigest, err = s.GetTemplateByDigest(ctx, "sha256:111")
	must(t, "old digest still tagged v1", err)
	if byDigest.Name != "base" || byDigest.Tag != "v1" {
		t.Errorf("by old digest = %+v, want base:v1", byDigest)
	}

	list, err := s.ListTemplates(ctx)
	must(t, "list", err)
	var refs []string
	for _, tpl := range list {
		refs = append(refs, tpl.Name+":"+tpl.Tag+"@"+tpl.Digest)
	}
	want := []string{"base:latest@sha256:222", "base:v1@sha256:111", "py:3@sha256:333"}
	if !reflect.DeepEqual(refs, want) {
		t.Errorf("list = %v, want %v", refs, want)
	}

	// The config travels with the row.
	cfg := &model.TemplateConfig{Env: []string{"A=1"}, User: "app", WorkingDir: "/w", Cmd: []string{"sh"}}
	must(t, "put with config", s.PutTemplate(ctx, model.Template{Name: "app", Tag: "1", Digest: "sha256:444", SizeBytes: 9, CreatedAt: at(3 * time.Second), Config: cfg}))
	got, err = s.GetTemplate(ctx, "app", "1")
	must(t, "get with config", err)
	if got.Config == nil || !reflect.DeepEqual(*got.Config, *cfg) {
		t.Errorf("config = %+v, want %+v", got.Config, cfg)
	}
	if got, _ := s.GetTemplate(ctx, "py", "3"); got.Config != nil {
		t.Errorf("py:3 config = %+v, want none", got.Config)
	}

	// Deleting a digest removes every name pointing at it and records
	// the deletion; a later deletion moves the time; clearing forgets it.
	must(t, "delete sha256:111", s.DeleteTemplate(ctx, "sha256:111", at(4*time.Second)))
	_, err = s.GetTemplateByDigest(ctx, "sha256:111")
	wantErr(t, "deleted digest", err, model.ErrNotFound)
	if _, err := s.GetTemplate(ctx, "base", "v1"); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("base:v1 after delete: %v", err)
	}
	if _, err := s.GetTemplate(ctx, "base", "latest"); err != nil {
		t.Errorf("base:latest (another digest) after delete: %v", err)
	}
	must(t, "delete sha256:444", s.DeleteTemplate(ctx, "sha256:444", at(5*time.Second)))
	must(t, "delete sha256:444 again", s.DeleteTemplate(ctx, "sha256:444", at(6*time.Second)))
	dels, err := s.ListTemplateDeletions(ctx)
	must(t, "list deletions", err)
	if len(dels) != 2 {
		t.Errorf("deletions = %v, want sha256:111 and sha256:444", dels)
	}
	sameTime(t, "deleted_at", dels["sha256:111"], at(4*time.Second))
	sameTime(t, "deleted_at moved", dels["sha256:444"], at(6*time.Second))
	must(t, "clear", s.ClearTemplateDeletion(ctx, "sha256:111"))
	must(t, "clear absent", s.ClearTemplateDeletion(ctx, "sha256:999"))
	dels, err = s.ListTemplateDeletions(ctx)
	must(t, "list deletions after clear", err)
	if _, ok := dels["sha256:111"]; ok || len(dels) != 1 {
		t.Errorf("deletions after clear = %v, want only sha256:444", dels)
	}
}

func testSandboxRoundTrip(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkOrg(t, s, "org-a")
	exp := at(time.Hour)
	full := newSandbox("org-a", "sb-full", at(0))
	full.Env = map[string]string{"PATH": "/bin", "EMPTY": ""}
	full.Metadata = map[string]string{"owner": "alice", "a.b": `q"uote`}
	full.Resources = model.Resources{VCPUs: 2, MemoryMiB: 2048}
	full.TimeoutS = 300
	full.ExpiresAt = &exp
	full.Reason = "why not"
	full.WorkerID = "w-1"
	full.PublicTraffic = true
	full.OnExpiry = model.ExpirySuspend
	op := newOp(full, "op-full")

	gotSB, gotOp, existed, err := s.CreateSandbox(ctx, full, op, "")
	must(t, "create", err)
	if existed {
		t.Error("existed = true on first create")
	}
	sameSandbox(t, "create result", gotSB, full)
	if g, w := normOp(gotOp), normOp(op); !reflect.DeepEqual(g, w) {
		t.Errorf("create op = %+v, want %+v", g, w)
	}
	got, err := s.GetSandbox(ctx, "sb-full")
	must(t, "get", err)
	sameSandbox(t, "get", got, full)
	if got.CreatedAt.Location() != time.UTC {
		t.Errorf("created_at location = %v, want UTC", got.CreatedAt.Location())
	}
	got.PublicTraffic = false
	if upd, err := s.UpdateSandbox(ctx, got); err != nil || upd.PublicTraffic {
		t.Errorf("update public_traffic to false: %+v, %v", upd.PublicTraffic, err)
	}

	bare := mkSandbox(t, s, newSandbox("org-a", "sb-bare", at(time.Second)))
	if bare.Env != nil || bare.Metadata != nil || bare.ExpiresAt != nil || bare.OnExpiry != "" {
		t.Errorf("bare sandbox = %+v, want nil env, metadata and expiry, no expiry action", bare)
	}

	_, _, _, err = s.CreateSandbox(ctx, full, newOp(full, "op-other"), "")
	wantErr(t, "create duplicate id", err, model.ErrConflict)
	if _, err := s.GetOperation(ctx, "op-other"); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("operation of a failed create: err = %v, want not found (nothing written)", err)
	}
	_, _, _, err = s.CreateSandbox(ctx, newSandbox("ghost", "sb-ghost", at(0)), newOp(newSandbox("ghost", "sb-ghost", at(0)), "op-ghost"), "")
	wantErr(t, "create in unknown org", err, model.ErrInvalid)
	_, err = s.GetSandbox(ctx, "nope")
	wantErr(t, "get missing", err, model.ErrNotFound)
}

func testListFilters(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkOrg(t, s, "org-a")
	mkOrg(t, s, "org-b")
	type spec struct {
		id, org, worker string
		state           model.SandboxState
		meta            map[string]string
	}
	specs := []spec{
		{"a1", "org-a", "w1", model.StateRunning, map[string]string{"team": "x", "env": "prod"}},
		{"a2", "org-a", "w2", model.StateRunning, map[string]string{"team": "x", "env": "dev"}},
		{"a3", "org-a", "w1", model.StatePaused, map[string]string{"team": "y"}},
		{"a4", "org-a", "", model.StateDeleted, map[string]string{"team": "x", "env": "prod"}},
		{"a5", "org-a", "", model.StatePending, nil},
		{"b1", "org-b", "w1", model.StateRunning, map[string]string{"team": "x", "env": "prod", "k.e\"y": "v"}},
	}
	for i, sp := range specs {
		sb := newSandbox(sp.org, sp.id, at(time.Duration(i)*time.Second))
		sb.WorkerID, sb.State, sb.Metadata = sp.worker, sp.state, sp.meta
		mkSandbox(t, s, sb)
	}
	tests := []struct {
		name string
		f    store.SandboxFilter
		want []string
	}{
		{"all but deleted", store.SandboxFilter{}, []string{"a1", "a2", "a3", "a5", "b1"}},
		{"include deleted", store.SandboxFilter{IncludeDeleted: true}, []string{"a1", "a2", "a3", "a4", "a5", "b1"}},
		{"org", store.SandboxFilter{OrgID: "org-b"}, []string{"b1"}},
		{"unknown org", store.SandboxFilter{OrgID: "org-z"}, nil},
		{"worker", store.SandboxFilter{WorkerID: "w1"}, []string{"a1", "a3", "b1"}},
		{"org and worker", store.SandboxFilter{OrgID: "org-a", WorkerID: "w1"}, []string{"a1", "a3"}},
		{"states", store.SandboxFilter{States: []model.SandboxState{model.StatePaused, model.StatePending}}, []string{"a3", "a5"}},
		{"state deleted asked for", store.SandboxFilter{States: []model.SandboxState{model.StateDeleted}}, []string{"a4"}},
		{"one pair", store.SandboxFilter{Metadata: map[string]string{"team": "x"}}, []string{"a1", "a2", "b1"}},
		{"all pairs must match", store.SandboxFilter{Metadata: map[string]string{"team": "x", "env": "prod"}}, []string{"a1", "b1"}},
		{"pairs with deleted", store.SandboxFilter{Metadata: map[string]string{"team": "x", "env": "prod"}, IncludeDeleted: true}, []string{"a1", "a4", "b1"}},
		{"value mismatch", store.SandboxFilter{Metadata: map[string]string{"team": "z"}}, nil},
		{"odd key", store.SandboxFilter{Metadata: map[string]string{"k.e\"y": "v"}}, []string{"b1"}},
		{"everything", store.SandboxFilter{OrgID: "org-a", WorkerID: "w1", States: []model.SandboxState{model.StateRunning}, Metadata: map[string]string{"env": "prod"}}, []string{"a1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, next, err := s.ListSandboxes(ctx, tc.f)
			must(t, "list", err)
			if next != "" {
				t.Errorf("next = %q on a single page", next)
			}
			if g := ids(got); !reflect.DeepEqual(g, tc.want) && !(len(g) == 0 && len(tc.want) == 0) {
				t.Errorf("ids = %v, want %v", g, tc.want)
			}
		})
	}
}

func testPagination(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkOrg(t, s, "org-a")
	mkOrg(t, s, "org-b")
	// 23 sandboxes in org-a, several sharing a creation time (ties broken by
	// id), inserted out of order; a few in org-b that must not show up.
	var want []string
	for i := 22; i >= 0; i-- {
		id := fmt.Sprintf("sb-%02d", i)
		sb := newSandbox("org-a", id, at(time.Duration(i/3)*time.Second))
		mkSandbox(t, s, sb)
		want = append(want, id)
	}
	sort.Strings(want) // ids sort like (created_at, id) here
	for i := range 3 {
		mkSandbox(t, s, newSandbox("org-b", fmt.Sprintf("other-%d", i), at(time.Duration(i)*time.Second)))
	}
	for _, limit := range []int{1, 5, 7, 23, 100} {
		t.Run(fmt.Sprintf("limit %d", limit), func(t *testing.T) {
			var got []string
			cursor := ""
			for pages := 0; ; pages++ {
				if pages > 30 {
					t.Fatalf("more than 30 pages; cursor does not advance")
				}
				page, next, err := s.ListSandboxes(ctx, store.SandboxFilter{OrgID: "org-a", Limit: limit, Cursor: cursor})
				must(t, "list", err)
				if len(page) > limit {
					t.Fatalf("page of %d > limit %d", len(page), limit)
				}
				if next != "" && len(page) != limit {
					t.Fatalf("short page of %d with a next cursor", len(page))
				}
				got = append(got, ids(page)...)
				if next == "" {
					break
				}
				cursor = next
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("paged ids = %v, want %v", got, want)
			}
		})
	}
	t.Run("default limit 100", func(t *testing.T) {
		for i := range 100 {
			mkSandbox(t, s, newSandbox("org-b", fmt.Sprintf("many-%03d", i), at(time.Hour)))
		}
		page, next, err := s.ListSandboxes(ctx, store.SandboxFilter{OrgID: "org-b"})
		must(t, "list", err)
		if len(page) != 100 || next == "" {
			t.Fatalf("first page: %d rows, next %q; want 100 and a cursor", len(page), next)
		}
		page, next, err = s.ListSandboxes(ctx, store.SandboxFilter{OrgID: "org-b", Cursor: next})
		must(t, "list page 2", err)
		if len(page) != 3 || next != "" {
			t.Fatalf("second page: %d rows, next %q; want 3 and no cursor", len(page), next)
		}
	})
	_, _, err := s.ListSandboxes(ctx, store.SandboxFilter{Cursor: "not a cursor!"})
	wantErr(t, "bad cursor", err, model.ErrInvalid)
}

func testUpdateCAS(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkOrg(t, s, "org-a")
	sb := mkSandbox(t, s, newSandbox("org-a", "sb-1", at(0)))

	before := us(time.Now())
	next := sb
	next.State = model.StateStarting
	next.WorkerID = "w-1"
	next.Metadata = map[string]string{"k": "v"}
	exp := at(time.Hour)
	next.ExpiresAt = &exp
	got, err := s.UpdateSandbox(ctx, next)
	must(t, "update", err)
	if got.Generation != sb.Generation+1 {
		t.Errorf("generation = %d, want %d", got.Generation, sb.Generation+1)
	}
	if got.UpdatedAt.Before(before) {
		t.Errorf("updated_at = %v, want now (>= %v)", got.UpdatedAt, before)
	}
	want := next
	want.Generation, want.UpdatedAt = sb.Generation+1, got.UpdatedAt
	sameSandbox(t, "returned row", got, want)
	stored, err := s.GetSandbox(ctx, "sb-1")
	must(t, "get", err)
	sameSandbox(t, "stored row", stored, got)

	// A writer that read the old generation loses.
	stale := sb
	stale.State = model.StateFailed
	_, err = s.UpdateSandbox(ctx, stale)
	wantErr(t, "stale update", err, model.ErrConflict)
	stored, _ = s.GetSandbox(ctx, "sb-1")
	if stored.State != model.StateStarting {
		t.Errorf("state after lost update = %s, want starting", stored.State)
	}

	// Clearing fields works too.
	clear := stored
	clear.WorkerID, clear.Metadata, clear.ExpiresAt = "", nil, nil
	got, err = s.UpdateSandbox(ctx, clear)
	must(t, "clear", err)
	if got.WorkerID != "" || got.Metadata != nil || got.ExpiresAt != nil || got.Generation != stored.Generation+1 {
		t.Errorf("cleared = %+v", got)
	}

	missing := newSandbox("org-a", "nope", at(0))
	_, err = s.UpdateSandbox(ctx, missing)
	wantErr(t, "update missing", err, model.ErrNotFound)
}

func testUpdateConcurrent(t *testing.T, s store.Store) {
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
			w.Reason = fmt.Sprintf("writer %d", i)
			_, errs[i] = s.UpdateSandbox(ctx, w)
		}()
	}
	wg.Wait()
	wins, winner := 0, ""
	for i, err := range errs {
		switch {
		case err == nil:
			wins++
			winner = fmt.Sprintf("writer %d", i)
		case !errors.Is(err, model.ErrConflict):
			t.Errorf("writer %d: err = %v, want nil or conflict", i, err)
		}
	}
	if wins != 1 {
		t.Fatalf("%d writers won with the same generation, want exactly 1", wins)
	}
	got, err := s.GetSandbox(ctx, "sb-1")
	must(t, "get", err)
	if got.Generation != sb.Generation+1 || got.Reason != winner {
		t.Errorf("stored generation %d reason %q, want %d %q", got.Generation, got.Reason, sb.Generation+1, winner)
	}
}

func testTouch(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkOrg(t, s, "org-a")
	sb := mkSandbox(t, s, newSandbox("org-a", "sb-1", at(0)))
	must(t, "touch", s.TouchSandbox(ctx, "sb-1", at(time.Minute)))
	got, err := s.GetSandbox(ctx, "sb-1")
	must(t, "get", err)
	sameTime(t, "last_activity_at", got.LastActivityAt, at(time.Minute))
	if got.Generation != sb.Generation {
		t.Errorf("touch bumped generation to %d", got.Generation)
	}
	// Activity never moves backwards, neither by touch nor by a write from
	// a stale read.
	must(t, "touch earlier", s.TouchSandbox(ctx, "sb-1", at(time.Second)))
	got, _ = s.GetSandbox(ctx, "sb-1")
	sameTime(t, "after earlier touch", got.LastActivityAt, at(time.Minute))
	upd, err := s.UpdateSandbox(ctx, sb) // sb still has the old LastActivityAt
	must(t, "update after touch", err)
	sameTime(t, "after update", upd.LastActivityAt, at(time.Minute))

	wantErr(t, "touch missing", s.TouchSandbox(ctx, "nope", at(0)), model.ErrNotFound)
}

func testIdempotent(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkOrg(t, s, "org-a")
	mkOrg(t, s, "org-b")
	first := newSandbox("org-a", "sb-1", at(0))
	sb1, op1, existed, err := s.CreateSandbox(ctx, first, newOp(first, "op-1"), "key-1")
	must(t, "first", err)
	if existed || sb1.ID != "sb-1" || op1.ID != "op-1" {
		t.Fatalf("first = %s %s existed=%v", sb1.ID, op1.ID, existed)
	}
	second := newSandbox("org-a", "sb-2", at(time.Second))
	sb2, op2, existed, err := s.CreateSandbox(ctx, second, newOp(second, "op-2"), "key-1")
	must(t, "retry", err)
	if !existed || sb2.ID != "sb-1" || op2.ID != "op-1" {
		t.Fatalf("retry = %s %s existed=%v, want sb-1 op-1 existed", sb2.ID, op2.ID, existed)
	}
	sameSandbox(t, "retry sandbox", sb2, sb1)
	if _, err := s.GetSandbox(ctx, "sb-2"); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("retry wrote its sandbox: err = %v", err)
	}
	if _, err := s.GetOperation(ctx, "op-2"); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("retry wrote its operation: err = %v", err)
	}
	// The key still maps after the sandbox changed.
	upd, err := s.UpdateSandbox(ctx, sb1)
	must(t, "update", err)
	sb3, _, existed, err := s.CreateSandbox(ctx, second, newOp(second, "op-2"), "key-1")
	must(t, "retry after update", err)
	if !existed || sb3.Generation != upd.Generation {
		t.Errorf("retry after update = gen %d existed %v, want gen %d existed", sb3.Generation, existed, upd.Generation)
	}
	// Keys are per org.
	other := newSandbox("org-b", "sb-b", at(0))
	sbB, _, existed, err := s.CreateSandbox(ctx, other, newOp(other, "op-b"), "key-1")
	must(t, "other org", err)
	if existed || sbB.ID != "sb-b" {
		t.Errorf("same key in another org = %s existed=%v, want a new sandbox", sbB.ID, existed)
	}
	// Without a key every create is new.
	third := newSandbox("org-a", "sb-3", at(2*time.Second))
	_, _, existed, err = s.CreateSandbox(ctx, third, newOp(third, "op-3"), "")
	must(t, "no key", err)
	if existed {
		t.Error("existed = true without a key")
	}
	list, _, err := s.ListSandboxes(ctx, store.SandboxFilter{OrgID: "org-a"})
	must(t, "list", err)
	if g := ids(list); !reflect.DeepEqual(g, []string{"sb-1", "sb-3"}) {
		t.Errorf("org-a sandboxes = %v, want [sb-1 sb-3]", g)
	}
}

func testIdempotentConcurrent(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkOrg(t, s, "org-a")
	const n = 10
	type result struct {
		sb      model.Sandbox
		op      model.Operation
		existed bool
		err     error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb := newSandbox("org-a", fmt.Sprintf("sb-%d", i), at(time.Duration(i)*time.Second))
			<-start
			r := &results[i]
			r.sb, r.op, r.existed, r.err = s.CreateSandbox(ctx, sb, newOp(sb, fmt.Sprintf("op-%d", i)), "same-key")
		}()
	}
	close(start)
	wg.Wait()
	created := 0
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("create %d: %v", i, r.err)
		}
		if !r.existed {
			created++
		}
		if r.sb.ID != results[0].sb.ID || r.op.ID != results[0].op.ID {
			t.Errorf("create %d returned %s/%s, create 0 returned %s/%s", i, r.sb.ID, r.op.ID, results[0].sb.ID, results[0].op.ID)
		}
	}
	if created != 1 {
		t.Errorf("%d creates reported existed=false, want exactly 1", created)
	}
	list, _, err := s.ListSandboxes(ctx, store.SandboxFilter{OrgID: "org-a"})
	must(t, "list", err)
	if len(list) != 1 || list[0].ID != results[0].sb.ID {
		t.Errorf("sandboxes = %v, want only %s", ids(list), results[0].sb.ID)
	}
	ops, err := s.ListOperations(ctx, store.OperationFilter{})
	must(t, "list operations", err)
	if len(ops) != 1 || ops[0].ID != results[0].op.ID {
		t.Errorf("%d open operations, want only %s", len(ops), results[0].op.ID)
	}
}

func testOperations(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkOrg(t, s, "org-a")
	sb := mkSandbox(t, s, newSandbox("org-a", "sb-1", at(0))) // brings op-sb-1 (pending)
	other := mkSandbox(t, s, newSandbox("org-a", "sb-2", at(time.Second)))

	del := model.Operation{ID: "op-del", OrgID: "org-a", SandboxID: sb.ID, Kind: model.OpDelete,
		State: model.OpPending, Target: model.StateDeleted, CreatedAt: at(time.Minute), UpdatedAt: at(time.Minute),
		Deadline: at(time.Hour), TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	must(t, "create", s.CreateOperation(ctx, del))
	wantErr(t, "create duplicate", s.CreateOperation(ctx, del), model.ErrConflict)
	orphan := del
	orphan.ID, orphan.SandboxID = "op-orphan", "ghost"
	wantErr(t, "create for unknown sandbox", s.CreateOperation(ctx, orphan), model.ErrInvalid)

	got, err := s.GetOperation(ctx, "op-del")
	must(t, "get", err)
	if g, w := normOp(got), normOp(del); !reflect.DeepEqual(g, w) {
		t.Errorf("get = %+v, want %+v", g, w)
	}
	if got.TraceParent != del.TraceParent {
		t.Errorf("trace parent = %q, want %q", got.TraceParent, del.TraceParent)
	}
	_, err = s.GetOperation(ctx, "nope")
	wantErr(t, "get missing", err, model.ErrNotFound)

	before := us(time.Now())
	running := got
	running.State = model.OpRunning
	running.Reason = "on it"
	upd, err := s.UpdateOperation(ctx, running)
	must(t, "update to running", err)
	if upd.State != model.OpRunning || upd.Reason != "on it" || upd.UpdatedAt.Before(before) || upd.TraceParent != del.TraceParent {
		t.Errorf("updated = %+v", upd)
	}
	done := upd
	done.State = model.OpSucceeded
	_, err = s.UpdateOperation(ctx, done)
	must(t, "update to succeeded", err)
	again := done
	again.State = model.OpFailed
	_, err = s.UpdateOperation(ctx, again)
	wantErr(t, "update a done operation", err, model.ErrConflict)
	got, _ = s.GetOperation(ctx, "op-del")
	if got.State != model.OpSucceeded {
		t.Errorf("state after refused update = %s, want succeeded", got.State)
	}
	_, err = s.UpdateOperation(ctx, model.Operation{ID: "nope", State: model.OpFailed})
	wantErr(t, "update missing", err, model.ErrNotFound)

	opIDs := func(ops []model.Operation) []string {
		var out []string
		for _, op := range ops {
			out = append(out, op.ID)
		}
		return out
	}
	tests := []struct {
		name string
		f    store.OperationFilter
		want []string
	}{
		{"open (controllers)", store.OperationFilter{}, []string{"op-sb-1", "op-sb-2"}},
		{"open explicitly", store.OperationFilter{Open: true}, []string{"op-sb-1", "op-sb-2"}},
		{"one sandbox, all", store.OperationFilter{SandboxID: sb.ID}, []string{"op-sb-1", "op-del"}},
		{"one sandbox, open", store.OperationFilter{SandboxID: sb.ID, Open: true}, []string{"op-sb-1"}},
		{"other sandbox", store.OperationFilter{SandboxID: other.ID}, []string{"op-sb-2"}},
		{"unknown sandbox", store.OperationFilter{SandboxID: "ghost"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ops, err := s.ListOperations(ctx, tc.f)
			must(t, "list", err)
			if g := opIDs(ops); !reflect.DeepEqual(g, tc.want) {
				t.Errorf("ids = %v, want %v", g, tc.want)
			}
		})
	}
}

func testUpdateBoth(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkOrg(t, s, "org-a")
	sb := newSandbox("org-a", "sb-1", at(0))
	sb, op, _, err := s.CreateSandbox(ctx, sb, newOp(sb, "op-1"), "")
	must(t, "create", err)

	sb.State, op.State = model.StateRunning, model.OpSucceeded
	gotSB, gotOp, err := updateBoth(ctx, s, sb, op)
	must(t, "update both", err)
	if gotSB.State != model.StateRunning || gotSB.Generation != sb.Generation+1 || gotOp.State != model.OpSucceeded {
		t.Fatalf("update both = %+v %+v", gotSB, gotOp)
	}

	// The operation is done: nothing is written, the sandbox included.
	next := gotSB
	next.State = model.StateFailed
	failed := gotOp
	failed.State = model.OpFailed
	_, _, err = updateBoth(ctx, s, next, failed)
	wantErr(t, "operation already done", err, model.ErrConflict)
	stored, _ := s.GetSandbox(ctx, "sb-1")
	if stored.State != model.StateRunning || stored.Generation != gotSB.Generation {
		t.Errorf("sandbox written although the operation was refused: %+v", stored)
	}

	// A stale sandbox: the operation is not written either.
	del := model.Operation{ID: "op-2", OrgID: "org-a", SandboxID: "sb-1", Kind: model.OpDelete, State: model.OpPending,
		Target: model.StateDeleted, CreatedAt: at(time.Minute), UpdatedAt: at(time.Minute), Deadline: at(time.Hour)}
	must(t, "create op-2", s.CreateOperation(ctx, del))
	stale := sb // generation before the first update
	stale.State = model.StateDeleting
	running := del
	running.State = model.OpRunning
	_, _, err = updateBoth(ctx, s, stale, running)
	wantErr(t, "stale sandbox", err, model.ErrConflict)
	gotDel, _ := s.GetOperation(ctx, "op-2")
	if gotDel.State != model.OpPending {
		t.Errorf("operation written although the sandbox was refused: %s", gotDel.State)
	}

	_, _, err = updateBoth(ctx, s, newSandbox("org-a", "nope", at(0)), running)
	wantErr(t, "missing sandbox", err, model.ErrNotFound)
	_, _, err = updateBoth(ctx, s, stored, model.Operation{ID: "nope", State: model.OpRunning})
	wantErr(t, "missing operation", err, model.ErrNotFound)
	after, _ := s.GetSandbox(ctx, "sb-1")
	if after.Generation != stored.Generation {
		t.Errorf("sandbox written although the operation was missing")
	}
}

func testLeases(t *testing.T, s store.Store) {
	ctx := context.Background()
	ttl := 10 * time.Second
	want := func(what string, l store.Lease, err error, holder string, epoch int64, expires time.Time) {
		t.Helper()
		must(t, what, err)
		if l.Name != "controller" || l.Holder != holder || l.Epoch != epoch {
			t.Errorf("%s: lease %+v; want held by %s at epoch %d", what, l, holder, epoch)
		}
		sameTime(t, what+": expiry", l.ExpiresAt, expires)
	}
	l, err := s.AcquireLease(ctx, "controller", "a", at(0), ttl)
	want("first acquire", l, err, "a", 1, at(ttl))
	l, err = s.AcquireLease(ctx, "controller", "b", at(5*time.Second), ttl)
	want("another holder before expiry", l, err, "a", 1, at(ttl))
	l, err = s.AcquireLease(ctx, "controller", "a", at(8*time.Second), ttl)
	want("renew", l, err, "a", 1, at(18*time.Second))
	l, err = s.AcquireLease(ctx, "controller", "b", at(19*time.Second), ttl)
	want("take over after expiry", l, err, "b", 2, at(29*time.Second))
	must(t, "release by a non-holder", s.ReleaseLease(ctx, "controller", "a", at(20*time.Second)))
	l, err = s.AcquireLease(ctx, "controller", "a", at(21*time.Second), ttl)
	want("a non-holder's release changes nothing", l, err, "b", 2, at(29*time.Second))
	must(t, "release", s.ReleaseLease(ctx, "controller", "b", at(22*time.Second)))
	l, err = s.AcquireLease(ctx, "controller", "a", at(23*time.Second), ttl)
	want("acquire after release", l, err, "a", 3, at(33*time.Second))
	// Leases are independent by name.
	other, err := s.AcquireLease(ctx, "other", "b", at(23*time.Second), ttl)
	if err != nil || other.Holder != "b" || other.Epoch != 1 {
		t.Errorf("another lease: %+v %v", other, err)
	}

	// The fence: only the holder, at its epoch, before expiry.
	must(t, "hold at the current epoch", s.HoldLease(ctx, "controller", "a", 3, at(24*time.Second)))
	for _, c := range []struct {
		what   string
		holder string
		epoch  int64
		now    time.Time
	}{
		{"another holder", "b", 3, at(24 * time.Second)},
		{"an old epoch", "a", 1, at(24 * time.Second)},
		{"after expiry", "a", 3, at(34 * time.Second)},
	} {
		if err := s.HoldLease(ctx, "controller", c.holder, c.epoch, c.now); !errors.Is(err, model.ErrConflict) {
			t.Errorf("hold by %s: %v, want ErrConflict", c.what, err)
		}
	}
	// In a transaction: a fenced write commits only while the fence holds.
	err = s.InTx(ctx, func(tx store.Tx) error {
		if err := tx.HoldLease(ctx, "controller", "a", 2, at(24*time.Second)); err != nil {
			return err
		}
		_, err := tx.PutSettingIfAbsent(ctx, "fenced", "written")
		return err
	})
	if !errors.Is(err, model.ErrConflict) {
		t.Errorf("a write fenced by an old epoch: %v, want ErrConflict", err)
	}
	err = s.InTx(ctx, func(tx store.Tx) error {
		return tx.HoldLease(ctx, "controller", "a", 3, at(24*time.Second))
	})
	must(t, "a transaction fenced by the current epoch", err)
}

func testWorkers(t *testing.T, s store.Store) {
	ctx := context.Background()
	w := model.Worker{ID: "w-2", DataPlaneURL: "http://127.0.0.1:9001", InternalURL: "http://127.0.0.1:9002",
		Runtimes: model.NamedRuntimes("gvisor"), Templates: []string{"sha256:111"}, CapacityMiB: 8192, CapacityVCPUs: 4,
		LastHeartbeat: at(time.Second), CreatedAt: at(0)}
	must(t, "upsert", s.UpsertWorker(ctx, w))
	got, err := s.GetWorker(ctx, "w-2")
	must(t, "get", err)
	sameTime(t, "heartbeat", got.LastHeartbeat, w.LastHeartbeat)
	sameTime(t, "created_at", got.CreatedAt, w.CreatedAt)
	got.LastHeartbeat, got.CreatedAt = w.LastHeartbeat, w.CreatedAt
	if !reflect.DeepEqual(got, w) {
		t.Errorf("get = %+v, want %+v", got, w)
	}

	w2 := w
	w2.Templates = []string{"sha256:111", "sha256:222"}
	w2.Runtimes = nil
	w2.LastHeartbeat = at(time.Minute)
	w2.CreatedAt = at(time.Hour) // ignored: a worker keeps its first CreatedAt
	must(t, "upsert again", s.UpsertWorker(ctx, w2))
	got, err = s.GetWorker(ctx, "w-2")
	must(t, "get again", err)
	if !reflect.DeepEqual(got.Templates, w2.Templates) || got.Runtimes != nil {
		t.Errorf("after upsert: templates %v runtimes %v", got.Templates, got.Runtimes)
	}
	sameTime(t, "heartbeat after upsert", got.LastHeartbeat, at(time.Minute))
	sameTime(t, "created_at after upsert", got.CreatedAt, at(0))
	if got.FreeMiB != nil {
		t.Errorf("free memory never reported came back as %d", *got.FreeMiB)
	}
	if got.BlobStore != "" {
		t.Errorf("blob store never reported came back as %q", got.BlobStore)
	}
	w2.BlobStore = "s3://bucket/prefix?endpoint=http://10.0.0.1:8333&region=r"
	must(t, "upsert with a blob store", s.UpsertWorker(ctx, w2))
	if got, err = s.GetWorker(ctx, "w-2"); err != nil || got.BlobStore != w2.BlobStore {
		t.Errorf("blob store %q came back as %q (%v)", w2.BlobStore, got.BlobStore, err)
	}
	for _, n := range []int{0, 1536} {
		w3 := w2
		w3.FreeMiB = &n
		must(t, "upsert with free memory", s.UpsertWorker(ctx, w3))
		got, err = s.GetWorker(ctx, "w-2")
		must(t, "get with free memory", err)
		if got.FreeMiB == nil || *got.FreeMiB != n {
			t.Errorf("free memory %d came back as %v", n, got.FreeMiB)
		}
	}

	// The cordon is the operator's: set and cleared by SetWorkerCordoned,
	// kept across the worker's own upserts.
	must(t, "cordon", s.SetWorkerCordoned(ctx, "w-2", true))
	must(t, "upsert a cordoned worker", s.UpsertWorker(ctx, w2))
	if got, err = s.GetWorker(ctx, "w-2"); err != nil || !got.Cordoned {
		t.Errorf("after cordon and upsert: cordoned=%v %v; want true", got.Cordoned, err)
	}
	must(t, "uncordon", s.SetWorkerCordoned(ctx, "w-2", false))
	if got, err = s.GetWorker(ctx, "w-2"); err != nil || got.Cordoned {
		t.Errorf("after uncordon: cordoned=%v %v; want false", got.Cordoned, err)
	}
	if err := s.SetWorkerCordoned(ctx, "nope", true); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("cordon of an unknown worker: %v; want ErrNotFound", err)
	}
	// A drain cordons too; a cordon keeps it; an uncordon ends both.
	must(t, "drain", s.SetWorkerDraining(ctx, "w-2"))
	must(t, "upsert a draining worker", s.UpsertWorker(ctx, w2))
	must(t, "cordon a draining worker", s.SetWorkerCordoned(ctx, "w-2", true))
	if got, err = s.GetWorker(ctx, "w-2"); err != nil || !got.Cordoned || !got.Draining {
		t.Errorf("after drain: cordoned=%v draining=%v %v; want both", got.Cordoned, got.Draining, err)
	}
	must(t, "uncordon a draining worker", s.SetWorkerCordoned(ctx, "w-2", false))
	if got, err = s.GetWorker(ctx, "w-2"); err != nil || got.Cordoned || got.Draining {
		t.Errorf("after uncordon: cordoned=%v draining=%v %v; want neither", got.Cordoned, got.Draining, err)
	}
	if err := s.SetWorkerDraining(ctx, "nope"); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("drain of an unknown worker: %v; want ErrNotFound", err)
	}

	// Zero times round-trip as zero.
	must(t, "upsert w-1", s.UpsertWorker(ctx, model.Worker{ID: "w-1"}))
	list, err := s.ListWorkers(ctx)
	must(t, "list", err)
	if len(list) != 2 || list[0].ID != "w-1" || list[1].ID != "w-2" {
		t.Fatalf("list = %+v, want w-1, w-2", list)
	}
	if !list[0].LastHeartbeat.IsZero() || !list[0].CreatedAt.IsZero() {
		t.Errorf("zero times came back as %v and %v", list[0].LastHeartbeat, list[0].CreatedAt)
	}
	_, err = s.GetWorker(ctx, "nope")
	wantErr(t, "get missing", err, model.ErrNotFound)
}

func testEvents(t *testing.T, s store.Store) {
	ctx := context.Background()
	in := []model.Event{
		{OrgID: "org-a", SandboxID: "sb-1", OperationID: "op-1", Type: "sandbox.state", Data: json.RawMessage(`{"state":"pending"}`), Time: at(0)},
		{OrgID: "org-a", SandboxID: "sb-2", Type: "sandbox.state", Data: json.RawMessage(`{"state": "running", "n": [1, 2]}`), Time: at(time.Second)},
		{OrgID: "org-b", SandboxID: "sb-3", Type: "operation.state", Data: json.RawMessage(`{}`), Time: at(2 * time.Second)},
		{OrgID: "org-a", SandboxID: "sb-1", Type: "sandbox.state", Data: json.RawMessage(`{"state":"running"}`), Time: at(3 * time.Second)},
		{OrgID: "org-a", Type: "org.note"},
	}
	var stored []model.Event
	var last int64
	for i, ev := range in {
		got, err := s.AppendEvent(ctx, ev)
		must(t, fmt.Sprintf("append %d", i), err)
		if got.Seq <= last {
			t.Fatalf("append %d: seq %d not above %d", i, got.Seq, last)
		}
		if got.Time.IsZero() {
			t.Errorf("append %d: time left zero", i)
		}
		last = got.Seq
		stored = append(stored, got)
	}
	seqs := func(evs []model.Event) []int64 {
		var out []int64
		for _, ev := range evs {
			out = append(out, ev.Seq)
		}
		return out
	}
	pick := func(idx ...int) []int64 {
		var out []int64
		for _, i := range idx {
			out = append(out, stored[i].Seq)
		}
		return out
	}

	all, err := s.ListEvents(ctx, "", "", 0, 0)
	must(t, "list all", err)
	if !reflect.DeepEqual(seqs(all), pick(0, 1, 2, 3, 4)) {
		t.Fatalf("all = %v, want %v", seqs(all), pick(0, 1, 2, 3, 4))
	}
	for i, ev := range all {
		want := stored[i]
		if ev.OrgID != want.OrgID || ev.SandboxID != want.SandboxID || ev.OperationID != want.OperationID ||
			ev.Type != want.Type || string(ev.Data) != string(in[i].Data) {
			t.Errorf("event %d = %+v (data %s), want %+v (data %s)", i, ev, ev.Data, want, in[i].Data)
		}
		sameTime(t, fmt.Sprintf("event %d time", i), ev.Time, want.Time)
	}
	tests := []struct {
		name         string
		org, sandbox string
		after        int64
		limit        int
		want         []int64
	}{
		{"org", "org-a", "", 0, 0, pick(0, 1, 3, 4)},
		{"sandbox", "", "sb-1", 0, 0, pick(0, 3)},
		{"org and sandbox", "org-b", "sb-3", 0, 0, pick(2)},
		{"org and foreign sandbox", "org-a", "sb-3", 0, 0, nil},
		{"after", "", "", stored[1].Seq, 0, pick(2, 3, 4)},
		{"after, org", "org-a", "", stored[1].Seq, 0, pick(3, 4)},
		{"limit", "", "", 0, 2, pick(0, 1)},
		{"after and limit", "", "", stored[0].Seq, 2, pick(1, 2)},
		{"after the last", "", "", stored[4].Seq, 0, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.ListEvents(ctx, tc.org, tc.sandbox, tc.after, tc.limit)
			must(t, "list", err)
			if g := seqs(got); !reflect.DeepEqual(g, tc.want) {
				t.Errorf("seqs = %v, want %v", g, tc.want)
			}
		})
	}
}

func testEventsConcurrent(t *testing.T, s store.Store) {
	ctx := context.Background()
	const n = 40
	var wg sync.WaitGroup
	got := make([]int64, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ev, err := s.AppendEvent(ctx, model.Event{OrgID: "org-a", Type: "t", Data: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
			got[i], errs[i] = ev.Seq, err
		}()
	}
	wg.Wait()
	must(t, "append", errors.Join(errs...))
	seen := map[int64]bool{}
	for _, seq := range got {
		if seen[seq] {
			t.Fatalf("seq %d handed out twice", seq)
		}
		seen[seq] = true
	}
	all, err := s.ListEvents(ctx, "org-a", "", 0, 1000)
	must(t, "list", err)
	if len(all) != n {
		t.Fatalf("listed %d events, want %d", len(all), n)
	}
	for i := 1; i < len(all); i++ {
		if all[i].Seq <= all[i-1].Seq {
			t.Fatalf("events out of order at %d: %d after %d", i, all[i].Seq, all[i-1].Seq)
		}
	}
	// Paging by afterSeq visits every event once.
	var after int64
	count := 0
	for {
		page, err := s.ListEvents(ctx, "org-a", "", after, 7)
		must(t, "page", err)
		if len(page) == 0 {
			break
		}
		count += len(page)
		after = page[len(page)-1].Seq
	}
	if count != n {
		t.Errorf("paged through %d events, want %d", count, n)
	}
}

func testSettings(t *testing.T, s store.Store) {
	ctx := context.Background()
	wantErr(t, "swap unset", s.SwapSetting(ctx, "ring", "", "x"), model.ErrNotFound)
	if _, err := s.PutSettingIfAbsent(ctx, "ring", "r1"); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "swap from a stale value", s.SwapSetting(ctx, "ring", "r0", "r2"), model.ErrConflict)
	must(t, "swap", s.SwapSetting(ctx, "ring", "r1", "r2"))
	if v, err := s.PutSettingIfAbsent(ctx, "ring", "ignored"); err != nil || v != "r2" {
		t.Errorf("after swap: %q %v, want r2", v, err)
	}
	wantErr(t, "swap from the replaced value", s.SwapSetting(ctx, "ring", "r1", "r3"), model.ErrConflict)
	v, err := s.PutSettingIfAbsent(ctx, "signing-key", "first")
	must(t, "put", err)
	if v != "first" {
		t.Errorf("put = %q, want first", v)
	}
	v, err = s.PutSettingIfAbsent(ctx, "signing-key", "second")
	must(t, "put again", err)
	if v != "first" {
		t.Errorf("put again = %q, want the stored first", v)
	}
	const n = 10
	var wg sync.WaitGroup
	vals := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			vals[i], errs[i] = s.PutSettingIfAbsent(ctx, "race", fmt.Sprintf("v%d", i))
		}()
	}
	wg.Wait()
	must(t, "concurrent put", errors.Join(errs...))
	for i, v := range vals {
		if v != vals[0] {
			t.Errorf("put %d got %q, put 0 got %q: racing writers saw different values", i, v, vals[0])
		}
	}
}

// RunClock checks that a store opened with a clock (sqlstore.WithClock)
// dates what it stamps itself by that clock, not by time.Now: a
// sandbox's and an operation's UpdatedAt and an event without a Time.
func RunClock(t *testing.T, open func(t *testing.T, now func() time.Time) store.Store) {
	ctx := context.Background()
	now := at(42 * time.Hour) // far from time.Now
	s := open(t, func() time.Time { return now })
	mkOrg(t, s, "org-a")
	sb := mkSandbox(t, s, newSandbox("org-a", "sb-1", at(0)))
	sb.Reason = "moved"
	sb, err := s.UpdateSandbox(ctx, sb)
	must(t, "update sandbox", err)
	sameTime(t, "sandbox updated_at", sb.UpdatedAt, now)
	op, err := s.GetOperation(ctx, "op-sb-1")
	must(t, "get operation", err)
	op.State = model.OpRunning
	op, err = s.UpdateOperation(ctx, op)
	must(t, "update operation", err)
	sameTime(t, "operation updated_at", op.UpdatedAt, now)
	ev, err := s.AppendEvent(ctx, model.Event{OrgID: "org-a", Type: "org.note"})
	must(t, "append event", err)
	sameTime(t, "event time", ev.Time, now)
}
