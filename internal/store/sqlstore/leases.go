package sqlstore

import (
	"context"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
)

// AcquireLease takes or renews lease name for holder until now+ttl: it
// succeeds when the lease is free, expired or already holder's. The answer
// is the lease as stored afterwards (its holder may be another).
func (c *conn) AcquireLease(ctx context.Context, name, holder string, now time.Time, ttl time.Duration) (store.Lease, error) {
	_, err := c.exec(ctx, `INSERT INTO leases (name, holder, epoch, expires_at) VALUES (?, ?, 1, ?)
		ON CONFLICT (name) DO UPDATE SET
			epoch = CASE WHEN leases.holder = excluded.holder THEN leases.epoch ELSE leases.epoch + 1 END,
			holder = excluded.holder, expires_at = excluded.expires_at
		WHERE leases.holder = excluded.holder OR leases.expires_at < ?`,
		name, holder, c.d.Time(now.Add(ttl)), c.d.Time(now))
	if err != nil {
		return store.Lease{}, c.classify("acquire lease "+name, err)
	}
	var l store.Lease
	err = c.readRow(ctx, `SELECT name, holder, epoch, expires_at FROM leases WHERE name = ?`, name).
		Scan(&l.Name, &l.Holder, &l.Epoch, timeCol{&l.ExpiresAt})
	return l, c.classify("read lease "+name, err)
}

// ReleaseLease gives lease name up if holder holds it (it expires now).
func (c *conn) ReleaseLease(ctx context.Context, name, holder string, now time.Time) error {
	_, err := c.exec(ctx, `UPDATE leases SET expires_at = ? WHERE name = ? AND holder = ?`, c.d.Time(now), name, holder)
	return c.classify("release lease "+name, err)
}

// HoldLease is the fence of a lease holder's writes: a write of the lease
// row that changes nothing, so that it both checks the holder, epoch and
// expiry and, in a transaction, holds the row's lock until the end.
func (c *conn) HoldLease(ctx context.Context, name, holder string, epoch int64, now time.Time) error {
	res, err := c.exec(ctx, `UPDATE leases SET holder = holder WHERE name = ? AND holder = ? AND epoch = ? AND expires_at > ?`,
		name, holder, epoch, c.d.Time(now))
	if err != nil {
		return c.classify("hold lease "+name, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return c.classify("hold lease "+name, err)
	} else if n == 0 {
		return model.Errorf(model.ErrConflict, "lease %s is no longer held by %s at epoch %d", name, holder, epoch)
	}
	return nil
}
