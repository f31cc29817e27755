package sqlstore

import (
	"context"
	"time"

	"github.com/airlock/airlock/internal/model"
)

// ---- templates

const templateCols = `name, tag, digest, size_bytes, created_at, config`

// PutTemplate upserts name:tag → digest.
func (c *conn) PutTemplate(ctx context.Context, t model.Template) error {
	cfg := ""
	if t.Config != nil {
		var err error
		if cfg, err = toJSON(t.Config); err != nil {
			return c.errorf("put template %s:%s: %w", t.Name, t.Tag, err)
		}
	}
	_, err := c.exec(ctx, `INSERT INTO templates (`+templateCols+`)
		VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (name, tag) DO UPDATE SET
			digest = excluded.digest, size_bytes = excluded.size_bytes, created_at = excluded.created_at,
			config = excluded.config`,
		t.Name, t.Tag, t.Digest, t.SizeBytes, c.d.Time(t.CreatedAt), cfg)
	return c.classify("put template "+t.Name+":"+t.Tag, err)
}

func scanTemplate(sc scanner) (model.Template, error) {
	var t model.Template
	var cfg string
	if err := sc.Scan(&t.Name, &t.Tag, &t.Digest, &t.SizeBytes, timeCol{&t.CreatedAt}, &cfg); err != nil {
		return t, err
	}
	if cfg != "" {
		t.Config = new(model.TemplateConfig)
		if err := fromJSON(cfg, t.Config); err != nil {
			return t, err
		}
	}
	return t, nil
}

// GetTemplate looks a template up by name and tag.
func (c *conn) GetTemplate(ctx context.Context, name, tag string) (model.Template, error) {
	t, err := scanTemplate(c.readRow(ctx, `SELECT `+templateCols+` FROM templates WHERE name = ? AND tag = ?`, name, tag))
	return t, c.classify("get template "+name+":"+tag, err)
}

// GetTemplateByDigest returns the newest name:tag pointing at digest.
func (c *conn) GetTemplateByDigest(ctx context.Context, digest string) (model.Template, error) {
	t, err := scanTemplate(c.readRow(ctx, `SELECT `+templateCols+` FROM templates
		WHERE digest = ? ORDER BY created_at DESC, name, tag LIMIT 1`, digest))
	return t, c.classify("get template by digest "+digest, err)
}

// ListTemplates returns every template ordered by name, then tag.
func (c *conn) ListTemplates(ctx context.Context) ([]model.Template, error) {
	return collect(ctx, c, "list templates", scanTemplate, `SELECT `+templateCols+` FROM templates ORDER BY name, tag`)
}

// DeleteTemplate removes digest's names and records its deletion, in one
// transaction.
func (c *conn) DeleteTemplate(ctx context.Context, digest string, at time.Time) error {
	return c.inTx(ctx, "delete template "+digest, func(c *conn) error {
		if _, err := c.exec(ctx, `DELETE FROM templates WHERE digest = ?`, digest); err != nil {
			return c.classify("delete template "+digest, err)
		}
		_, err := c.exec(ctx, `INSERT INTO template_deletions (digest, deleted_at) VALUES (?, ?)
			ON CONFLICT (digest) DO UPDATE SET deleted_at = excluded.deleted_at`, digest, c.d.Time(at))
		return c.classify("record deletion of template "+digest, err)
	})
}

type templateDeletion struct {
	digest string
	at     time.Time
}

// ListTemplateDeletions returns every recorded deletion.
func (c *conn) ListTemplateDeletions(ctx context.Context) (map[string]time.Time, error) {
	ds, err := collect(ctx, c, "list template deletions", func(sc scanner) (templateDeletion, error) {
		var d templateDeletion
		err := sc.Scan(&d.digest, timeCol{&d.at})
		return d, err
	}, `SELECT digest, deleted_at FROM template_deletions`)
	if err != nil {
		return nil, err
	}
	out := make(map[string]time.Time, len(ds))
	for _, d := range ds {
		out[d.digest] = d.at
	}
	return out, nil
}

// ClearTemplateDeletion forgets digest's deletion.
func (c *conn) ClearTemplateDeletion(ctx context.Context, digest string) error {
	_, err := c.exec(ctx, `DELETE FROM template_deletions WHERE digest = ?`, digest)
	return c.classify("clear deletion of template "+digest, err)
}
