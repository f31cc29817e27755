package daemon

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/store/sqlite"
)

// TestEnsureAdminKeySaysWhenItMints: `airlock up` used to mint a fresh admin
// key, silently, on every start where admin.key was missing or stale (and
// the old ones kept working). Now a start with a good admin.key mints
// nothing; a missing or revoked one mints a key and says why on stderr,
// naming the key, never printing its secret.
func TestEnsureAdminKeySaysWhenItMints(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	svc := service.New(service.Config{Store: st, Events: events.New(st)})
	path := filepath.Join(dir, "admin.key")
	start := func() string {
		t.Helper()
		var progress bytes.Buffer
		if err := ensureAdminKey(ctx, svc, dir, &progress); err != nil {
			t.Fatalf("ensureAdminKey: %v", err)
		}
		if k := readTrim(path); k == "" || strings.Contains(progress.String(), k) {
			t.Fatalf("admin.key %q, progress %q: want a key in the file and not in the output", k, progress.String())
		}
		return progress.String()
	}
	keys := func() int {
		t.Helper()
		ks, err := st.ListAPIKeys(ctx, service.DefaultOrgID)
		if err != nil {
			t.Fatal(err)
		}
		return len(ks)
	}
	if out := start(); !strings.Contains(out, "first admin key") {
		t.Errorf("first start said %q", out)
	}
	first := readTrim(path)
	if out := start(); out != "" || keys() != 1 || readTrim(path) != first {
		t.Errorf("second start with a good admin.key: said %q, %d keys; want silence and 1 key", out, keys())
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	out := start()
	if !strings.Contains(out, "minted a new admin key key-") || !strings.Contains(out, "was missing") || !strings.Contains(out, "Earlier admin keys still work") {
		t.Errorf("start without admin.key said %q", out)
	}
	if keys() != 2 {
		t.Errorf("%d admin keys after the re-mint, want 2", keys())
	}
	// Revoke the current one (as an operator would with key rm) with the
	// first key: the next start says the file's key is revoked.
	p, err := svc.Authenticate(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := svc.Authenticate(ctx, readTrim(path))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.RevokeKey(ctx, p, service.DefaultOrgID, cur.KeyID); err != nil {
		t.Fatal(err)
	}
	out = start()
	if !strings.Contains(out, "does not work") || !strings.Contains(out, cur.KeyID) || !strings.Contains(out, "revoked") {
		t.Errorf("start with a revoked admin.key said %q", out)
	}
}
