// Package postgres opens the store (internal/store/sqlstore) on
// PostgreSQL, for installations that run several servers against one
// database. What is PostgreSQL's own lives here: the connection, the
// migrations (migrations/*.sql) and the Dialect.
//
// The connection is pgx (github.com/jackc/pgx/v5) through its database/sql
// adapter, pgx/v5/stdlib: pgx was already the driver here, the adapter is
// part of the same module (no new dependency, the same wire protocol,
// statement cache and *pgconn.PgError codes), and database/sql is what
// lets one implementation serve SQLite and PostgreSQL alike.
//
// Timestamps are timestamptz (microseconds); maps, lists and structs are
// jsonb. The schema is migrated on Open under an advisory lock, so that
// servers starting together do not race. Event appends are serialized
// with a transaction-scoped advisory lock, so a reader that has seen Seq n
// never later finds a committed event below n, and announced with NOTIFY
// on channel airlock_events (delivered at commit), which every other
// server's store hears on a connection of its own (LISTEN), so that its
// long polls and event streams wake at once.
package postgres

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store/sqlstore"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Advisory lock keys (arbitrary, fixed).
const (
	lockMigrate int64 = 0x6169726c6f636b01 // "airlock" + 1
	lockEvents  int64 = 0x6169726c6f636b02
)

// Store is the store opened on PostgreSQL.
type Store = sqlstore.Store

// Open connects to the database at url (a postgres:// URL or key=value DSN)
// and migrates it (opts: sqlstore.WithClock).
func Open(ctx context.Context, url string, opts ...sqlstore.Option) (*Store, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, model.Errorf(model.ErrInvalid, "postgres: parse url: %v", err)
	}
	db := stdlib.OpenDB(*cfg)
	// As pgxpool would: at most max(4, CPUs) connections, recycled hourly.
	db.SetMaxOpenConns(max(4, runtime.NumCPU()))
	db.SetMaxIdleConns(max(4, runtime.NumCPU()))
	db.SetConnMaxLifetime(time.Hour)
	db.SetConnMaxIdleTime(30 * time.Minute)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("postgres: connect: %w", err)
	}
	sub, _ := fs.Sub(migrations, "migrations")
	n, err := newNotifier(cfg)
	if err != nil {
		db.Close()
		return nil, err
	}
	scfg := sqlstore.Config{Dialect: Dialect{}, Writer: db, Migrations: sub, Notifier: n}
	for _, o := range opts {
		o(&scfg)
	}
	s, err := sqlstore.New(ctx, scfg)
	if err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// Dialect is PostgreSQL's sqlstore.Dialect.
type Dialect struct{}

var _ sqlstore.Dialect = Dialect{}

func (Dialect) Name() string { return "postgres" }

// Rebind numbers the placeholders: ?, ? → $1, $2 (none sits inside a
// literal in this store's queries; quoted text is skipped anyway).
func (Dialect) Rebind(q string) string {
	if !strings.Contains(q, "?") {
		return q
	}
	var b strings.Builder
	b.Grow(len(q) + 16)
	n, quoted := 0, false
	for i := 0; i < len(q); i++ {
		switch ch := q[i]; {
		case ch == '\'':
			quoted = !quoted
			b.WriteByte(ch)
		case ch == '?' && !quoted:
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
		default:
			b.WriteByte(ch)
		}
	}
	return b.String()
}

// Time is a time.Time (pgx sends microseconds).
func (Dialect) Time(t time.Time) any { return t.UTC() }

func (Dialect) Greatest(a, b string) string { return "GREATEST(" + a + ", " + b + ")" }

// JSONContains is jsonb containment (served by the GIN index on
// sandboxes.metadata).
func (Dialect) JSONContains(col string, kv map[string]string) (string, []any, error) {
	b, err := json.Marshal(kv)
	if err != nil {
		return "", nil, fmt.Errorf("encode json: %w", err)
	}
	return col + " @> ?::jsonb", []any{string(b)}, nil
}

func (Dialect) Classify(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "23505": // unique_violation
			return model.ErrConflict
		case "23503", "23502", "23514", "22P02", "22001": // fk, not null, check, bad text, too long
			return model.ErrInvalid
		}
	}
	return nil
}

func (Dialect) IsUniqueViolation(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}

// IsRetryable: serialization_failure, deadlock_detected.
func (Dialect) IsRetryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}

func (Dialect) Lock(l sqlstore.Lock) string {
	switch l {
	case sqlstore.LockMigrations:
		return "SELECT pg_advisory_xact_lock(" + strconv.FormatInt(lockMigrate, 10) + ")"
	case sqlstore.LockEvents:
		return "SELECT pg_advisory_xact_lock(" + strconv.FormatInt(lockEvents, 10) + ")"
	}
	return ""
}

func (Dialect) MigrationsTable() string {
	return `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    integer PRIMARY KEY,
		applied_at timestamptz NOT NULL DEFAULT now())`
}
