package sqlstore

import (
	"context"
	"database/sql"
	"errors"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
)

// ---- worker credentials

// GetWorkerCredential returns the stored credential of workerID.
func (c *conn) GetWorkerCredential(ctx context.Context, workerID string) (store.WorkerCredential, error) {
	cr := store.WorkerCredential{WorkerID: workerID}
	err := c.readRow(ctx, `SELECT secret_hash, created_at, updated_at FROM worker_credentials WHERE worker_id = ?`, workerID).
		Scan(&cr.SecretHash, timeCol{&cr.CreatedAt}, timeCol{&cr.UpdatedAt})
	return cr, c.classify("get worker credential "+workerID, err)
}

// PutWorkerCredential stores cr if the stored hash is oldHash ("": none).
func (c *conn) PutWorkerCredential(ctx context.Context, cr store.WorkerCredential, oldHash string) error {
	step := "put worker credential " + cr.WorkerID
	var res sql.Result
	var err error
	if oldHash == "" {
		res, err = c.exec(ctx, `INSERT INTO worker_credentials (worker_id, secret_hash, created_at, updated_at)
			VALUES (?, ?, ?, ?) ON CONFLICT (worker_id) DO NOTHING`,
			cr.WorkerID, cr.SecretHash, c.d.Time(cr.CreatedAt), c.d.Time(cr.UpdatedAt))
	} else {
		res, err = c.exec(ctx, `UPDATE worker_credentials SET secret_hash = ?, updated_at = ?
			WHERE worker_id = ? AND secret_hash = ?`, cr.SecretHash, c.d.Time(cr.UpdatedAt), cr.WorkerID, oldHash)
	}
	if err := c.affected(step, res, err); errors.Is(err, model.ErrNotFound) {
		return c.errorf("%s: the stored credential changed: %w", step, model.ErrConflict)
	} else if err != nil {
		return err
	}
	return nil
}

// DeleteWorkerCredential removes the credential of workerID.
func (c *conn) DeleteWorkerCredential(ctx context.Context, workerID string) error {
	res, err := c.exec(ctx, `DELETE FROM worker_credentials WHERE worker_id = ?`, workerID)
	return c.affected("delete worker credential "+workerID, res, err)
}

// ---- workers

// workerCols are the columns UpsertWorker writes; workerReadCols adds the
// operator's marks, which only SetWorkerCordoned writes.
const workerCols = `id, data_plane_url, internal_url, runtimes, templates, capacity_mib, capacity_vcpus, free_mib, last_heartbeat, created_at, blob_store`

const workerReadCols = workerCols + `, cordoned, draining`

// SetWorkerCordoned sets or clears a worker's cordon (clearing it ends a
// drain too); ErrNotFound if the worker is not registered.
func (c *conn) SetWorkerCordoned(ctx context.Context, id string, cordoned bool) error {
	q := `UPDATE workers SET cordoned = ? WHERE id = ?`
	if !cordoned {
		q = `UPDATE workers SET cordoned = ?, draining = false WHERE id = ?`
	}
	res, err := c.exec(ctx, q, cordoned, id)
	return c.affected("cordon worker "+id, res, err)
}

// SetWorkerDraining cordons a worker and marks it draining; ErrNotFound if
// the worker is not registered.
func (c *conn) SetWorkerDraining(ctx context.Context, id string) error {
	res, err := c.exec(ctx, `UPDATE workers SET cordoned = true, draining = true WHERE id = ?`, id)
	return c.affected("drain worker "+id, res, err)
}

// UpsertWorker inserts or replaces a worker, keeping its first CreatedAt
// and its cordon.
func (c *conn) UpsertWorker(ctx context.Context, w model.Worker) error {
	rt, err := toJSON(w.Runtimes)
	if err != nil {
		return c.errorf("upsert worker %s: %w", w.ID, err)
	}
	tpl, err := toJSON(w.Templates)
	if err != nil {
		return c.errorf("upsert worker %s: %w", w.ID, err)
	}
	_, err = c.exec(ctx, `INSERT INTO workers (`+workerCols+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET
			data_plane_url = excluded.data_plane_url, internal_url = excluded.internal_url,
			runtimes = excluded.runtimes, templates = excluded.templates,
			capacity_mib = excluded.capacity_mib, capacity_vcpus = excluded.capacity_vcpus, free_mib = excluded.free_mib,
			last_heartbeat = excluded.last_heartbeat, blob_store = excluded.blob_store`,
		w.ID, w.DataPlaneURL, w.InternalURL, rt, tpl, w.CapacityMiB, w.CapacityVCPUs, w.FreeMiB,
		c.d.Time(w.LastHeartbeat), c.d.Time(w.CreatedAt), w.BlobStore)
	return c.classify("upsert worker "+w.ID, err)
}

func scanWorker(sc scanner) (model.Worker, error) {
	var w model.Worker
	var rt, tpl string
	var free sql.NullInt64
	if err := sc.Scan(&w.ID, &w.DataPlaneURL, &w.InternalURL, &rt, &tpl, &w.CapacityMiB, &w.CapacityVCPUs, &free,
		timeCol{&w.LastHeartbeat}, timeCol{&w.CreatedAt}, &w.BlobStore, &w.Cordoned, &w.Draining); err != nil {
		return w, err
	}
	if free.Valid {
		n := int(free.Int64)
		w.FreeMiB = &n
	}
	return w, errors.Join(fromJSON(rt, &w.Runtimes), fromJSON(tpl, &w.Templates))
}

// GetWorker returns one worker.
func (c *conn) GetWorker(ctx context.Context, id string) (model.Worker, error) {
	w, err := scanWorker(c.readRow(ctx, `SELECT `+workerReadCols+` FROM workers WHERE id = ?`, id))
	return w, c.classify("get worker "+id, err)
}

// ListWorkers returns every worker ordered by id.
func (c *conn) ListWorkers(ctx context.Context) ([]model.Worker, error) {
	return collect(ctx, c, "list workers", scanWorker, `SELECT `+workerReadCols+` FROM workers ORDER BY id`)
}
