package sqlstore

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/airlock/airlock/internal/model"
)

// ---- events

// AppendEvent stores ev with the next Seq (and Time=now if unset) and
// returns it as stored. Appends are serialized (LockEvents) so that Seq
// order is commit order; the store's Notifier tells the other stores on
// the database once the append commits.
func (c *conn) AppendEvent(ctx context.Context, ev model.Event) (model.Event, error) {
	if ev.Time.IsZero() {
		ev.Time = c.now()
	}
	err := c.inTx(ctx, "append event", func(c *conn) error {
		if err := c.lock(ctx, LockEvents); err != nil {
			return c.classify("append event: lock", err)
		}
		if err := c.writeRow(ctx, `INSERT INTO events (org_id, sandbox_id, operation_id, type, data, time)
			VALUES (?, ?, ?, ?, ?, ?) RETURNING seq, time`,
			ev.OrgID, ev.SandboxID, ev.OperationID, ev.Type, string(ev.Data), c.d.Time(ev.Time)).Scan(&ev.Seq, timeCol{&ev.Time}); err != nil {
			return c.classify("append event", err)
		}
		if c.n == nil {
			return nil
		}
		if err := c.n.Appended(ctx, c.tx); err != nil {
			return c.classify("append event: notify", err)
		}
		*c.committed = append(*c.committed, c.n.Committed)
		return nil
	})
	if err != nil {
		return model.Event{}, err
	}
	return ev, nil
}

func scanEvent(sc scanner) (model.Event, error) {
	var ev model.Event
	var data string
	err := sc.Scan(&ev.Seq, &ev.OrgID, &ev.SandboxID, &ev.OperationID, &ev.Type, &data, timeCol{&ev.Time})
	if data != "" {
		ev.Data = json.RawMessage(data)
	}
	return ev, err
}

// ListEvents returns events with Seq > afterSeq, oldest first, at most limit
// (0 means 100).
func (c *conn) ListEvents(ctx context.Context, orgID, sandboxID string, afterSeq int64, limit int) ([]model.Event, error) {
	if limit <= 0 {
		limit = defaultLimit
	}
	where := []string{"seq > ?"}
	args := []any{afterSeq}
	if orgID != "" {
		where = append(where, "org_id = ?")
		args = append(args, orgID)
	}
	if sandboxID != "" {
		where = append(where, "sandbox_id = ?")
		args = append(args, sandboxID)
	}
	args = append(args, limit)
	return collect(ctx, c, "list events", scanEvent, `SELECT seq, org_id, sandbox_id, operation_id, type, data, time
		FROM events WHERE `+strings.Join(where, " AND ")+` ORDER BY seq LIMIT ?`, args...)
}
