package sqlite_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
	"github.com/airlock/airlock/internal/store/sqlite"
	"github.com/airlock/airlock/internal/store/sqlstore"
	"github.com/airlock/airlock/internal/store/storetest"
)

func open(t *testing.T, path string, opts ...sqlstore.Option) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(context.Background(), path, opts...)
	return storetest.Opened(t, s, err)
}

func tempFile(t testing.TB) string { return filepath.Join(t.TempDir(), "airlock.db") }

// TestConformance runs storetest's suites on SQLite files.
func TestConformance(t *testing.T) {
	storetest.RunBackend(t, tempFile, func(t *testing.T, path string, now func() time.Time) store.Store {
		return open(t, path, sqlstore.WithClock(now))
	})
}

// TestReopen checks that migrations run once and data survives a restart.
func TestReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "airlock.db")
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutSettingIfAbsent(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := open(t, path)
	if err := s2.Ping(ctx); err != nil {
		t.Fatalf("ping: %v", err)
	}
	v, err := s2.PutSettingIfAbsent(ctx, "k", "other")
	if err != nil || v != "v" {
		t.Fatalf("after reopen: %q, %v; want v", v, err)
	}
}

// TestTwoHandles opens the same file twice (two processes would) and writes
// through both at once: busy_timeout must absorb the contention.
func TestTwoHandles(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "airlock.db")
	a, b := open(t, path), open(t, path)
	errs := make(chan error, 2)
	for _, s := range []*sqlite.Store{a, b} {
		go func() {
			for range 50 {
				if _, err := s.PutSettingIfAbsent(ctx, "shared", "x"); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent writers on two handles: %v", err)
		}
	}
}

func TestOpenRejectsMemory(t *testing.T) {
	if _, err := sqlite.Open(context.Background(), ":memory:"); err == nil {
		t.Fatal("open :memory: succeeded; want an error (readers and writer would see different databases)")
	}
}

func TestFileMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "airlock.db")
	open(t, path)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("database mode = %v, want 0600 (it holds secrets)", fi.Mode().Perm())
	}
}

// TestUpgradeFrom0001 opens a database that only has the first migration and
// rows written then: migration 0002 adds the lifecycle columns with their
// defaults (idle auto-suspend off for old sandboxes, no org overrides), and
// 0010 turns the E2B autoPause metadata key into on_expiry suspend.
func TestUpgradeFrom0001(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "airlock.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	first, err := os.ReadFile("migrations/0001_init.sql")
	if err != nil {
		t.Fatal(err)
	}
	const now = "2026-01-02T03:04:05.000000000Z"
	for _, q := range []string{
		string(first),
		`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)`,
		`INSERT INTO schema_migrations VALUES (1, '` + now + `')`,
		`INSERT INTO orgs VALUES ('org-a', 'A', '` + now + `')`,
		`INSERT INTO sandboxes (id, org_id, template, template_digest, runtime, state, desired_state, generation,
			created_at, updated_at, last_activity_at) VALUES ('sb-1', 'org-a', 'base', 'sha256:x', 'gvisor',
			'running', 'running', 3, '` + now + `', '` + now + `', '` + now + `')`,
		`INSERT INTO sandboxes (id, org_id, template, template_digest, runtime, state, desired_state, generation,
			created_at, updated_at, last_activity_at, metadata) VALUES ('sb-e2b', 'org-a', 'base', 'sha256:x', 'gvisor',
			'running', 'running', 1, '` + now + `', '` + now + `', '` + now + `', '{"airlock.e2b.on_timeout":"pause"}')`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("set up 0001 database: %v", err)
		}
	}
	db.Close()

	s := open(t, path)
	sb, err := s.GetSandbox(ctx, "sb-1")
	if err != nil || sb.Generation != 3 || sb.IdleSuspendS != 0 || sb.NoAutoWake || sb.SnapshotID != "" || sb.Pool != "" || sb.OnExpiry != "" {
		t.Fatalf("old sandbox after upgrade: %+v %v", sb, err)
	}
	if e2b, err := s.GetSandbox(ctx, "sb-e2b"); err != nil || e2b.OnExpiry != model.ExpirySuspend {
		t.Fatalf("old autoPause sandbox after upgrade: on_expiry %q, %v; want %q", e2b.OnExpiry, err, model.ExpirySuspend)
	}
	org, err := s.GetOrg(ctx, "org-a")
	if err != nil || org.IdleSuspendS != nil || org.Features != nil {
		t.Fatalf("old org after upgrade: %+v %v", org, err)
	}
	sb.SnapshotID, sb.SnapshotBytes = "snap", 7
	if sb, err = s.UpdateSandbox(ctx, sb); err != nil || sb.SnapshotBytes != 7 {
		t.Fatalf("write new columns: %+v %v", sb, err)
	}
}
