// Package sqlstore is the one implementation of store.Store, over
// database/sql. Each backend package (internal/store/sqlite,
// internal/store/postgres) keeps only what differs between databases: how
// to open the connections, its migrations and a Dialect.
//
// Queries are written once, with ? placeholders, in SQL that both SQLite
// and PostgreSQL accept; the Dialect rewrites placeholders, encodes
// timestamps, expresses JSON containment and the two-argument maximum,
// classifies driver errors (unique violations, bad input, retryable
// serialization failures) and names the locks that serialize event
// appends and migrations. Timestamps are read back whatever the column
// type: a time.Time (PostgreSQL timestamptz) or RFC 3339 text (SQLite).
//
// A Store holds a writer and a reader *sql.DB (the same one on
// PostgreSQL; SQLite writes through one connection and reads through a
// pool). Every write of more than one statement runs in one transaction;
// InTx gives callers theirs (nested: savepoints; retried whole after a
// serialization failure). The methods are those of conn, which runs them
// on the store's connections or inside one transaction alike. A Notifier,
// when the backend gives one, tells the other stores on the database of
// event appends (store.Notifier), and the store dates what it stamps by
// Config.Now.
package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
)

// Dialect is what differs between the SQL databases a Store runs on.
type Dialect interface {
	// Name prefixes every error ("sqlite", "postgres").
	Name() string
	// Rebind rewrites the ? placeholders of query into the database's own
	// (PostgreSQL: $1, $2, …). Queries hold no ? inside literals.
	Rebind(query string) string
	// Time encodes t (UTC) for a timestamp column. Columns must sort in
	// time order.
	Time(t time.Time) any
	// Greatest is the SQL of the larger of two values of one type.
	Greatest(a, b string) string
	// JSONContains is a condition that holds when the JSON object in
	// column col has every key of kv with its string value, with its
	// arguments in order.
	JSONContains(col string, kv map[string]string) (string, []any, error)
	// Classify returns model.ErrConflict for a unique (or primary key)
	// violation, model.ErrInvalid for a foreign key, not null, check or
	// malformed-value violation, and nil for any other error.
	Classify(err error) error
	// IsUniqueViolation reports a unique (or primary key) violation.
	IsUniqueViolation(err error) bool
	// IsRetryable reports an error after which the whole transaction may
	// simply run again (a serialization failure or a deadlock).
	IsRetryable(err error) bool
	// Lock is a statement, run first in a transaction, that holds the
	// named lock until the transaction ends; "" when the database needs
	// none (one writer at a time anyway).
	Lock(l Lock) string
	// MigrationsTable is the CREATE TABLE IF NOT EXISTS statement of
	// schema_migrations (version integer key, applied_at timestamp).
	MigrationsTable() string
}

// Lock names a transaction-scoped lock.
type Lock int

const (
	// LockMigrations serializes stores migrating one database at once.
	LockMigrations Lock = iota + 1
	// LockEvents serializes event appends, so that Seq order is commit
	// order: a reader that has seen Seq n never later finds a committed
	// event below n.
	LockEvents
)

// defaultLimit caps a page when the caller does not.
const defaultLimit = 100

// maxAttempts bounds how often a transaction runs when the database
// reports a retryable failure.
const maxAttempts = 3

// Config is what a backend hands New.
type Config struct {
	Dialect Dialect
	// Writer runs every write and every transaction.
	Writer *sql.DB
	// Reader runs reads outside transactions (nil: Writer).
	Reader *sql.DB
	// Migrations holds the schema as files NNNN_name.sql at its root,
	// applied in order, each once, in one transaction.
	Migrations fs.FS
	// Now is the clock that dates what the store stamps itself: a
	// sandbox's or operation's UpdatedAt, an event without a Time, an
	// idempotency key, a migration (nil: time.Now). Servers pass the
	// clock their service and controller use.
	Now func() time.Time
	// Notifier carries event appends to the other stores on the database
	// (nil: none; Listen returns at once).
	Notifier Notifier
}

// Option changes a Config; backends' Open functions take them.
type Option func(*Config)

// WithClock makes the store take the time from now instead of time.Now.
func WithClock(now func() time.Time) Option {
	return func(c *Config) { c.Now = now }
}

// Store is the SQL store. It is safe for concurrent use.
type Store struct {
	conn
	writer, reader *sql.DB
}

var _ store.Store = (*Store)(nil)

// New migrates the database of cfg and returns the store over it. On
// error the caller still owns (and closes) the connections.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Reader == nil {
		cfg.Reader = cfg.Writer
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Store{writer: cfg.Writer, reader: cfg.Reader}
	s.conn = conn{d: cfg.Dialect, w: cfg.Writer, r: cfg.Reader, db: cfg.Writer, now: cfg.Now, n: cfg.Notifier}
	if err := s.migrate(ctx, cfg.Migrations); err != nil {
		return nil, err
	}
	return s, nil
}

// Close closes the connections.
func (s *Store) Close() error {
	if s.reader == s.writer {
		return s.writer.Close()
	}
	return errors.Join(s.reader.Close(), s.writer.Close())
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.reader.PingContext(ctx); err != nil {
		return fmt.Errorf("%s: ping: %w", s.d.Name(), err)
	}
	return nil
}

func (s *Store) migrate(ctx context.Context, migrations fs.FS) error {
	name := s.d.Name()
	names, err := fs.Glob(migrations, "*.sql")
	if err != nil {
		return fmt.Errorf("%s: list migrations: %w", name, err)
	}
	sort.Strings(names)
	return s.inTx(ctx, "migrate", func(c *conn) error {
		if err := c.lock(ctx, LockMigrations); err != nil {
			return fmt.Errorf("%s: migrate: lock: %w", name, err)
		}
		if _, err := c.w.ExecContext(ctx, s.d.MigrationsTable()); err != nil {
			return fmt.Errorf("%s: migrate: create schema_migrations: %w", name, err)
		}
		for _, base := range names {
			version, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
			if err != nil {
				return fmt.Errorf("%s: migrate: bad migration name %s: %w", name, base, err)
			}
			var n int
			if err := c.writeRow(ctx, `SELECT count(*) FROM schema_migrations WHERE version = ?`, version).Scan(&n); err != nil {
				return fmt.Errorf("%s: migrate: read schema_migrations: %w", name, err)
			}
			if n > 0 {
				continue
			}
			body, err := fs.ReadFile(migrations, base)
			if err != nil {
				return fmt.Errorf("%s: migrate: read %s: %w", name, base, err)
			}
			// No arguments: the whole file runs (PostgreSQL: through the
			// simple protocol, which takes several statements).
			if _, err := c.w.ExecContext(ctx, string(body)); err != nil {
				return fmt.Errorf("%s: migrate: apply %s: %w", name, base, err)
			}
			if _, err := c.exec(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)`,
				version, c.d.Time(c.now())); err != nil {
				return fmt.Errorf("%s: migrate: record %s: %w", name, base, err)
			}
		}
		return nil
	})
}

// querier is what *sql.DB and *sql.Tx share.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

type scanner interface{ Scan(dest ...any) error }

// conn is where the store's methods run: on the store's connections, or
// bound to one transaction (w and r are then both the transaction).
type conn struct {
	d   Dialect
	w   querier // writes, and reads that must see this conn's writes
	r   querier // other reads
	db  *sql.DB // begins transactions (nil when bound to one)
	now func() time.Time
	n   Notifier
	// committed are what runs after the transaction c is bound to
	// commits.
	committed *[]func()
	tx        *sql.Tx
	depth     int // savepoints below tx
}

func (c *conn) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return c.w.ExecContext(ctx, c.d.Rebind(query), args...)
}

// writeRow runs a query on the writer (RETURNING, or reads inside a
// transaction).
func (c *conn) writeRow(ctx context.Context, query string, args ...any) *sql.Row {
	return c.w.QueryRowContext(ctx, c.d.Rebind(query), args...)
}

func (c *conn) readRow(ctx context.Context, query string, args ...any) *sql.Row {
	return c.r.QueryRowContext(ctx, c.d.Rebind(query), args...)
}

func (c *conn) read(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return c.r.QueryContext(ctx, c.d.Rebind(query), args...)
}

// InTx runs fn in one transaction (see store.Tx): on the store a new one,
// retried after a serialization failure; on a Tx a savepoint.
func (c *conn) InTx(ctx context.Context, fn func(tx store.Tx) error) error {
	return c.inTx(ctx, "transaction", func(c *conn) error { return fn(c) })
}

var _ store.Tx = (*conn)(nil)

// lock takes l for the rest of c's transaction.
func (c *conn) lock(ctx context.Context, l Lock) error {
	q := c.d.Lock(l)
	if q == "" {
		return nil
	}
	_, err := c.w.ExecContext(ctx, c.d.Rebind(q))
	return err
}

// inTx runs fn in a transaction: a new one (run again, up to maxAttempts
// times, after a retryable failure), or, when c is bound to one already,
// a savepoint in it, so that fn's failure undoes only fn's writes.
func (c *conn) inTx(ctx context.Context, step string, fn func(c *conn) error) error {
	if c.tx != nil {
		return c.savepoint(ctx, step, fn)
	}
	var err error
	for range maxAttempts {
		if err = c.runTx(ctx, step, fn); err == nil || !c.d.IsRetryable(err) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

func (c *conn) runTx(ctx context.Context, step string, fn func(c *conn) error) error {
	tx, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		return c.classify(step+": begin", err)
	}
	defer tx.Rollback()
	var committed []func()
	if err := fn(&conn{d: c.d, w: tx, r: tx, tx: tx, now: c.now, n: c.n, committed: &committed}); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return c.classify(step+": commit", err)
	}
	for _, f := range committed {
		f()
	}
	return nil
}

func (c *conn) savepoint(ctx context.Context, step string, fn func(c *conn) error) error {
	inner := *c
	inner.depth++
	sp := "sp" + strconv.Itoa(inner.depth)
	if _, err := c.tx.ExecContext(ctx, "SAVEPOINT "+sp); err != nil {
		return c.classify(step+": savepoint", err)
	}
	if err := fn(&inner); err != nil {
		if _, rerr := c.tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+sp); rerr != nil {
			return errors.Join(err, c.classify(step+": roll back to savepoint", rerr))
		}
		return err
	}
	if _, err := c.tx.ExecContext(ctx, "RELEASE SAVEPOINT "+sp); err != nil {
		return c.classify(step+": release savepoint", err)
	}
	return nil
}

// classify wraps a driver error with the step and the model sentinel it
// stands for.
func (c *conn) classify(step string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%s: %s: %w", c.d.Name(), step, model.ErrNotFound)
	}
	if kind := c.d.Classify(err); kind != nil {
		return fmt.Errorf("%s: %s: %w: %w", c.d.Name(), step, kind, err)
	}
	return fmt.Errorf("%s: %s: %w", c.d.Name(), step, err)
}

// errorf formats an error of step with the dialect's prefix.
func (c *conn) errorf(format string, args ...any) error {
	return fmt.Errorf(c.d.Name()+": "+format, args...)
}

// affected turns a write that touched no row into ErrNotFound (or the
// error notFound returns).
func (c *conn) affected(step string, res sql.Result, err error) error {
	if err != nil {
		return c.classify(step, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return c.classify(step, err)
	}
	if n == 0 {
		return c.errorf("%s: %w", step, model.ErrNotFound)
	}
	return nil
}

// collect reads every row of a query on c's readers with scan.
func collect[T any](ctx context.Context, c *conn, step string, scan func(scanner) (T, error), query string, args ...any) ([]T, error) {
	rows, err := c.read(ctx, query, args...)
	if err != nil {
		return nil, c.classify(step, err)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, c.classify(step, err)
		}
		out = append(out, v)
	}
	return out, c.classify(step, rows.Err())
}

// in returns "?, ?, …" for n values.
func in(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// doneStates are the operation states that end an operation.
var doneStates = []any{string(model.OpSucceeded), string(model.OpFailed), string(model.OpCancelled)}
