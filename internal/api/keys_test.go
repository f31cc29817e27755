package api_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/api"
	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
)

// TestRevokedKeyRefusedOnEveryServer is the attack of defect 7: a leaked key
// kept working forever. Two servers (two services, two handlers) share one
// SQLite file; a key revoked through server A is refused by server B on its
// very next request, with a 401 that names the key.
func TestRevokedKeyRefusedOnEveryServer(t *testing.T) {
	e := newEnv(t)
	svcB := service.New(service.Config{Store: e.st, Events: events.New(e.st)})
	srvB := httptest.NewServer(api.New(svcB, api.Options{}))
	t.Cleanup(srvB.Close)

	acmeA, org := e.orgClient("acme", false)
	// The key works on both servers (server B has now seen it, so any cache
	// it kept would hold it as good).
	for name, c := range map[string]*client.Client{"A": acmeA, "B": client.New(srvB.URL, acmeA.APIKey)} {
		if _, err := c.ListSandboxes(e.ctx, client.SandboxFilter{}); err != nil {
			t.Fatalf("key on server %s before revocation: %v", name, err)
		}
	}
	keys, err := e.admin.ListKeys(e.ctx, org.ID)
	if err != nil || len(keys) != 1 {
		t.Fatalf("list keys of %s: %v %v", org.ID, keys, err)
	}
	victim := keys[0]
	if !strings.HasPrefix(acmeA.APIKey, victim.Prefix) || victim.RevokedAt != nil {
		t.Fatalf("listed key %+v does not match the secret's prefix or is revoked", victim)
	}
	rev, err := e.admin.RevokeKey(e.ctx, org.ID, victim.ID)
	if err != nil || rev.RevokedAt == nil {
		t.Fatalf("revoke: %+v %v", rev, err)
	}
	for name, url := range map[string]string{"A": e.srv.URL, "B": srvB.URL} {
		st, _, body := raw(t, "GET", url+"/v1/sandboxes", acmeA.APIKey, "")
		if st != http.StatusUnauthorized || !strings.Contains(body.Message, victim.ID) || !strings.Contains(body.Message, "revoked") {
			t.Errorf("revoked key on server %s: %d %q, want 401 naming %s as revoked", name, st, body.Message, victim.ID)
		}
	}
	// Still listed, with its revocation; revoking again is a no-op.
	keys, err = e.admin.ListKeys(e.ctx, org.ID)
	if err != nil || len(keys) != 1 || keys[0].RevokedAt == nil || !keys[0].RevokedAt.Equal(*rev.RevokedAt) {
		t.Fatalf("keys after revocation: %+v %v", keys, err)
	}
	if again, err := e.admin.RevokeKey(e.ctx, org.ID, victim.ID); err != nil || !again.RevokedAt.Equal(*rev.RevokedAt) {
		t.Fatalf("second revoke: %+v %v", again, err)
	}
}

// TestExpiredKeyRefused: a key created with expires_at works until then
// and is refused from then on, by name.
func TestExpiredKeyRefused(t *testing.T) {
	now := time.Now().UTC()
	clock := now
	e := newEnv(t, func(s *service.Config) { s.Now = func() time.Time { return clock } })
	org, err := e.admin.CreateOrg(e.ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	exp := now.Add(time.Hour)
	k, err := e.admin.CreateKey(e.ctx, org.ID, client.CreateKeyRequest{Name: "ttl", ExpiresAt: &exp})
	if err != nil || k.Key.ExpiresAt == nil || !k.Key.ExpiresAt.Equal(exp) {
		t.Fatalf("create expiring key: %+v %v", k, err)
	}
	c := e.client(k.Secret)
	if _, err := c.ListSandboxes(e.ctx, client.SandboxFilter{}); err != nil {
		t.Fatalf("key before expiry: %v", err)
	}
	clock = exp
	st, _, body := raw(t, "GET", e.srv.URL+"/v1/sandboxes", k.Secret, "")
	if st != http.StatusUnauthorized || !strings.Contains(body.Message, k.Key.ID) || !strings.Contains(body.Message, "expired") {
		t.Fatalf("expired key: %d %q, want 401 naming %s as expired", st, body.Message, k.Key.ID)
	}
	// Bad expiries are refused with what to fix.
	past := now.Add(-time.Minute)
	if _, err := e.admin.CreateKey(e.ctx, org.ID, client.CreateKeyRequest{ExpiresAt: &past}); !errors.Is(err, model.ErrUnprocessable) || !strings.Contains(err.Error(), "not in the future") {
		t.Errorf("expiry in the past: %v", err)
	}
	far := clock.Add(service.MaxKeyLifetime + time.Hour)
	if _, err := e.admin.CreateKey(e.ctx, org.ID, client.CreateKeyRequest{ExpiresAt: &far}); !errors.Is(err, model.ErrUnprocessable) {
		t.Errorf("expiry too far: %v", err)
	}
}

// TestKeyListAndRevokeAuthorization: only admins of the org (or operators)
// list and revoke its keys; the listing has no secrets; the operator's last
// admin key cannot revoke itself.
func TestKeyListAndRevokeAuthorization(t *testing.T) {
	e := newEnv(t)
	acme, org := e.orgClient("acme", true)
	plain, _ := e.orgClient("other", false)
	other, _ := e.orgClient("third", true)
	if _, err := acme.ListKeys(e.ctx, org.ID); err != nil {
		t.Fatalf("org admin listing own keys: %v", err)
	}
	if _, err := other.ListKeys(e.ctx, org.ID); !errors.Is(err, model.ErrForbidden) {
		t.Errorf("another org's admin listing: %v, want 403", err)
	}
	if _, err := plain.ListKeys(e.ctx, org.ID); !errors.Is(err, model.ErrForbidden) {
		t.Errorf("non-admin listing: %v, want 403", err)
	}
	keys, _ := acme.ListKeys(e.ctx, org.ID)
	if _, err := other.RevokeKey(e.ctx, org.ID, keys[0].ID); !errors.Is(err, model.ErrForbidden) {
		t.Errorf("another org's admin revoking: %v, want 403", err)
	}
	if _, err := e.admin.RevokeKey(e.ctx, org.ID, "key-nope"); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("revoking a missing key: %v, want 404", err)
	}
	st, _, _ := raw(t, "GET", e.srv.URL+"/v1/orgs/"+org.ID+"/keys", e.adminKey, "")
	if st != 200 {
		t.Fatalf("list status %d", st)
	}
	resp, err := http.NewRequest("GET", e.srv.URL+"/v1/orgs/"+org.ID+"/keys", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Header.Set("Authorization", "Bearer "+e.adminKey)
	r, err := http.DefaultClient.Do(resp)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if s := string(body); strings.Contains(s, acme.APIKey) || strings.Contains(s, `"hash"`) || strings.Contains(s, service.HashKey(acme.APIKey)) {
		t.Errorf("key listing shows a secret or hash: %s", s)
	}
	// The operator's only admin key refuses to revoke itself.
	ops, err := e.admin.ListKeys(e.ctx, service.DefaultOrgID)
	if err != nil || len(ops) != 1 {
		t.Fatalf("default org keys: %v %v", ops, err)
	}
	if _, err := e.admin.RevokeKey(e.ctx, service.DefaultOrgID, ops[0].ID); !errors.Is(err, model.ErrConflict) || !strings.Contains(err.Error(), "last usable admin key") {
		t.Errorf("operator revoking its last admin key: %v, want 409", err)
	}
	// An org admin may revoke its own key (it is then refused).
	if _, err := acme.RevokeKey(e.ctx, org.ID, keys[0].ID); err != nil {
		t.Fatalf("org admin revoking own key: %v", err)
	}
	if _, err := acme.ListKeys(e.ctx, org.ID); !errors.Is(err, model.ErrUnauthorized) {
		t.Errorf("revoked org admin key still works: %v", err)
	}
}
