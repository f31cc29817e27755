package postgres_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/store"
	"github.com/airlock/airlock/internal/store/pgtest"
	"github.com/airlock/airlock/internal/store/postgres"
	"github.com/airlock/airlock/internal/store/sqlstore"
	"github.com/airlock/airlock/internal/store/storetest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func open(t *testing.T, url string, opts ...sqlstore.Option) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(context.Background(), url, opts...)
	return storetest.Opened(t, s, err)
}

// TestConformance runs storetest's suites on PostgreSQL (pgtest).
func TestConformance(t *testing.T) {
	storetest.RunBackend(t, pgtest.URL, func(t *testing.T, url string, now func() time.Time) store.Store {
		return open(t, url, sqlstore.WithClock(now))
	})
}

// TestConcurrentOpen starts several stores on one empty database at once:
// the advisory lock must serialize the migrations.
func TestConcurrentOpen(t *testing.T) {
	ctx := context.Background()
	url := pgtest.URL(t)
	const n = 5
	var wg sync.WaitGroup
	errs := make([]error, n)
	stores := make([]*postgres.Store, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stores[i], errs[i] = postgres.Open(ctx, url)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("open %d: %v", i, err)
			continue
		}
		if err := stores[i].Ping(ctx); err != nil {
			t.Errorf("ping %d: %v", i, err)
		}
		stores[i].Close()
	}
}

// TestRebind: placeholders are numbered in order; a ? inside a quoted
// literal is left alone.
func TestRebind(t *testing.T) {
	for in, want := range map[string]string{
		"SELECT 1":                  "SELECT 1",
		"a = ? AND b IN (?, ?)":     "a = $1 AND b IN ($2, $3)",
		"m.type = 'te?t' AND x = ?": "m.type = 'te?t' AND x = $1",
		"x = '' AND y = ? OR z = ?": "x = '' AND y = $1 OR z = $2",
	} {
		if got := (postgres.Dialect{}).Rebind(in); got != want {
			t.Errorf("Rebind(%q) = %q, want %q", in, got, want)
		}
	}
}
