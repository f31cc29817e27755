package sqlstore

import (
	"context"

	"github.com/airlock/airlock/internal/model"
)

// ---- templates

const templateCols = `name, tag, digest, size_bytes, created_at`

// PutTemplate upserts name:tag → digest.
func (c *conn) PutTemplate(ctx context.Context, t model.Template) error {
	_, err := c.exec(ctx, `INSERT INTO templates (`+templateCols+`)
		VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (name, tag) DO UPDATE SET
			digest = excluded.digest, size_bytes = excluded.size_bytes, created_at = excluded.created_at`,
		t.Name, t.Tag, t.Digest, t.SizeBytes, c.d.Time(t.CreatedAt))
	return c.classify("put template "+t.Name+":"+t.Tag, err)
}

func scanTemplate(sc scanner) (model.Template, error) {
	var t model.Template
	err := sc.Scan(&t.Name, &t.Tag, &t.Digest, &t.SizeBytes, timeCol{&t.CreatedAt})
	return t, err
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
