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

func open(t *testing.T, url string) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(context.Background(), url)
	return storetest.Opened(t, s, err)
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		return open(t, pgtest.URL(t))
	})
}

func TestClock(t *testing.T) {
	storetest.RunClock(t, func(t *testing.T, now func() time.Time) store.Store {
		s, err := postgres.Open(context.Background(), pgtest.URL(t), sqlstore.WithClock(now))
		return storetest.Opened(t, s, err)
	})
}

func TestNotify(t *testing.T) {
	storetest.RunNotify(t, func(t *testing.T) (store.Store, store.Store) {
		url := pgtest.URL(t)
		return open(t, url), open(t, url)
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
