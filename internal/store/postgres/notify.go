package postgres

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// channel is the NOTIFY channel of event appends.
const channel = "airlock_events"

// notifier announces a store's event appends with NOTIFY and hears the
// other stores' with LISTEN. The payload is the store's token, so that it
// can tell its own appends from others'.
type notifier struct {
	cfg   *pgx.ConnConfig
	token string
}

func newNotifier(cfg *pgx.ConnConfig) (*notifier, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("postgres: notifier token: %w", err)
	}
	return &notifier{cfg: cfg, token: hex.EncodeToString(b)}, nil
}

// Appended notifies inside the appending transaction: PostgreSQL delivers
// it when (and only if) the transaction commits.
func (n *notifier) Appended(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `SELECT pg_notify($1, $2)`, channel, n.token)
	return err
}

func (*notifier) Committed() {}

// retryListen is how long Listen waits before it connects again.
const retryListen = time.Second

// Listen holds a connection of its own with LISTEN until ctx ends,
// reconnecting after a failure; it wakes once each time it (re)starts
// listening, as a notification may have been missed meanwhile.
func (n *notifier) Listen(ctx context.Context, wake func()) {
	for ctx.Err() == nil {
		if err := n.listen(ctx, wake); err != nil && ctx.Err() == nil {
			slog.Default().Warn("postgres: listen for event appends; retrying", "err", err, "in", retryListen)
			select {
			case <-ctx.Done():
			case <-time.After(retryListen):
			}
		}
	}
}

func (n *notifier) listen(ctx context.Context, wake func()) error {
	conn, err := pgx.ConnectConfig(ctx, n.cfg.Copy())
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	wake()
	for {
		msg, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("wait for a notification: %w", err)
		}
		if msg.Payload != n.token {
			wake()
		}
	}
}
