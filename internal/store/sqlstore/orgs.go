package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/airlock/airlock/internal/model"
)

// ---- orgs and keys

const orgCols = `id, name, created_at, features, idle_suspend_s, quotas, network`

func orgJSON(org model.Org) (features, quotas, network string, err error) {
	if features, err = toJSON(org.Features); err != nil {
		return
	}
	if quotas, err = toJSON(org.Quotas); err != nil {
		return
	}
	network, err = toJSON(org.Network)
	return
}

// CreateOrg inserts an org; ErrConflict if the id exists.
func (c *conn) CreateOrg(ctx context.Context, org model.Org) error {
	features, quotas, network, err := orgJSON(org)
	if err != nil {
		return c.errorf("create org %s: %w", org.ID, err)
	}
	_, err = c.exec(ctx, `INSERT INTO orgs (`+orgCols+`) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		org.ID, org.Name, c.d.Time(org.CreatedAt), features, org.IdleSuspendS, quotas, network)
	return c.classify("create org "+org.ID, err)
}

// UpdateOrg writes the org's name, features, idle setting, quotas and
// network settings; ErrNotFound if it does not exist.
func (c *conn) UpdateOrg(ctx context.Context, org model.Org) error {
	features, quotas, network, err := orgJSON(org)
	if err != nil {
		return c.errorf("update org %s: %w", org.ID, err)
	}
	res, err := c.exec(ctx, `UPDATE orgs SET name = ?, features = ?, idle_suspend_s = ?, quotas = ?, network = ? WHERE id = ?`,
		org.Name, features, org.IdleSuspendS, quotas, network, org.ID)
	return c.affected("update org "+org.ID, res, err)
}

func scanOrg(sc scanner) (model.Org, error) {
	var o model.Org
	var features, quotas, network string
	var idle sql.NullInt64
	if err := sc.Scan(&o.ID, &o.Name, timeCol{&o.CreatedAt}, &features, &idle, &quotas, &network); err != nil {
		return o, err
	}
	if idle.Valid {
		v := idle.Int64
		o.IdleSuspendS = &v
	}
	return o, errors.Join(fromJSON(features, &o.Features), fromJSON(quotas, &o.Quotas), fromJSON(network, &o.Network))
}

// GetOrg returns one org.
func (c *conn) GetOrg(ctx context.Context, id string) (model.Org, error) {
	o, err := scanOrg(c.readRow(ctx, `SELECT `+orgCols+` FROM orgs WHERE id = ?`, id))
	return o, c.classify("get org "+id, err)
}

// ListOrgs returns every org, oldest first.
func (c *conn) ListOrgs(ctx context.Context) ([]model.Org, error) {
	return collect(ctx, c, "list orgs", scanOrg, `SELECT `+orgCols+` FROM orgs ORDER BY created_at, id`)
}

const apiKeyCols = `id, org_id, name, prefix, hash, admin, created_at, expires_at, revoked_at`

// CreateAPIKey inserts a key; ErrConflict if the id or hash exists,
// ErrInvalid if the org does not.
func (c *conn) CreateAPIKey(ctx context.Context, k model.APIKey) error {
	_, err := c.exec(ctx, `INSERT INTO api_keys (`+apiKeyCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		k.ID, k.OrgID, k.Name, k.Prefix, k.Hash, k.Admin, c.d.Time(k.CreatedAt), c.timeOf(k.ExpiresAt), c.timeOf(k.RevokedAt))
	return c.classify("create api key "+k.ID, err)
}

func scanAPIKey(sc scanner) (model.APIKey, error) {
	var k model.APIKey
	err := sc.Scan(&k.ID, &k.OrgID, &k.Name, &k.Prefix, &k.Hash, &k.Admin, timeCol{&k.CreatedAt},
		nullTimeCol{&k.ExpiresAt}, nullTimeCol{&k.RevokedAt})
	return k, err
}

// GetAPIKeyByHash finds a key by the hex sha256 of its secret.
func (c *conn) GetAPIKeyByHash(ctx context.Context, hash string) (model.APIKey, error) {
	k, err := scanAPIKey(c.readRow(ctx, `SELECT `+apiKeyCols+` FROM api_keys WHERE hash = ?`, hash))
	return k, c.classify("get api key by hash", err)
}

// ListAPIKeys returns every key of orgID, oldest first.
func (c *conn) ListAPIKeys(ctx context.Context, orgID string) ([]model.APIKey, error) {
	out, err := collect(ctx, c, "list api keys", scanAPIKey,
		`SELECT `+apiKeyCols+` FROM api_keys WHERE org_id = ? ORDER BY created_at, id`, orgID)
	if out == nil && err == nil {
		out = []model.APIKey{}
	}
	return out, err
}

// RevokeAPIKey marks key id of orgID revoked at at (keeping an earlier
// revocation) and returns it.
func (c *conn) RevokeAPIKey(ctx context.Context, orgID, id string, at time.Time) (model.APIKey, error) {
	k, err := scanAPIKey(c.writeRow(ctx, `UPDATE api_keys SET revoked_at = coalesce(revoked_at, ?)
		WHERE org_id = ? AND id = ? RETURNING `+apiKeyCols, c.d.Time(at), orgID, id))
	return k, c.classify("revoke api key "+id, err)
}
