package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
)

// testNetwork: network profiles, an org's network settings and a
// sandbox's policy round-trip; a sandbox without one reads back nil.
func testNetwork(t *testing.T, s store.Store) {
	ctx := context.Background()
	policy := json.RawMessage(`{"version":1,"default":"deny","rules":[{"action":"allow","domains":["*.example.com"]}]}`)
	p := model.NetworkProfile{Name: "dev", Description: "dev boxes", Policy: policy, CreatedAt: at(0), UpdatedAt: at(0)}
	must(t, "put profile", s.PutNetworkProfile(ctx, p))
	p2 := p
	p2.Description, p2.CreatedAt, p2.UpdatedAt = "changed", at(3), at(3)
	must(t, "update profile", s.PutNetworkProfile(ctx, p2))
	got, err := s.GetNetworkProfile(ctx, "dev")
	must(t, "get profile", err)
	if got.Description != "changed" || !jsonEqual(got.Policy, policy) {
		t.Errorf("profile = %+v", got)
	}
	sameTime(t, "profile created_at after update", got.CreatedAt, at(0))
	sameTime(t, "profile updated_at after update", got.UpdatedAt, at(3))
	_, err = s.GetNetworkProfile(ctx, "nope")
	wantErr(t, "get missing profile", err, model.ErrNotFound)
	must(t, "put profile b", s.PutNetworkProfile(ctx, model.NetworkProfile{Name: "ci", Policy: policy, CreatedAt: at(1), UpdatedAt: at(1)}))
	list, err := s.ListNetworkProfiles(ctx)
	must(t, "list profiles", err)
	if len(list) != 2 || list[0].Name != "ci" || list[1].Name != "dev" {
		t.Errorf("profiles = %+v, want ci, dev", list)
	}
	must(t, "delete profile", s.DeleteNetworkProfile(ctx, "ci"))
	wantErr(t, "delete profile again", s.DeleteNetworkProfile(ctx, "ci"), model.ErrNotFound)

	on := model.OrgNetwork{Profiles: []string{"dev", "public"}, Default: "dev", InlinePolicies: true}
	must(t, "create org", s.CreateOrg(ctx, model.Org{ID: "org-net", Name: "N", CreatedAt: at(0), Network: on}))
	o, err := s.GetOrg(ctx, "org-net")
	must(t, "get org", err)
	if !reflect.DeepEqual(o.Network, on) {
		t.Errorf("org network = %+v, want %+v", o.Network, on)
	}
	o.Network = model.OrgNetwork{}
	must(t, "update org", s.UpdateOrg(ctx, o))
	if o, _ = s.GetOrg(ctx, "org-net"); !reflect.DeepEqual(o.Network, model.OrgNetwork{}) {
		t.Errorf("org network after clearing = %+v", o.Network)
	}

	sb := newSandbox("org-net", "sb-net", at(0))
	sb.Network = &model.SandboxNetwork{Profile: "dev", Policy: policy}
	created, _, _, err := s.CreateSandbox(ctx, sb, newOp(sb, "op-net"), "")
	must(t, "create sandbox", err)
	if created.Network == nil || created.Network.Profile != "dev" || !jsonEqual(created.Network.Policy, policy) {
		t.Fatalf("created network = %+v", created.Network)
	}
	created.Network = &model.SandboxNetwork{Policy: json.RawMessage(`{"version":1,"default":"allow"}`)}
	upd, err := s.UpdateSandbox(ctx, created)
	must(t, "update sandbox", err)
	if upd.Network == nil || upd.Network.Profile != "" || !jsonEqual(upd.Network.Policy, created.Network.Policy) {
		t.Errorf("updated network = %+v", upd.Network)
	}
	plain := newSandbox("org-net", "sb-plain", at(0))
	got2, _, _, err := s.CreateSandbox(ctx, plain, newOp(plain, "op-plain"), "")
	must(t, "create plain sandbox", err)
	if got2.Network != nil {
		t.Errorf("a sandbox without a policy reads back %+v", got2.Network)
	}
}

func jsonEqual(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	return reflect.DeepEqual(x, y)
}

// testSecrets: an org's secrets upsert, list without values, read back
// only for the names asked and only the org's own.
func testSecrets(t *testing.T, s store.Store) {
	ctx := context.Background()
	for _, id := range []string{"org-sec-a", "org-sec-b"} {
		must(t, "create org", s.CreateOrg(ctx, model.Org{ID: id, Name: id, CreatedAt: at(0)}))
	}
	must(t, "put", s.PutSecret(ctx, model.Secret{OrgID: "org-sec-a", Name: "openai", CreatedAt: at(0), UpdatedAt: at(0)}, "v1"))
	must(t, "update", s.PutSecret(ctx, model.Secret{OrgID: "org-sec-a", Name: "openai", CreatedAt: at(2), UpdatedAt: at(2)}, "v2"))
	must(t, "put b", s.PutSecret(ctx, model.Secret{OrgID: "org-sec-a", Name: "github", CreatedAt: at(1), UpdatedAt: at(1)}, "gh"))
	must(t, "put other org", s.PutSecret(ctx, model.Secret{OrgID: "org-sec-b", Name: "openai", CreatedAt: at(1), UpdatedAt: at(1)}, "theirs"))
	list, err := s.ListSecrets(ctx, "org-sec-a")
	must(t, "list", err)
	if len(list) != 2 || list[0].Name != "github" || list[1].Name != "openai" || list[1].OrgID != "org-sec-a" {
		t.Fatalf("secrets = %+v", list)
	}
	sameTime(t, "created_at kept", list[1].CreatedAt, at(0))
	sameTime(t, "updated_at", list[1].UpdatedAt, at(2))
	vals, err := s.SecretValues(ctx, "org-sec-a", []string{"openai", "missing"})
	must(t, "values", err)
	if !reflect.DeepEqual(vals, map[string]string{"openai": "v2"}) {
		t.Fatalf("values = %v", vals)
	}
	if vals, _ := s.SecretValues(ctx, "org-sec-a", nil); len(vals) != 0 {
		t.Fatalf("values of no names = %v", vals)
	}
	must(t, "delete", s.DeleteSecret(ctx, "org-sec-a", "openai"))
	wantErr(t, "delete again", s.DeleteSecret(ctx, "org-sec-a", "openai"), model.ErrNotFound)
	if vals, _ := s.SecretValues(ctx, "org-sec-b", []string{"openai"}); vals["openai"] != "theirs" {
		t.Fatalf("other org's secret = %v", vals)
	}
}
