// Package sqlite opens the store (internal/store/sqlstore) on an embedded
// SQLite file (pure Go, modernc.org/sqlite), for single-host installations
// such as `airlock up`. What is SQLite's own lives here: how the file is
// opened, the migrations (migrations/*.sql) and the Dialect.
//
// The database runs in WAL mode. All writes go through one connection, so
// writers queue in Go instead of failing with SQLITE_BUSY; reads use a
// separate pool and never block on writers. Timestamps are TEXT in a
// fixed-width UTC layout with nanoseconds, so that text order is time
// order. The schema is migrated on Open.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store/sqlstore"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Store is the store opened on a SQLite file.
type Store = sqlstore.Store

// Open opens (creating if needed) the database file at path and migrates it
// (opts: sqlstore.WithClock).
// path must name a file; in-memory databases are not supported because the
// reader and writer pools must share it.
func Open(ctx context.Context, path string, opts ...sqlstore.Option) (*Store, error) {
	if path == "" || strings.Contains(path, "?") || strings.HasPrefix(path, ":memory:") {
		return nil, model.Errorf(model.ErrInvalid, "sqlite: open: path %q must be a plain file name", path)
	}
	// The file holds key hashes and the signing key: owner-only, and SQLite
	// gives its -wal and -shm files the same mode.
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("sqlite: open: make directory: %w", err)
	}
	if f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600); err != nil {
		return nil, fmt.Errorf("sqlite: open: create %s: %w", path, err)
	} else {
		f.Close()
	}
	const common = "_busy_timeout=10000&_foreign_keys=1&_synchronous=NORMAL"
	w, err := sql.Open("sqlite", path+"?"+common+"&_journal_mode=WAL&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("sqlite: open writer: %w", err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	// The writer connection sets WAL mode (persistent in the file) before
	// any reader opens.
	if err := w.PingContext(ctx); err != nil {
		w.Close()
		return nil, fmt.Errorf("sqlite: open writer %s: %w", path, err)
	}
	r, err := sql.Open("sqlite", path+"?"+common+"&_query_only=1")
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("sqlite: open readers: %w", err)
	}
	r.SetMaxOpenConns(8)
	r.SetMaxIdleConns(8)
	sub, _ := fs.Sub(migrations, "migrations")
	key, err := filepath.Abs(path)
	if err != nil {
		key = path
	}
	// One process serves a SQLite file: other stores of this process on
	// the same file hear of its event appends.
	cfg := sqlstore.Config{Dialect: Dialect{}, Writer: w, Reader: r, Migrations: sub, Notifier: sqlstore.LocalNotifier(key)}
	for _, o := range opts {
		o(&cfg)
	}
	s, err := sqlstore.New(ctx, cfg)
	if err != nil {
		r.Close()
		w.Close()
		return nil, err
	}
	return s, nil
}

// Dialect is SQLite's sqlstore.Dialect.
type Dialect struct{}

var _ sqlstore.Dialect = Dialect{}

// timeLayout is fixed-width so that text order equals time order.
const timeLayout = "2006-01-02T15:04:05.000000000Z"

func (Dialect) Name() string           { return "sqlite" }
func (Dialect) Rebind(q string) string { return q }

// Time is fixed-width UTC text with nanoseconds.
func (Dialect) Time(t time.Time) any { return t.UTC().Format(timeLayout) }

// Greatest is SQLite's scalar max.
func (Dialect) Greatest(a, b string) string { return "max(" + a + ", " + b + ")" }

// JSONContains matches each pair through json_each.
func (Dialect) JSONContains(col string, kv map[string]string) (string, []any, error) {
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	conds := make([]string, len(keys))
	args := make([]any, 0, 2*len(keys))
	for i, k := range keys {
		conds[i] = `EXISTS (SELECT 1 FROM json_each(` + col + `) AS m WHERE m.key = ? AND m.type = 'text' AND m.value = ?)`
		args = append(args, k, kv[k])
	}
	return strings.Join(conds, " AND "), args, nil
}

func (Dialect) Classify(err error) error {
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() {
		case sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY, sqlite3.SQLITE_CONSTRAINT_UNIQUE:
			return model.ErrConflict
		case sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY, sqlite3.SQLITE_CONSTRAINT_NOTNULL, sqlite3.SQLITE_CONSTRAINT_CHECK:
			return model.ErrInvalid
		}
	}
	return nil
}

func (Dialect) IsUniqueViolation(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) &&
		(se.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY || se.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE)
}

// IsRetryable is false: one writer connection, and busy_timeout absorbs
// other processes' writers.
func (Dialect) IsRetryable(error) bool { return false }

// Lock is never needed: every write goes through the one writer
// connection, in transactions that begin IMMEDIATE.
func (Dialect) Lock(sqlstore.Lock) string { return "" }

func (Dialect) MigrationsTable() string {
	return `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER PRIMARY KEY,
		applied_at TEXT NOT NULL)`
}
