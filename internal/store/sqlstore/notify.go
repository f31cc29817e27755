package sqlstore

import (
	"context"
	"database/sql"
	"sync"
)

// Notifier carries event appends between the stores of one database (the
// backend's side of store.Notifier). Each Store has its own, so that it
// can tell its own appends from others'.
type Notifier interface {
	// Appended runs inside the transaction that appended events (for
	// PostgreSQL, a NOTIFY, which the database delivers at commit).
	Appended(ctx context.Context, tx *sql.Tx) error
	// Committed runs after that transaction committed.
	Committed()
	// Listen calls wake after other stores' appends, until ctx ends.
	Listen(ctx context.Context, wake func())
}

// Listen calls wake after another store on the same database appended
// events, until ctx ends (see store.Notifier); without a Notifier it
// returns at once.
func (s *Store) Listen(ctx context.Context, wake func()) {
	if s.n != nil {
		s.n.Listen(ctx, wake)
	}
}

// LocalNotifier returns a Notifier that reaches the stores of this process
// opened with the same key (SQLite: the database file), for databases
// that one process serves.
func LocalNotifier(key string) Notifier { return &localNotifier{key: key} }

type localNotifier struct{ key string }

// local is every key's listeners.
var local struct {
	mu        sync.Mutex
	listeners map[string]map[*localListener]struct{}
}

type localListener struct {
	owner *localNotifier
	wake  func()
}

func (*localNotifier) Appended(context.Context, *sql.Tx) error { return nil }

func (n *localNotifier) Committed() {
	local.mu.Lock()
	defer local.mu.Unlock()
	for l := range local.listeners[n.key] {
		if l.owner != n {
			l.wake()
		}
	}
}

func (n *localNotifier) Listen(ctx context.Context, wake func()) {
	l := &localListener{owner: n, wake: wake}
	local.mu.Lock()
	if local.listeners == nil {
		local.listeners = map[string]map[*localListener]struct{}{}
	}
	if local.listeners[n.key] == nil {
		local.listeners[n.key] = map[*localListener]struct{}{}
	}
	local.listeners[n.key][l] = struct{}{}
	local.mu.Unlock()
	<-ctx.Done()
	local.mu.Lock()
	delete(local.listeners[n.key], l)
	if len(local.listeners[n.key]) == 0 {
		delete(local.listeners, n.key)
	}
	local.mu.Unlock()
}
