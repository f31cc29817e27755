package sqlite_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock/airlock/internal/store"
	"github.com/airlock/airlock/internal/store/sqlite"
	"github.com/airlock/airlock/internal/store/storetest"
)

func open(t *testing.T, path string) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		return open(t, filepath.Join(t.TempDir(), "airlock.db"))
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
