package sqlstore

import (
	"context"
	"errors"

	"github.com/airlock/airlock/internal/model"
)

// ---- settings

// PutSettingIfAbsent stores value only if key is unset and returns the value
// now stored.
func (c *conn) PutSettingIfAbsent(ctx context.Context, key, value string) (string, error) {
	var stored string
	err := c.inTx(ctx, "put setting "+key, func(c *conn) error {
		if _, err := c.exec(ctx, `INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING`, key, value); err != nil {
			return c.classify("put setting "+key, err)
		}
		return c.classify("put setting "+key, c.writeRow(ctx, `SELECT value FROM settings WHERE key = ?`, key).Scan(&stored))
	})
	return stored, err
}

// SwapSetting replaces key's value old with value.
func (c *conn) SwapSetting(ctx context.Context, key, old, value string) error {
	step := "swap setting " + key
	res, err := c.exec(ctx, `UPDATE settings SET value = ? WHERE key = ? AND value = ?`, value, key, old)
	if err := c.affected(step, res, err); !errors.Is(err, model.ErrNotFound) {
		return err
	}
	var stored string
	if err := c.writeRow(ctx, `SELECT value FROM settings WHERE key = ?`, key).Scan(&stored); err != nil {
		return c.classify(step, err)
	}
	return c.errorf("%s: the stored value changed: %w", step, model.ErrConflict)
}
