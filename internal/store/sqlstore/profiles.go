package sqlstore

import (
	"context"

	"github.com/airlock/airlock/internal/model"
)

// ---- network profiles

const profileCols = `name, description, policy, created_at, updated_at`

// PutNetworkProfile upserts a profile by name (CreatedAt is kept on update).
func (c *conn) PutNetworkProfile(ctx context.Context, p model.NetworkProfile) error {
	_, err := c.exec(ctx, `INSERT INTO network_profiles (`+profileCols+`) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (name) DO UPDATE SET description = excluded.description, policy = excluded.policy,
			updated_at = excluded.updated_at`,
		p.Name, p.Description, string(p.Policy), c.d.Time(p.CreatedAt), c.d.Time(p.UpdatedAt))
	return c.classify("put network profile "+p.Name, err)
}

func scanProfile(sc scanner) (model.NetworkProfile, error) {
	var p model.NetworkProfile
	var policy string
	err := sc.Scan(&p.Name, &p.Description, &policy, timeCol{&p.CreatedAt}, timeCol{&p.UpdatedAt})
	p.Policy = []byte(policy)
	return p, err
}

// GetNetworkProfile returns one profile; ErrNotFound if absent.
func (c *conn) GetNetworkProfile(ctx context.Context, name string) (model.NetworkProfile, error) {
	p, err := scanProfile(c.readRow(ctx, `SELECT `+profileCols+` FROM network_profiles WHERE name = ?`, name))
	return p, c.classify("get network profile "+name, err)
}

// ListNetworkProfiles returns every stored profile by name.
func (c *conn) ListNetworkProfiles(ctx context.Context) ([]model.NetworkProfile, error) {
	return collect(ctx, c, "list network profiles", scanProfile, `SELECT `+profileCols+` FROM network_profiles ORDER BY name`)
}

// DeleteNetworkProfile removes a profile; ErrNotFound if absent.
func (c *conn) DeleteNetworkProfile(ctx context.Context, name string) error {
	res, err := c.exec(ctx, `DELETE FROM network_profiles WHERE name = ?`, name)
	return c.affected("delete network profile "+name, res, err)
}
