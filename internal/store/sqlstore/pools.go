package sqlstore

import (
	"context"

	"github.com/airlock/airlock/internal/model"
)

// ---- warm pools

// PutPool upserts a pool by digest.
func (c *conn) PutPool(ctx context.Context, p model.Pool) error {
	res, err := toJSON(p.Resources)
	if err != nil {
		return c.errorf("put pool %s: %w", p.Digest, err)
	}
	_, err = c.exec(ctx, `INSERT INTO pools (digest, template, size, resources, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (digest) DO UPDATE SET template = excluded.template, size = excluded.size,
			resources = excluded.resources, updated_at = excluded.updated_at`,
		p.Digest, p.Template, p.Size, res, c.d.Time(p.CreatedAt), c.d.Time(p.UpdatedAt))
	return c.classify("put pool "+p.Digest, err)
}

func scanPool(sc scanner) (model.Pool, error) {
	var p model.Pool
	var res string
	if err := sc.Scan(&p.Digest, &p.Template, &p.Size, &res, timeCol{&p.CreatedAt}, timeCol{&p.UpdatedAt}); err != nil {
		return p, err
	}
	return p, fromJSON(res, &p.Resources)
}

// ListPools returns every pool, ordered by template.
func (c *conn) ListPools(ctx context.Context) ([]model.Pool, error) {
	return collect(ctx, c, "list pools", scanPool,
		`SELECT digest, template, size, resources, created_at, updated_at FROM pools ORDER BY template, digest`)
}

// DeletePool removes a pool's configuration.
func (c *conn) DeletePool(ctx context.Context, digest string) error {
	res, err := c.exec(ctx, `DELETE FROM pools WHERE digest = ?`, digest)
	return c.affected("delete pool "+digest, res, err)
}
