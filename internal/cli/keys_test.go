package cli

import (
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
)

// TestKeyListAndRemove: `key ls` shows an org's keys without secrets,
// `key rm` revokes one, and the revoked key is refused by name at once.
func TestKeyListAndRemove(t *testing.T) {
	e := newAPIEnv(t)
	org := decodeJSON[model.Org](t, e.mustRun("org", "create", "acme", "--json"))
	res := decodeJSON[apitypes.CreateKeyResponse](t, e.mustRun("key", "create", "--org", org.ID, "--name", "ci", "--expires", "720h", "--json"))
	if res.Key.ExpiresAt == nil {
		t.Fatalf("key create --expires: no expires_at in %+v", res.Key)
	}
	if code, _, errOut := e.runKey(res.Secret, "sandbox", "ls"); code != 0 {
		t.Fatalf("new key: exit %d %q", code, errOut)
	}
	table := e.mustRun("key", "ls", "--org", org.ID)
	if !strings.Contains(table, res.Key.ID) || !strings.Contains(table, "expires ") || strings.Contains(table, res.Secret) {
		t.Fatalf("key ls:\n%s", table)
	}
	out := e.mustRun("key", "rm", "--org", org.ID, res.Key.ID)
	if !strings.Contains(out, res.Key.ID+" revoked at ") {
		t.Fatalf("key rm printed %q", out)
	}
	code, _, errOut := e.runKey(res.Secret, "sandbox", "ls")
	if code != ExitError || !strings.Contains(errOut, res.Key.ID) || !strings.Contains(errOut, "revoked") {
		t.Errorf("revoked key: exit %d %q, want an error naming %s as revoked", code, errOut, res.Key.ID)
	}
	keys := decodeJSON[[]model.APIKey](t, e.mustRun("key", "ls", "--org", org.ID, "--json"))
	if len(keys) != 1 || keys[0].RevokedAt == nil {
		t.Errorf("key ls --json after rm: %+v", keys)
	}
	if code, _, errOut := e.run("key", "rm", "--org", org.ID); code == 0 || !strings.Contains(errOut, "key id") {
		t.Errorf("key rm without ids: exit %d %q", code, errOut)
	}
}
