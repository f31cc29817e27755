package sqlstore

import (
	"context"
	"strings"

	"github.com/airlock/airlock/internal/model"
)

// ---- secrets

// PutSecret upserts an org's secret (CreatedAt is kept on update).
func (c *conn) PutSecret(ctx context.Context, s model.Secret, value string) error {
	_, err := c.exec(ctx, `INSERT INTO secrets (org_id, name, value, created_at, updated_at) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (org_id, name) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at`,
		s.OrgID, s.Name, value, c.d.Time(s.CreatedAt), c.d.Time(s.UpdatedAt))
	return c.classify("put secret "+s.Name, err)
}

func scanSecret(sc scanner) (model.Secret, error) {
	var s model.Secret
	err := sc.Scan(&s.OrgID, &s.Name, timeCol{&s.CreatedAt}, timeCol{&s.UpdatedAt})
	return s, err
}

// ListSecrets returns an org's secrets by name, without their values.
func (c *conn) ListSecrets(ctx context.Context, orgID string) ([]model.Secret, error) {
	return collect(ctx, c, "list secrets", scanSecret,
		`SELECT org_id, name, created_at, updated_at FROM secrets WHERE org_id = ? ORDER BY name`, orgID)
}

// SecretValues returns the values of those of names the org has set.
func (c *conn) SecretValues(ctx context.Context, orgID string, names []string) (map[string]string, error) {
	out := map[string]string{}
	if len(names) == 0 {
		return out, nil
	}
	args := []any{orgID}
	for _, n := range names {
		args = append(args, n)
	}
	type kv struct{ k, v string }
	rows, err := collect(ctx, c, "secret values", func(sc scanner) (kv, error) {
		var r kv
		err := sc.Scan(&r.k, &r.v)
		return r, err
	}, `SELECT name, value FROM secrets WHERE org_id = ? AND name IN (?`+strings.Repeat(", ?", len(names)-1)+`)`, args...)
	if err != nil {
		return nil, err
	}
	for _, r := range rows {
		out[r.k] = r.v
	}
	return out, nil
}

// DeleteSecret removes an org's secret; ErrNotFound if absent.
func (c *conn) DeleteSecret(ctx context.Context, orgID, name string) error {
	res, err := c.exec(ctx, `DELETE FROM secrets WHERE org_id = ? AND name = ?`, orgID, name)
	return c.affected("delete secret "+name, res, err)
}
