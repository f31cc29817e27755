package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
)

// ---- sandboxes

const sandboxCols = `id, org_id, template, template_digest, runtime, state, desired_state, reason,
	worker_id, env, metadata, resources, timeout_s, generation, created_at, updated_at,
	last_activity_at, expires_at, idle_suspend_s, no_auto_wake, snapshot_id, snapshot_bytes, pool, snapshots, public_traffic,
	on_expiry, network, snapshot_shared, move_from`

func scanSandbox(sc scanner) (model.Sandbox, error) {
	var sb model.Sandbox
	var env, meta, res, snaps, netw string
	if err := sc.Scan(&sb.ID, &sb.OrgID, &sb.Template, &sb.TemplateDigest, &sb.Runtime, &sb.State,
		&sb.DesiredState, &sb.Reason, &sb.WorkerID, &env, &meta, &res, &sb.TimeoutS, &sb.Generation,
		timeCol{&sb.CreatedAt}, timeCol{&sb.UpdatedAt}, timeCol{&sb.LastActivityAt}, nullTimeCol{&sb.ExpiresAt},
		&sb.IdleSuspendS, &sb.NoAutoWake, &sb.SnapshotID, &sb.SnapshotBytes, &sb.Pool, &snaps, &sb.PublicTraffic,
		&sb.OnExpiry, &netw, &sb.SnapshotShared, &sb.MoveFrom); err != nil {
		return sb, err
	}
	var sn store.SandboxSnapshots
	err := errors.Join(fromJSON(env, &sb.Env), fromJSON(meta, &sb.Metadata), fromJSON(res, &sb.Resources), fromJSON(snaps, &sn))
	if netw != "" {
		sb.Network = &model.SandboxNetwork{}
		err = errors.Join(err, fromJSON(netw, sb.Network))
	}
	sn.Apply(&sb)
	return sb, err
}

// networkJSON encodes sb.Network ("" for none).
func networkJSON(sb model.Sandbox) (string, error) {
	if sb.Network == nil {
		return "", nil
	}
	return toJSON(sb.Network)
}

// sandboxJSON encodes the JSON columns of sb.
func sandboxJSON(sb model.Sandbox) (env, meta, res, snaps string, err error) {
	if env, err = toJSON(sb.Env); err != nil {
		return
	}
	if meta, err = toJSON(sb.Metadata); err != nil {
		return
	}
	if res, err = toJSON(sb.Resources); err != nil {
		return
	}
	snaps, err = toJSON(store.SnapshotsOf(sb))
	return
}

// getSandbox reads a sandbox on q (c.w inside a transaction).
func (c *conn) getSandbox(ctx context.Context, q querier, id string) (model.Sandbox, error) {
	sb, err := scanSandbox(q.QueryRowContext(ctx, c.d.Rebind(`SELECT `+sandboxCols+` FROM sandboxes WHERE id = ?`), id))
	return sb, c.classify("get sandbox "+id, err)
}

// GetSandbox returns one sandbox.
func (c *conn) GetSandbox(ctx context.Context, id string) (model.Sandbox, error) {
	return c.getSandbox(ctx, c.r, id)
}

// CreateSandbox inserts the sandbox, its first operation and the
// idempotency key mapping in one transaction. Concurrent creates with the
// same org and key resolve to one sandbox: the losers' transactions roll
// back and they return the winner's pair.
func (c *conn) CreateSandbox(ctx context.Context, sb model.Sandbox, op model.Operation, idempotencyKey string) (model.Sandbox, model.Operation, bool, error) {
	env, meta, res, snaps, err := sandboxJSON(sb)
	if err != nil {
		return model.Sandbox{}, model.Operation{}, false, c.errorf("create sandbox %s: %w", sb.ID, err)
	}
	netw, err := networkJSON(sb)
	if err != nil {
		return model.Sandbox{}, model.Operation{}, false, c.errorf("create sandbox %s: %w", sb.ID, err)
	}
	return c.keyed(ctx, "create sandbox", sb, op, idempotencyKey, func(c *conn) (model.Sandbox, error) {
		if _, err := c.exec(ctx, `INSERT INTO sandboxes (`+sandboxCols+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			sb.ID, sb.OrgID, sb.Template, sb.TemplateDigest, sb.Runtime, sb.State, sb.DesiredState,
			sb.Reason, sb.WorkerID, env, meta, res, sb.TimeoutS, sb.Generation, c.d.Time(sb.CreatedAt),
			c.d.Time(sb.UpdatedAt), c.d.Time(sb.LastActivityAt), c.timeOf(sb.ExpiresAt),
			sb.IdleSuspendS, sb.NoAutoWake, sb.SnapshotID, sb.SnapshotBytes, sb.Pool, snaps, sb.PublicTraffic,
			sb.OnExpiry, netw, sb.SnapshotShared, sb.MoveFrom); err != nil {
			if idempotencyKey != "" && c.d.IsUniqueViolation(err) {
				// Perhaps a concurrent create with the same key and id.
				return model.Sandbox{}, errKeyTaken
			}
			return model.Sandbox{}, c.classify("create sandbox "+sb.ID, err)
		}
		if err := c.insertOperation(ctx, op); err != nil {
			return model.Sandbox{}, err
		}
		return c.getSandbox(ctx, c.w, sb.ID)
	})
}

// ClaimSandbox hands a pool member to sb.OrgID: see store.Store. The first
// guarded UPDATE locks the row, so concurrent claims of one member
// serialize and all but one see ErrConflict.
func (c *conn) ClaimSandbox(ctx context.Context, sb model.Sandbox, op model.Operation, idempotencyKey string) (model.Sandbox, model.Operation, bool, error) {
	return c.keyed(ctx, "claim sandbox", sb, op, idempotencyKey, func(c *conn) (model.Sandbox, error) {
		res, err := c.exec(ctx, `UPDATE sandboxes SET org_id = ? WHERE id = ? AND generation = ? AND pool <> ''`,
			sb.OrgID, sb.ID, sb.Generation)
		if err := c.affected("claim sandbox "+sb.ID, res, err); errors.Is(err, model.ErrNotFound) {
			return model.Sandbox{}, c.errorf("claim sandbox %s: not a pool member at generation %d: %w", sb.ID, sb.Generation, model.ErrConflict)
		} else if err != nil {
			return model.Sandbox{}, err
		}
		out, err := c.updateSandbox(ctx, sb)
		if err != nil {
			return model.Sandbox{}, err
		}
		return out, c.insertOperation(ctx, op)
	})
}

// errKeyTaken aborts a write whose idempotency key another transaction
// holds.
var errKeyTaken = errors.New("idempotency key taken")

// keyed runs write (which writes sb and inserts op) and records the
// idempotency key → (sandbox, operation) mapping under sb.OrgID, in one
// transaction. If the org used the key already, nothing is written and the
// earlier pair is returned with existed=true; a concurrent writer of the
// same key makes this one roll back and return the winner's pair.
func (c *conn) keyed(ctx context.Context, what string, sb model.Sandbox, op model.Operation, key string,
	write func(c *conn) (model.Sandbox, error)) (model.Sandbox, model.Operation, bool, error) {
	var outSB model.Sandbox
	var outOp model.Operation
	var existed bool
	err := c.inTx(ctx, what+" "+sb.ID, func(c *conn) error {
		if key != "" {
			var err error
			if outSB, outOp, existed, err = c.idempotent(ctx, c.w, what, sb.OrgID, key); err != nil || existed {
				return err
			}
		}
		var err error
		if outSB, err = write(c); err != nil {
			return err
		}
		if key != "" {
			// Waits for a concurrent insert of the same key, then does
			// nothing if that one committed.
			res, err := c.exec(ctx, `INSERT INTO idempotency_keys (org_id, key, sandbox_id, operation_id, created_at)
				VALUES (?, ?, ?, ?, ?) ON CONFLICT (org_id, key) DO NOTHING`,
				sb.OrgID, key, sb.ID, op.ID, c.d.Time(c.now()))
			if err := c.affected(what+": record idempotency key", res, err); errors.Is(err, model.ErrNotFound) {
				return errKeyTaken
			} else if err != nil {
				return err
			}
		}
		outOp, err = c.getOperation(ctx, c.w, op.ID)
		return err
	})
	if errors.Is(err, errKeyTaken) {
		// The transaction rolled back; return the pair that holds the key.
		osb, oop, found, err := c.idempotent(ctx, c.w, what, sb.OrgID, key)
		if err != nil {
			return model.Sandbox{}, model.Operation{}, false, err
		}
		if !found {
			return model.Sandbox{}, model.Operation{}, false, c.errorf("%s %s: %w", what, sb.ID, model.ErrConflict)
		}
		return osb, oop, true, nil
	}
	if err != nil {
		return model.Sandbox{}, model.Operation{}, false, err
	}
	return outSB, outOp, existed, nil
}

// idempotent looks up an org's Idempotency-Key on q and, when the org has
// used it before, returns the sandbox and operation it created then.
func (c *conn) idempotent(ctx context.Context, q querier, what, orgID, key string) (model.Sandbox, model.Operation, bool, error) {
	var sbID, opID string
	err := q.QueryRowContext(ctx, c.d.Rebind(`SELECT sandbox_id, operation_id FROM idempotency_keys
		WHERE org_id = ? AND key = ?`), orgID, key).Scan(&sbID, &opID)
	if errors.Is(err, sql.ErrNoRows) {
		return model.Sandbox{}, model.Operation{}, false, nil
	}
	if err != nil {
		return model.Sandbox{}, model.Operation{}, false, c.classify(what+": read idempotency key", err)
	}
	sb, err := c.getSandbox(ctx, q, sbID)
	if err != nil {
		return model.Sandbox{}, model.Operation{}, false, err
	}
	op, err := c.getOperation(ctx, q, opID)
	if err != nil {
		return model.Sandbox{}, model.Operation{}, false, err
	}
	return sb, op, true, nil
}

// ListSandboxes returns one page of sandboxes matching f, ordered by
// creation time then id, and the cursor of the next page ("" on the last).
// Without States, deleted sandboxes are left out unless IncludeDeleted.
func (c *conn) ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]model.Sandbox, string, error) {
	var where []string
	var args []any
	if f.OrgID != "" {
		where = append(where, "org_id = ?")
		args = append(args, f.OrgID)
	}
	if f.WorkerID != "" {
		where = append(where, "worker_id = ?")
		args = append(args, f.WorkerID)
	}
	if len(f.States) > 0 {
		where = append(where, "state IN ("+in(len(f.States))+")")
		for _, st := range f.States {
			args = append(args, string(st))
		}
	} else if !f.IncludeDeleted {
		where = append(where, "state <> ?")
		args = append(args, string(model.StateDeleted))
	}
	if len(f.Metadata) > 0 {
		cond, cargs, err := c.d.JSONContains("sandboxes.metadata", f.Metadata)
		if err != nil {
			return nil, "", c.errorf("list sandboxes: %w", err)
		}
		where = append(where, cond)
		args = append(args, cargs...)
	}
	if len(f.Templates) > 0 {
		where = append(where, "template IN ("+in(len(f.Templates))+")")
		for _, t := range f.Templates {
			args = append(args, t)
		}
	}
	if !f.CreatedAfter.IsZero() {
		where = append(where, "created_at >= ?")
		args = append(args, c.d.Time(f.CreatedAfter))
	}
	order := "ORDER BY created_at, id"
	if f.Descending {
		order = "ORDER BY created_at DESC, id DESC"
	}
	if f.Cursor != "" {
		cur, err := decodeCursor(f.Cursor)
		if err != nil {
			return nil, "", err
		}
		if cur.Desc != f.Descending {
			return nil, "", model.Errorf(model.ErrInvalid, "the page cursor was made for the other sort order")
		}
		if f.Descending {
			where = append(where, "(created_at, id) < (?, ?)")
		} else {
			where = append(where, "(created_at, id) > (?, ?)")
		}
		args = append(args, c.d.Time(cur.CreatedAt), cur.ID)
	}
	limit := f.Limit
	if limit <= 0 {
		limit = defaultLimit
	}
	q := `SELECT ` + sandboxCols + ` FROM sandboxes`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " " + order + " LIMIT ?"
	args = append(args, limit+1)
	out, err := collect(ctx, c, "list sandboxes", scanSandbox, q, args...)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(out) > limit {
		out = out[:limit]
		next = encodeCursor(out[limit-1], f.Descending)
	}
	return out, next, nil
}

// UpdateSandbox writes sb if the stored generation equals sb.Generation.
// ID, OrgID and CreatedAt are never changed.
func (c *conn) UpdateSandbox(ctx context.Context, sb model.Sandbox) (model.Sandbox, error) {
	return c.updateSandbox(ctx, sb)
}

// updateSandbox is the guarded write. LastActivityAt never moves backwards,
// so a stale read cannot undo a TouchSandbox.
func (c *conn) updateSandbox(ctx context.Context, sb model.Sandbox) (model.Sandbox, error) {
	env, meta, res, snaps, err := sandboxJSON(sb)
	if err != nil {
		return model.Sandbox{}, c.errorf("update sandbox %s: %w", sb.ID, err)
	}
	netw, err := networkJSON(sb)
	if err != nil {
		return model.Sandbox{}, c.errorf("update sandbox %s: %w", sb.ID, err)
	}
	out, err := scanSandbox(c.writeRow(ctx, `UPDATE sandboxes SET
			template = ?, template_digest = ?, runtime = ?, state = ?, desired_state = ?,
			reason = ?, worker_id = ?, env = ?, metadata = ?, resources = ?, timeout_s = ?,
			generation = generation + 1, updated_at = ?,
			last_activity_at = `+c.d.Greatest("last_activity_at", "?")+`, expires_at = ?,
			idle_suspend_s = ?, no_auto_wake = ?, snapshot_id = ?, snapshot_bytes = ?, pool = ?, snapshots = ?,
			public_traffic = ?, on_expiry = ?, network = ?, snapshot_shared = ?, move_from = ?
		WHERE id = ? AND generation = ?
		RETURNING `+sandboxCols,
		sb.Template, sb.TemplateDigest, sb.Runtime, sb.State, sb.DesiredState,
		sb.Reason, sb.WorkerID, env, meta, res, sb.TimeoutS,
		c.d.Time(c.now()), c.d.Time(sb.LastActivityAt), c.timeOf(sb.ExpiresAt),
		sb.IdleSuspendS, sb.NoAutoWake, sb.SnapshotID, sb.SnapshotBytes, sb.Pool, snaps, sb.PublicTraffic, sb.OnExpiry, netw, sb.SnapshotShared, sb.MoveFrom,
		sb.ID, sb.Generation))
	if errors.Is(err, sql.ErrNoRows) {
		var gen int64
		err := c.writeRow(ctx, `SELECT generation FROM sandboxes WHERE id = ?`, sb.ID).Scan(&gen)
		if err != nil {
			return model.Sandbox{}, c.classify("update sandbox "+sb.ID, err)
		}
		return model.Sandbox{}, c.errorf("update sandbox %s: generation %d, stored %d: %w",
			sb.ID, sb.Generation, gen, model.ErrConflict)
	}
	return out, c.classify("update sandbox "+sb.ID, err)
}

// TouchSandbox moves LastActivityAt forward to at without bumping the
// generation.
func (c *conn) TouchSandbox(ctx context.Context, id string, at time.Time) error {
	res, err := c.exec(ctx, `UPDATE sandboxes SET last_activity_at = `+c.d.Greatest("last_activity_at", "?")+` WHERE id = ?`,
		c.d.Time(at), id)
	return c.affected("touch sandbox "+id, res, err)
}
