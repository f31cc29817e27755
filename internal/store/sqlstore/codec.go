package sqlstore

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"

	"github.com/airlock/airlock/internal/model"
)

// timeOf encodes *t for a nullable timestamp column.
func (c *conn) timeOf(t *time.Time) any {
	if t == nil {
		return nil
	}
	return c.d.Time(*t)
}

// timeCol scans a timestamp column into *t (UTC): a time.Time as
// PostgreSQL returns it, or RFC 3339 text as SQLite stores it.
type timeCol struct{ t *time.Time }

func (tc timeCol) Scan(src any) error {
	t, err := parseTime(src)
	if err != nil {
		return err
	}
	*tc.t = t
	return nil
}

// nullTimeCol scans a nullable timestamp column into *p (nil for NULL).
type nullTimeCol struct{ p **time.Time }

func (nc nullTimeCol) Scan(src any) error {
	if src == nil {
		*nc.p = nil
		return nil
	}
	t, err := parseTime(src)
	if err != nil {
		return err
	}
	*nc.p = &t
	return nil
}

func parseTime(src any) (time.Time, error) {
	switch v := src.(type) {
	case time.Time:
		return v.UTC(), nil
	case string:
		return parseTimeText(v)
	case []byte:
		return parseTimeText(string(v))
	}
	return time.Time{}, fmt.Errorf("scan time: unsupported value %T", src)
}

func parseTimeText(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("parse time %q: %w", s, err)
	}
	return t.UTC(), nil
}

func toJSON(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("encode json: %w", err)
	}
	return string(b), nil
}

func fromJSON(s string, v any) error {
	if s == "" {
		return nil
	}
	if err := json.Unmarshal([]byte(s), v); err != nil {
		return fmt.Errorf("decode json: %w", err)
	}
	return nil
}

// cursor is the decoded form of the opaque page cursor.
type cursor struct {
	CreatedAt time.Time `json:"t"`
	ID        string    `json:"id"`
	Desc      bool      `json:"d,omitempty"` // made for a newest-first listing
}

func encodeCursor(sb model.Sandbox, desc bool) string {
	b, _ := json.Marshal(cursor{CreatedAt: sb.CreatedAt.UTC(), ID: sb.ID, Desc: desc})
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (cursor, error) {
	var c cursor
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err != nil || c.ID == "" {
		return c, model.Errorf(model.ErrInvalid, "invalid page cursor")
	}
	return c, nil
}
