package controller

import (
	"encoding/base64"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

// keysOf turns the keys a worker received into what it verifies with (as
// worker.setKeys does).
func keysOf(t *testing.T, sks []workerapi.SigningKey) token.Keys {
	t.Helper()
	var ks token.Keys
	for _, k := range sks {
		b, err := base64.StdEncoding.DecodeString(k.Key)
		if err != nil {
			t.Fatal(err)
		}
		ks = append(ks, token.Key{ID: k.ID, Key: b, NotAfter: k.NotAfter})
	}
	return ks
}

// TestSigningKeyRotationGrace: rotating the data-plane key (the master was
// created once and never changed) keeps live sessions working: after a
// rotation the worker's next Sync carries the new key and the previous one
// until the grace period ends, so a token signed before the rotation still
// verifies on the worker; after the grace period the worker no longer has
// the old key and that token is refused, while new tokens verify.
func TestSigningKeyRotationGrace(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	reg := w.register(baseTemplate)
	if len(reg.SigningKeys) != 1 {
		t.Fatalf("registration keys %+v, want the current one", reg.SigningKeys)
	}
	old, err := e.c.CurrentSigningKey(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	claims := token.Claims{SandboxID: "sb1", OrgID: testOrg, Scope: token.ScopeFiles, Worker: "w1", Expires: e.clock.Now().Add(3 * time.Hour).Unix()}
	before, err := token.Sign(old, claims)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := token.Verify(keysOf(t, reg.SigningKeys), before, e.clock.Now()); err != nil {
		t.Fatalf("token before rotation: %v", err)
	}

	kid, err := e.c.RotateSigningKey(e.ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := e.c.CurrentSigningKey(e.ctx)
	if err != nil || token.KeyID(cur) != kid || kid == token.KeyID(old) {
		t.Fatalf("after rotation the current key is %s (%v), want the new %s", token.KeyID(cur), err, kid)
	}
	after, err := token.Sign(cur, claims)
	if err != nil {
		t.Fatal(err)
	}
	// During the grace period: both verify with what the next Sync gives.
	keys := keysOf(t, w.sync(-1, 0).SigningKeys)
	if len(keys) != 2 {
		t.Fatalf("keys during the grace period: %d, want the current and the previous", len(keys))
	}
	for name, tok := range map[string]string{"old-key token": before, "new-key token": after} {
		if _, err := token.Verify(keys, tok, e.clock.Now()); err != nil {
			t.Errorf("%s during the grace period: %v", name, err)
		}
	}
	// After it: the previous key is gone from the worker's keys, and even a
	// worker that kept it stops accepting it at its NotAfter.
	e.clock.Advance(time.Hour)
	if _, err := token.Verify(keys, before, e.clock.Now()); err == nil {
		t.Error("old-key token verified past the previous key's NotAfter")
	}
	keys = keysOf(t, w.sync(-1, 0).SigningKeys)
	if len(keys) != 1 || keys[0].ID != kid {
		t.Fatalf("keys after the grace period: %+v, want only %s", keys, kid)
	}
	if _, err := token.Verify(keys, before, e.clock.Now()); err == nil {
		t.Error("old-key token verified after the grace period")
	}
	if _, err := token.Verify(keys, after, e.clock.Now()); err != nil {
		t.Errorf("new-key token after the grace period: %v", err)
	}
	// Envd access tokens (server-side only) keep the installation's first
	// key, which rotation does not touch.
	first, err := token.SigningKey(e.ctx, e.st)
	if err != nil || string(first) != string(old) {
		t.Errorf("the first key changed with the rotation")
	}
}
