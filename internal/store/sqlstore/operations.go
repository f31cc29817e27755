package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"strings"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
	"github.com/airlock/airlock/internal/tracing"
)

// ---- operations

const operationCols = `id, org_id, sandbox_id, kind, state, target, reason, created_at, updated_at, deadline, trace_parent`

func scanOperation(sc scanner) (model.Operation, error) {
	var op model.Operation
	err := sc.Scan(&op.ID, &op.OrgID, &op.SandboxID, &op.Kind, &op.State, &op.Target, &op.Reason,
		timeCol{&op.CreatedAt}, timeCol{&op.UpdatedAt}, timeCol{&op.Deadline}, &op.TraceParent)
	return op, err
}

// insertOperation writes op. An operation without a TraceParent takes that
// of ctx's span (the API request or controller round writing it) and that
// span is annotated with the operation: every path that makes an
// operation (creates, lifecycle requests, pool claims, expiry) passes here.
func (c *conn) insertOperation(ctx context.Context, op model.Operation) error {
	if op.TraceParent == "" {
		op.TraceParent = tracing.TraceParent(ctx)
	}
	if len(op.TraceParent) > tracing.MaxTraceParent {
		op.TraceParent = ""
	}
	tracing.AnnotateOperation(ctx, op)
	_, err := c.exec(ctx, `INSERT INTO operations (`+operationCols+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		op.ID, op.OrgID, op.SandboxID, op.Kind, op.State, op.Target, op.Reason,
		c.d.Time(op.CreatedAt), c.d.Time(op.UpdatedAt), c.d.Time(op.Deadline), op.TraceParent)
	return c.classify("create operation "+op.ID, err)
}

// getOperation reads an operation on q (c.w inside a transaction).
func (c *conn) getOperation(ctx context.Context, q querier, id string) (model.Operation, error) {
	op, err := scanOperation(q.QueryRowContext(ctx, c.d.Rebind(`SELECT `+operationCols+` FROM operations WHERE id = ?`), id))
	return op, c.classify("get operation "+id, err)
}

// CreateOperation inserts an operation; ErrInvalid if its sandbox does not
// exist, ErrConflict if the id does.
func (c *conn) CreateOperation(ctx context.Context, op model.Operation) error {
	return c.insertOperation(ctx, op)
}

// GetOperation returns one operation.
func (c *conn) GetOperation(ctx context.Context, id string) (model.Operation, error) {
	return c.getOperation(ctx, c.r, id)
}

// UpdateOperation writes op's state, target, reason and deadline (and
// UpdatedAt=now) if the stored operation is not Done.
func (c *conn) UpdateOperation(ctx context.Context, op model.Operation) (model.Operation, error) {
	return c.updateOperation(ctx, op)
}

func (c *conn) updateOperation(ctx context.Context, op model.Operation) (model.Operation, error) {
	args := []any{op.State, op.Target, op.Reason, c.d.Time(op.Deadline), c.d.Time(c.now()), op.ID}
	out, err := scanOperation(c.writeRow(ctx, `UPDATE operations SET
			state = ?, target = ?, reason = ?, deadline = ?, updated_at = ?
		WHERE id = ? AND state NOT IN (`+in(len(doneStates))+`)
		RETURNING `+operationCols, append(args, doneStates...)...))
	if errors.Is(err, sql.ErrNoRows) {
		var state string
		err := c.writeRow(ctx, `SELECT state FROM operations WHERE id = ?`, op.ID).Scan(&state)
		if err != nil {
			return model.Operation{}, c.classify("update operation "+op.ID, err)
		}
		return model.Operation{}, c.errorf("update operation %s: already %s: %w", op.ID, state, model.ErrConflict)
	}
	return out, c.classify("update operation "+op.ID, err)
}

// ListOperations returns the operations of f.SandboxID (only open ones if
// f.Open), or, without a sandbox, every open operation; oldest first.
func (c *conn) ListOperations(ctx context.Context, f store.OperationFilter) ([]model.Operation, error) {
	var where []string
	var args []any
	if f.SandboxID != "" {
		where = append(where, "sandbox_id = ?")
		args = append(args, f.SandboxID)
	}
	if f.Open || f.SandboxID == "" {
		where = append(where, "state NOT IN ("+in(len(doneStates))+")")
		args = append(args, doneStates...)
	}
	return collect(ctx, c, "list operations", scanOperation,
		`SELECT `+operationCols+` FROM operations WHERE `+strings.Join(where, " AND ")+` ORDER BY created_at, id`, args...)
}
