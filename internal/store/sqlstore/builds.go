package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
)

// ---- build files

// PutBuildFile stores a build file in chunks, in one transaction, unless
// the org has its key already.
func (c *conn) PutBuildFile(ctx context.Context, f store.BuildFile, r io.Reader) (bool, error) {
	created := false
	step := "put build file " + f.Key
	err := c.inTx(ctx, step, func(c *conn) error {
		created = false
		var n int
		if err := c.writeRow(ctx, `SELECT count(*) FROM build_files WHERE org_id = ? AND file_key = ?`, f.OrgID, f.Key).Scan(&n); err != nil {
			return c.classify(step, err)
		}
		if n > 0 {
			return nil
		}
		if _, err := c.exec(ctx, `INSERT INTO build_files (org_id, file_key, size_bytes, sha256, created_at) VALUES (?, ?, ?, ?, ?)`,
			f.OrgID, f.Key, f.Size, f.SHA256, c.d.Time(f.CreatedAt)); err != nil {
			return c.classify(step, err)
		}
		buf := make([]byte, store.BuildFileChunk)
		left := f.Size
		for i := 0; left > 0; i++ {
			b := buf[:min(left, int64(len(buf)))]
			if _, err := io.ReadFull(r, b); err != nil {
				return c.errorf("%s: read chunk %d: %w", step, i, err)
			}
			if _, err := c.exec(ctx, `INSERT INTO build_file_chunks (org_id, file_key, n, data) VALUES (?, ?, ?, ?)`,
				f.OrgID, f.Key, i, b); err != nil {
				return c.classify(fmt.Sprintf("%s: chunk %d", step, i), err)
			}
			left -= int64(len(b))
		}
		created = true
		return nil
	})
	return created, err
}

// GetBuildFile returns a build file's size, hash and time.
func (c *conn) GetBuildFile(ctx context.Context, orgID, key string) (store.BuildFile, error) {
	f := store.BuildFile{OrgID: orgID, Key: key}
	err := c.readRow(ctx, `SELECT size_bytes, sha256, created_at FROM build_files WHERE org_id = ? AND file_key = ?`, orgID, key).
		Scan(&f.Size, &f.SHA256, timeCol{&f.CreatedAt})
	return f, c.classify("get build file "+key, err)
}

// ReadBuildFileChunk returns chunk n of a build file.
func (c *conn) ReadBuildFileChunk(ctx context.Context, orgID, key string, n int) ([]byte, error) {
	var b []byte
	err := c.readRow(ctx, `SELECT data FROM build_file_chunks WHERE org_id = ? AND file_key = ? AND n = ?`, orgID, key, n).Scan(&b)
	return b, c.classify(fmt.Sprintf("read build file %s chunk %d", key, n), err)
}

// ---- builds

const buildCols = `id, org_id, state, spec, worker, digest, error, steps, created_at, finished_at`

// CreateBuild inserts a build.
func (c *conn) CreateBuild(ctx context.Context, b model.Build) error {
	spec, steps, err := buildJSON(b)
	if err != nil {
		return c.errorf("create build %s: %w", b.ID, err)
	}
	_, err = c.exec(ctx, `INSERT INTO builds (`+buildCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		b.ID, b.OrgID, string(b.State), spec, b.Worker, b.Digest, b.Error, steps, c.d.Time(b.CreatedAt), c.timeOf(b.FinishedAt))
	return c.classify("create build "+b.ID, err)
}

func buildJSON(b model.Build) (spec, steps string, err error) {
	if spec, err = toJSON(b.Spec); err != nil {
		return "", "", err
	}
	if len(b.Steps) > 0 {
		if steps, err = toJSON(b.Steps); err != nil {
			return "", "", err
		}
	}
	return spec, steps, nil
}

func scanBuild(sc scanner) (model.Build, error) {
	var (
		b           model.Build
		state       string
		spec, steps string
	)
	if err := sc.Scan(&b.ID, &b.OrgID, &state, &spec, &b.Worker, &b.Digest, &b.Error, &steps,
		timeCol{&b.CreatedAt}, nullTimeCol{&b.FinishedAt}); err != nil {
		return b, err
	}
	b.State = model.BuildState(state)
	if err := fromJSON(spec, &b.Spec); err != nil {
		return b, err
	}
	if steps != "" {
		if err := fromJSON(steps, &b.Steps); err != nil {
			return b, err
		}
	}
	return b, nil
}

// GetBuild returns a build by id.
func (c *conn) GetBuild(ctx context.Context, id string) (model.Build, error) {
	b, err := scanBuild(c.readRow(ctx, `SELECT `+buildCols+` FROM builds WHERE id = ?`, id))
	return b, c.classify("get build "+id, err)
}

// UpdateBuild writes a build that is not finished yet.
func (c *conn) UpdateBuild(ctx context.Context, b model.Build) error {
	spec, steps, err := buildJSON(b)
	if err != nil {
		return c.errorf("update build %s: %w", b.ID, err)
	}
	step := "update build " + b.ID
	res, err := c.exec(ctx, `UPDATE builds SET state = ?, spec = ?, worker = ?, digest = ?, error = ?, steps = ?, finished_at = ?
		WHERE id = ? AND state NOT IN (?, ?)`,
		string(b.State), spec, b.Worker, b.Digest, b.Error, steps, c.timeOf(b.FinishedAt),
		b.ID, string(model.BuildReady), string(model.BuildFailed))
	if err := c.affected(step, res, err); !errors.Is(err, model.ErrNotFound) {
		return err
	}
	if _, gerr := c.GetBuild(ctx, b.ID); gerr != nil {
		return gerr
	}
	return c.errorf("%s: it is finished already: %w", step, model.ErrConflict)
}

// ListBuilds returns an org's builds, newest first.
func (c *conn) ListBuilds(ctx context.Context, orgID string, limit int) ([]model.Build, error) {
	if limit <= 0 {
		limit = defaultLimit
	}
	return collect(ctx, c, "list builds", scanBuild, `SELECT `+buildCols+` FROM builds WHERE org_id = ?
		ORDER BY created_at DESC, id DESC LIMIT ?`, orgID, limit)
}

// AppendBuildEvents stores events of a build, in one transaction.
func (c *conn) AppendBuildEvents(ctx context.Context, buildID string, evs []model.BuildEvent) error {
	if len(evs) == 0 {
		return nil
	}
	return c.inTx(ctx, "append build events", func(c *conn) error {
		for _, ev := range evs {
			b, err := toJSON(ev)
			if err != nil {
				return c.errorf("append build event %d: %w", ev.Seq, err)
			}
			if _, err := c.exec(ctx, `INSERT INTO build_events (build_id, seq, event) VALUES (?, ?, ?)`, buildID, ev.Seq, b); err != nil {
				return c.classify(fmt.Sprintf("append build event %d of %s", ev.Seq, buildID), err)
			}
		}
		return nil
	})
}

// ListBuildEvents returns a build's events after a Seq, oldest first.
func (c *conn) ListBuildEvents(ctx context.Context, buildID string, after, limit int) ([]model.BuildEvent, error) {
	if limit <= 0 {
		limit = defaultLimit
	}
	return collect(ctx, c, "list build events", func(sc scanner) (model.BuildEvent, error) {
		var s string
		var ev model.BuildEvent
		if err := sc.Scan(&s); err != nil {
			return ev, err
		}
		err := fromJSON(s, &ev)
		return ev, err
	}, `SELECT event FROM build_events WHERE build_id = ? AND seq > ? ORDER BY seq LIMIT ?`, buildID, after, limit)
}
