// Package sqlite implements store.Store on an embedded SQLite file (pure Go,
// modernc.org/sqlite), for single-host installations such as `airlock up`.
//
// The database runs in WAL mode. All writes go through one connection, so
// writers queue in Go instead of failing with SQLITE_BUSY; reads use a
// separate pool and never block on writers. The schema is migrated on Open
// from the SQL files embedded in this package.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
)

//go:embed migrations/*.sql
var migrations embed.FS

// timeLayout is fixed-width so that text order equals time order.
const timeLayout = "2006-01-02T15:04:05.000000000Z"

// defaultLimit caps a page when the caller does not.
const defaultLimit = 100

// Store is the SQLite store. It is safe for concurrent use.
type Store struct {
	w *sql.DB // the one writer connection
	r *sql.DB // readers
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the database file at path and migrates it.
// path must name a file; in-memory databases are not supported because the
// reader and writer pools must share it.
func Open(ctx context.Context, path string) (*Store, error) {
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
	s := &Store{w: w, r: r}
	if err := s.migrate(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Close closes both pools.
func (s *Store) Close() error {
	return errors.Join(s.r.Close(), s.w.Close())
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.r.PingContext(ctx); err != nil {
		return fmt.Errorf("sqlite: ping: %w", err)
	}
	return nil
}

func (s *Store) migrate(ctx context.Context) error {
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return fmt.Errorf("sqlite: list migrations: %w", err)
	}
	sort.Strings(names)
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlite: migrate: begin: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER PRIMARY KEY,
		applied_at TEXT NOT NULL)`); err != nil {
		return fmt.Errorf("sqlite: migrate: create schema_migrations: %w", err)
	}
	for _, name := range names {
		base := strings.TrimPrefix(name, "migrations/")
		version, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
		if err != nil {
			return fmt.Errorf("sqlite: migrate: bad migration name %s: %w", base, err)
		}
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM schema_migrations WHERE version = ?`, version).Scan(&n); err != nil {
			return fmt.Errorf("sqlite: migrate: read schema_migrations: %w", err)
		}
		if n > 0 {
			continue
		}
		body, err := migrations.ReadFile(name)
		if err != nil {
			return fmt.Errorf("sqlite: migrate: read %s: %w", base, err)
		}
		if _, err := tx.ExecContext(ctx, string(body)); err != nil {
			return fmt.Errorf("sqlite: migrate: apply %s: %w", base, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)`, version, ts(time.Now())); err != nil {
			return fmt.Errorf("sqlite: migrate: record %s: %w", base, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlite: migrate: commit: %w", err)
	}
	return nil
}

// ---- encoding helpers

func ts(t time.Time) string { return t.UTC().Format(timeLayout) }

func tsPtr(t *time.Time) any {
	if t == nil {
		return nil
	}
	return ts(*t)
}

func parseTS(s string) (time.Time, error) {
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

// classify maps driver errors to model sentinels.
func classify(step string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("sqlite: %s: %w", step, model.ErrNotFound)
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() {
		case sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY, sqlite3.SQLITE_CONSTRAINT_UNIQUE:
			return fmt.Errorf("sqlite: %s: %w: %w", step, model.ErrConflict, err)
		case sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY, sqlite3.SQLITE_CONSTRAINT_NOTNULL, sqlite3.SQLITE_CONSTRAINT_CHECK:
			return fmt.Errorf("sqlite: %s: %w: %w", step, model.ErrInvalid, err)
		}
	}
	return fmt.Errorf("sqlite: %s: %w", step, err)
}

// querier is what *sql.DB and *sql.Tx share.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

type scanner interface{ Scan(dest ...any) error }

// inTx runs fn in a write transaction on the writer connection.
func (s *Store) inTx(ctx context.Context, step string, fn func(tx *sql.Tx) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return classify(step+": begin", err)
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return classify(step+": commit", err)
	}
	return nil
}

// ---- orgs and keys

// CreateOrg inserts an org; ErrConflict if the id exists.
func (s *Store) CreateOrg(ctx context.Context, org model.Org) error {
	features, err := toJSON(org.Features)
	if err != nil {
		return fmt.Errorf("sqlite: create org %s: %w", org.ID, err)
	}
	quotas, err := toJSON(org.Quotas)
	if err != nil {
		return fmt.Errorf("sqlite: create org %s: %w", org.ID, err)
	}
	_, err = s.w.ExecContext(ctx, `INSERT INTO orgs (`+orgCols+`) VALUES (?, ?, ?, ?, ?, ?)`,
		org.ID, org.Name, ts(org.CreatedAt), features, org.IdleSuspendS, quotas)
	return classify("create org "+org.ID, err)
}

// UpdateOrg writes the org's name, features, idle setting and quotas;
// ErrNotFound if it does not exist.
func (s *Store) UpdateOrg(ctx context.Context, org model.Org) error {
	features, err := toJSON(org.Features)
	if err != nil {
		return fmt.Errorf("sqlite: update org %s: %w", org.ID, err)
	}
	quotas, err := toJSON(org.Quotas)
	if err != nil {
		return fmt.Errorf("sqlite: update org %s: %w", org.ID, err)
	}
	res, err := s.w.ExecContext(ctx, `UPDATE orgs SET name = ?, features = ?, idle_suspend_s = ?, quotas = ? WHERE id = ?`,
		org.Name, features, org.IdleSuspendS, quotas, org.ID)
	if err != nil {
		return classify("update org "+org.ID, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return classify("update org "+org.ID, err)
	} else if n == 0 {
		return fmt.Errorf("sqlite: update org %s: %w", org.ID, model.ErrNotFound)
	}
	return nil
}

const orgCols = `id, name, created_at, features, idle_suspend_s, quotas`

func scanOrg(sc scanner) (model.Org, error) {
	var o model.Org
	var created, features, quotas string
	var idle sql.NullInt64
	if err := sc.Scan(&o.ID, &o.Name, &created, &features, &idle, &quotas); err != nil {
		return o, err
	}
	if idle.Valid {
		v := idle.Int64
		o.IdleSuspendS = &v
	}
	var err error
	o.CreatedAt, err = parseTS(created)
	return o, errors.Join(err, fromJSON(features, &o.Features), fromJSON(quotas, &o.Quotas))
}

// GetOrg returns one org.
func (s *Store) GetOrg(ctx context.Context, id string) (model.Org, error) {
	o, err := scanOrg(s.r.QueryRowContext(ctx, `SELECT `+orgCols+` FROM orgs WHERE id = ?`, id))
	return o, classify("get org "+id, err)
}

// ListOrgs returns every org, oldest first.
func (s *Store) ListOrgs(ctx context.Context) ([]model.Org, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+orgCols+` FROM orgs ORDER BY created_at, id`)
	if err != nil {
		return nil, classify("list orgs", err)
	}
	defer rows.Close()
	var out []model.Org
	for rows.Next() {
		o, err := scanOrg(rows)
		if err != nil {
			return nil, classify("list orgs", err)
		}
		out = append(out, o)
	}
	return out, classify("list orgs", rows.Err())
}

// CreateAPIKey inserts a key; ErrConflict if the id or hash exists,
// ErrInvalid if the org does not.
func (s *Store) CreateAPIKey(ctx context.Context, k model.APIKey) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO api_keys (`+apiKeyCols+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		k.ID, k.OrgID, k.Name, k.Prefix, k.Hash, k.Admin, ts(k.CreatedAt), tsPtr(k.ExpiresAt), tsPtr(k.RevokedAt))
	return classify("create api key "+k.ID, err)
}

const apiKeyCols = `id, org_id, name, prefix, hash, admin, created_at, expires_at, revoked_at`

func scanAPIKey(sc scanner) (model.APIKey, error) {
	var k model.APIKey
	var created string
	var expires, revoked sql.NullString
	if err := sc.Scan(&k.ID, &k.OrgID, &k.Name, &k.Prefix, &k.Hash, &k.Admin, &created, &expires, &revoked); err != nil {
		return k, err
	}
	var err error
	if k.CreatedAt, err = parseTS(created); err != nil {
		return k, err
	}
	for _, f := range []struct {
		v   sql.NullString
		dst **time.Time
	}{{expires, &k.ExpiresAt}, {revoked, &k.RevokedAt}} {
		if f.v.Valid {
			t, err := parseTS(f.v.String)
			if err != nil {
				return k, err
			}
			*f.dst = &t
		}
	}
	return k, nil
}

// GetAPIKeyByHash finds a key by the hex sha256 of its secret.
func (s *Store) GetAPIKeyByHash(ctx context.Context, hash string) (model.APIKey, error) {
	k, err := scanAPIKey(s.r.QueryRowContext(ctx, `SELECT `+apiKeyCols+` FROM api_keys WHERE hash = ?`, hash))
	return k, classify("get api key by hash", err)
}

// ListAPIKeys returns every key of orgID, oldest first.
func (s *Store) ListAPIKeys(ctx context.Context, orgID string) ([]model.APIKey, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+apiKeyCols+` FROM api_keys WHERE org_id = ? ORDER BY created_at, id`, orgID)
	if err != nil {
		return nil, classify("list api keys", err)
	}
	defer rows.Close()
	out := []model.APIKey{}
	for rows.Next() {
		k, err := scanAPIKey(rows)
		if err != nil {
			return nil, classify("list api keys", err)
		}
		out = append(out, k)
	}
	return out, classify("list api keys", rows.Err())
}

// RevokeAPIKey marks key id of orgID revoked at at (keeping an earlier
// revocation) and returns it.
func (s *Store) RevokeAPIKey(ctx context.Context, orgID, id string, at time.Time) (model.APIKey, error) {
	k, err := scanAPIKey(s.w.QueryRowContext(ctx, `UPDATE api_keys SET revoked_at = coalesce(revoked_at, ?)
		WHERE org_id = ? AND id = ? RETURNING `+apiKeyCols, ts(at), orgID, id))
	return k, classify("revoke api key "+id, err)
}

// ---- worker credentials

// GetWorkerCredential returns the stored credential of workerID.
func (s *Store) GetWorkerCredential(ctx context.Context, workerID string) (store.WorkerCredential, error) {
	c := store.WorkerCredential{WorkerID: workerID}
	var created, updated string
	err := s.r.QueryRowContext(ctx, `SELECT secret_hash, created_at, updated_at FROM worker_credentials WHERE worker_id = ?`, workerID).
		Scan(&c.SecretHash, &created, &updated)
	if err != nil {
		return c, classify("get worker credential "+workerID, err)
	}
	var e1, e2 error
	c.CreatedAt, e1 = parseTS(created)
	c.UpdatedAt, e2 = parseTS(updated)
	return c, classify("get worker credential "+workerID, errors.Join(e1, e2))
}

// PutWorkerCredential stores c if the stored hash is oldHash ("": none).
func (s *Store) PutWorkerCredential(ctx context.Context, c store.WorkerCredential, oldHash string) error {
	step := "put worker credential " + c.WorkerID
	var res sql.Result
	var err error
	if oldHash == "" {
		res, err = s.w.ExecContext(ctx, `INSERT INTO worker_credentials (worker_id, secret_hash, created_at, updated_at)
			VALUES (?, ?, ?, ?) ON CONFLICT (worker_id) DO NOTHING`, c.WorkerID, c.SecretHash, ts(c.CreatedAt), ts(c.UpdatedAt))
	} else {
		res, err = s.w.ExecContext(ctx, `UPDATE worker_credentials SET secret_hash = ?, updated_at = ?
			WHERE worker_id = ? AND secret_hash = ?`, c.SecretHash, ts(c.UpdatedAt), c.WorkerID, oldHash)
	}
	if err != nil {
		return classify(step, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return classify(step, err)
	} else if n == 0 {
		return fmt.Errorf("sqlite: %s: the stored credential changed: %w", step, model.ErrConflict)
	}
	return nil
}

// DeleteWorkerCredential removes the credential of workerID.
func (s *Store) DeleteWorkerCredential(ctx context.Context, workerID string) error {
	res, err := s.w.ExecContext(ctx, `DELETE FROM worker_credentials WHERE worker_id = ?`, workerID)
	if err != nil {
		return classify("delete worker credential "+workerID, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return classify("delete worker credential "+workerID, err)
	} else if n == 0 {
		return fmt.Errorf("sqlite: delete worker credential %s: %w", workerID, model.ErrNotFound)
	}
	return nil
}

// ---- templates

// PutTemplate upserts name:tag → digest.
func (s *Store) PutTemplate(ctx context.Context, t model.Template) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO templates (name, tag, digest, size_bytes, created_at)
		VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (name, tag) DO UPDATE SET
			digest = excluded.digest, size_bytes = excluded.size_bytes, created_at = excluded.created_at`,
		t.Name, t.Tag, t.Digest, t.SizeBytes, ts(t.CreatedAt))
	return classify("put template "+t.Name+":"+t.Tag, err)
}

const templateCols = `name, tag, digest, size_bytes, created_at`

func scanTemplate(sc scanner) (model.Template, error) {
	var t model.Template
	var created string
	if err := sc.Scan(&t.Name, &t.Tag, &t.Digest, &t.SizeBytes, &created); err != nil {
		return t, err
	}
	var err error
	t.CreatedAt, err = parseTS(created)
	return t, err
}

// GetTemplate looks a template up by name and tag.
func (s *Store) GetTemplate(ctx context.Context, name, tag string) (model.Template, error) {
	t, err := scanTemplate(s.r.QueryRowContext(ctx, `SELECT `+templateCols+` FROM templates WHERE name = ? AND tag = ?`, name, tag))
	return t, classify("get template "+name+":"+tag, err)
}

// GetTemplateByDigest returns the newest name:tag pointing at digest.
func (s *Store) GetTemplateByDigest(ctx context.Context, digest string) (model.Template, error) {
	t, err := scanTemplate(s.r.QueryRowContext(ctx, `SELECT `+templateCols+` FROM templates
		WHERE digest = ? ORDER BY created_at DESC, name, tag LIMIT 1`, digest))
	return t, classify("get template by digest "+digest, err)
}

// ListTemplates returns every template ordered by name, then tag.
func (s *Store) ListTemplates(ctx context.Context) ([]model.Template, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+templateCols+` FROM templates ORDER BY name, tag`)
	if err != nil {
		return nil, classify("list templates", err)
	}
	defer rows.Close()
	var out []model.Template
	for rows.Next() {
		t, err := scanTemplate(rows)
		if err != nil {
			return nil, classify("list templates", err)
		}
		out = append(out, t)
	}
	return out, classify("list templates", rows.Err())
}

// ---- sandboxes

const sandboxCols = `id, org_id, template, template_digest, runtime, state, desired_state, reason,
	worker_id, env, metadata, resources, timeout_s, generation, created_at, updated_at,
	last_activity_at, expires_at, idle_suspend_s, no_auto_wake, snapshot_id, snapshot_bytes, pool, snapshots, public_traffic`

func scanSandbox(sc scanner) (model.Sandbox, error) {
	var sb model.Sandbox
	var env, meta, res, created, updated, activity, snaps string
	var expires sql.NullString
	if err := sc.Scan(&sb.ID, &sb.OrgID, &sb.Template, &sb.TemplateDigest, &sb.Runtime, &sb.State,
		&sb.DesiredState, &sb.Reason, &sb.WorkerID, &env, &meta, &res, &sb.TimeoutS, &sb.Generation,
		&created, &updated, &activity, &expires, &sb.IdleSuspendS, &sb.NoAutoWake, &sb.SnapshotID,
		&sb.SnapshotBytes, &sb.Pool, &snaps, &sb.PublicTraffic); err != nil {
		return sb, err
	}
	var errs []error
	var sn store.SandboxSnapshots
	errs = append(errs, fromJSON(env, &sb.Env), fromJSON(meta, &sb.Metadata), fromJSON(res, &sb.Resources), fromJSON(snaps, &sn))
	sn.Apply(&sb)
	var err error
	sb.CreatedAt, err = parseTS(created)
	errs = append(errs, err)
	sb.UpdatedAt, err = parseTS(updated)
	errs = append(errs, err)
	sb.LastActivityAt, err = parseTS(activity)
	errs = append(errs, err)
	if expires.Valid {
		t, err := parseTS(expires.String)
		errs = append(errs, err)
		sb.ExpiresAt = &t
	}
	return sb, errors.Join(errs...)
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

// idempotent looks up an Idempotency-Key inside tx and, when the org has
// used it before, returns the sandbox and operation it created then.
func idempotent(ctx context.Context, tx *sql.Tx, step, orgID, key string) (model.Sandbox, model.Operation, bool, error) {
	var sbID, opID string
	err := tx.QueryRowContext(ctx, `SELECT sandbox_id, operation_id FROM idempotency_keys
		WHERE org_id = ? AND key = ?`, orgID, key).Scan(&sbID, &opID)
	if errors.Is(err, sql.ErrNoRows) {
		return model.Sandbox{}, model.Operation{}, false, nil
	}
	if err != nil {
		return model.Sandbox{}, model.Operation{}, false, classify(step+": read idempotency key", err)
	}
	sb, err := scanSandbox(tx.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = ?`, sbID))
	if err != nil {
		return model.Sandbox{}, model.Operation{}, false, classify(step+": read idempotent sandbox "+sbID, err)
	}
	op, err := scanOperation(tx.QueryRowContext(ctx, `SELECT `+operationCols+` FROM operations WHERE id = ?`, opID))
	if err != nil {
		return model.Sandbox{}, model.Operation{}, false, classify(step+": read idempotent operation "+opID, err)
	}
	return sb, op, true, nil
}

// CreateSandbox inserts the sandbox, its first operation and the
// idempotency key mapping in one transaction.
func (s *Store) CreateSandbox(ctx context.Context, sb model.Sandbox, op model.Operation, idempotencyKey string) (model.Sandbox, model.Operation, bool, error) {
	var outSB model.Sandbox
	var outOp model.Operation
	var existed bool
	err := s.inTx(ctx, "create sandbox "+sb.ID, func(tx *sql.Tx) error {
		if idempotencyKey != "" {
			var err error
			if outSB, outOp, existed, err = idempotent(ctx, tx, "create sandbox", sb.OrgID, idempotencyKey); err != nil || existed {
				return err
			}
		}
		env, meta, res, snaps, err := sandboxJSON(sb)
		if err != nil {
			return fmt.Errorf("sqlite: create sandbox %s: %w", sb.ID, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO sandboxes (`+sandboxCols+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			sb.ID, sb.OrgID, sb.Template, sb.TemplateDigest, sb.Runtime, sb.State, sb.DesiredState,
			sb.Reason, sb.WorkerID, env, meta, res, sb.TimeoutS, sb.Generation, ts(sb.CreatedAt),
			ts(sb.UpdatedAt), ts(sb.LastActivityAt), tsPtr(sb.ExpiresAt),
			sb.IdleSuspendS, sb.NoAutoWake, sb.SnapshotID, sb.SnapshotBytes, sb.Pool, snaps, sb.PublicTraffic); err != nil {
			return classify("create sandbox "+sb.ID, err)
		}
		if err := insertOperation(ctx, tx, op); err != nil {
			return err
		}
		if idempotencyKey != "" {
			if _, err := tx.ExecContext(ctx, `INSERT INTO idempotency_keys (org_id, key, sandbox_id, operation_id, created_at)
				VALUES (?, ?, ?, ?, ?)`, sb.OrgID, idempotencyKey, sb.ID, op.ID, ts(time.Now())); err != nil {
				return classify("create sandbox: record idempotency key", err)
			}
		}
		if outSB, err = scanSandbox(tx.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = ?`, sb.ID)); err != nil {
			return classify("create sandbox: read back "+sb.ID, err)
		}
		if outOp, err = scanOperation(tx.QueryRowContext(ctx, `SELECT `+operationCols+` FROM operations WHERE id = ?`, op.ID)); err != nil {
			return classify("create sandbox: read back operation "+op.ID, err)
		}
		return nil
	})
	if err != nil {
		return model.Sandbox{}, model.Operation{}, false, err
	}
	return outSB, outOp, existed, nil
}

// GetSandbox returns one sandbox.
func (s *Store) GetSandbox(ctx context.Context, id string) (model.Sandbox, error) {
	sb, err := scanSandbox(s.r.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = ?`, id))
	return sb, classify("get sandbox "+id, err)
}

// cursor is the decoded form of the opaque page cursor.
type cursor struct {
	CreatedAt time.Time `json:"t"`
	ID        string    `json:"id"`
}

func encodeCursor(sb model.Sandbox) string {
	b, _ := json.Marshal(cursor{CreatedAt: sb.CreatedAt.UTC(), ID: sb.ID})
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

// ListSandboxes returns one page of sandboxes matching f, ordered by
// creation time then id, and the cursor of the next page ("" on the last).
// Without States, deleted sandboxes are left out unless IncludeDeleted.
func (s *Store) ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]model.Sandbox, string, error) {
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
		marks := make([]string, len(f.States))
		for i, st := range f.States {
			marks[i] = "?"
			args = append(args, string(st))
		}
		where = append(where, "state IN ("+strings.Join(marks, ", ")+")")
	} else if !f.IncludeDeleted {
		where = append(where, "state <> ?")
		args = append(args, string(model.StateDeleted))
	}
	keys := make([]string, 0, len(f.Metadata))
	for k := range f.Metadata {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		where = append(where, `EXISTS (SELECT 1 FROM json_each(sandboxes.metadata) AS m
			WHERE m.key = ? AND m.type = 'text' AND m.value = ?)`)
		args = append(args, k, f.Metadata[k])
	}
	if f.Cursor != "" {
		c, err := decodeCursor(f.Cursor)
		if err != nil {
			return nil, "", err
		}
		where = append(where, "(created_at > ? OR (created_at = ? AND id > ?))")
		args = append(args, ts(c.CreatedAt), ts(c.CreatedAt), c.ID)
	}
	limit := f.Limit
	if limit <= 0 {
		limit = defaultLimit
	}
	q := `SELECT ` + sandboxCols + ` FROM sandboxes`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY created_at, id LIMIT ?"
	args = append(args, limit+1)
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, "", classify("list sandboxes", err)
	}
	defer rows.Close()
	var out []model.Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, "", classify("list sandboxes", err)
		}
		out = append(out, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, "", classify("list sandboxes", err)
	}
	next := ""
	if len(out) > limit {
		out = out[:limit]
		next = encodeCursor(out[limit-1])
	}
	return out, next, nil
}

// UpdateSandbox writes sb if the stored generation equals sb.Generation.
// ID, OrgID and CreatedAt are never changed.
func (s *Store) UpdateSandbox(ctx context.Context, sb model.Sandbox) (model.Sandbox, error) {
	var out model.Sandbox
	err := s.inTx(ctx, "update sandbox "+sb.ID, func(tx *sql.Tx) error {
		var err error
		out, err = updateSandbox(ctx, tx, sb)
		return err
	})
	return out, err
}

// updateSandbox is the guarded write. LastActivityAt never moves backwards,
// so a stale read cannot undo a TouchSandbox.
func updateSandbox(ctx context.Context, tx *sql.Tx, sb model.Sandbox) (model.Sandbox, error) {
	env, meta, res, snaps, err := sandboxJSON(sb)
	if err != nil {
		return model.Sandbox{}, fmt.Errorf("sqlite: update sandbox %s: %w", sb.ID, err)
	}
	out, err := scanSandbox(tx.QueryRowContext(ctx, `UPDATE sandboxes SET
			template = ?, template_digest = ?, runtime = ?, state = ?, desired_state = ?,
			reason = ?, worker_id = ?, env = ?, metadata = ?, resources = ?, timeout_s = ?,
			generation = generation + 1, updated_at = ?,
			last_activity_at = max(last_activity_at, ?), expires_at = ?,
			idle_suspend_s = ?, no_auto_wake = ?, snapshot_id = ?, snapshot_bytes = ?, pool = ?, snapshots = ?,
			public_traffic = ?
		WHERE id = ? AND generation = ?
		RETURNING `+sandboxCols,
		sb.Template, sb.TemplateDigest, sb.Runtime, sb.State, sb.DesiredState,
		sb.Reason, sb.WorkerID, env, meta, res, sb.TimeoutS,
		ts(time.Now()), ts(sb.LastActivityAt), tsPtr(sb.ExpiresAt),
		sb.IdleSuspendS, sb.NoAutoWake, sb.SnapshotID, sb.SnapshotBytes, sb.Pool, snaps, sb.PublicTraffic,
		sb.ID, sb.Generation))
	if errors.Is(err, sql.ErrNoRows) {
		var gen int64
		err := tx.QueryRowContext(ctx, `SELECT generation FROM sandboxes WHERE id = ?`, sb.ID).Scan(&gen)
		if err != nil {
			return model.Sandbox{}, classify("update sandbox "+sb.ID, err)
		}
		return model.Sandbox{}, fmt.Errorf("sqlite: update sandbox %s: generation %d, stored %d: %w",
			sb.ID, sb.Generation, gen, model.ErrConflict)
	}
	return out, classify("update sandbox "+sb.ID, err)
}

// UpdateSandboxAndOperation does both guarded writes in one transaction.
func (s *Store) UpdateSandboxAndOperation(ctx context.Context, sb model.Sandbox, op model.Operation) (model.Sandbox, model.Operation, error) {
	var outSB model.Sandbox
	var outOp model.Operation
	err := s.inTx(ctx, "update sandbox and operation", func(tx *sql.Tx) error {
		var err error
		if outSB, err = updateSandbox(ctx, tx, sb); err != nil {
			return err
		}
		outOp, err = updateOperation(ctx, tx, op)
		return err
	})
	if err != nil {
		return model.Sandbox{}, model.Operation{}, err
	}
	return outSB, outOp, nil
}

// UpdateSandboxCreateOperation does the guarded sandbox write and inserts
// op in one transaction.
func (s *Store) UpdateSandboxCreateOperation(ctx context.Context, sb model.Sandbox, op model.Operation) (model.Sandbox, model.Operation, error) {
	var outSB model.Sandbox
	var outOp model.Operation
	err := s.inTx(ctx, "update sandbox and create operation", func(tx *sql.Tx) error {
		var err error
		if outSB, err = updateSandbox(ctx, tx, sb); err != nil {
			return err
		}
		if err := insertOperation(ctx, tx, op); err != nil {
			return err
		}
		outOp, err = scanOperation(tx.QueryRowContext(ctx, `SELECT `+operationCols+` FROM operations WHERE id = ?`, op.ID))
		return classify("read back operation "+op.ID, err)
	})
	if err != nil {
		return model.Sandbox{}, model.Operation{}, err
	}
	return outSB, outOp, nil
}

// TouchSandbox moves LastActivityAt forward to at without bumping the
// generation.
func (s *Store) TouchSandbox(ctx context.Context, id string, at time.Time) error {
	res, err := s.w.ExecContext(ctx, `UPDATE sandboxes SET last_activity_at = max(last_activity_at, ?) WHERE id = ?`, ts(at), id)
	if err != nil {
		return classify("touch sandbox "+id, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return classify("touch sandbox "+id, err)
	} else if n == 0 {
		return fmt.Errorf("sqlite: touch sandbox %s: %w", id, model.ErrNotFound)
	}
	return nil
}

// ---- operations

const operationCols = `id, org_id, sandbox_id, kind, state, target, reason, created_at, updated_at, deadline`

func scanOperation(sc scanner) (model.Operation, error) {
	var op model.Operation
	var created, updated, deadline string
	if err := sc.Scan(&op.ID, &op.OrgID, &op.SandboxID, &op.Kind, &op.State, &op.Target, &op.Reason,
		&created, &updated, &deadline); err != nil {
		return op, err
	}
	var e1, e2, e3 error
	op.CreatedAt, e1 = parseTS(created)
	op.UpdatedAt, e2 = parseTS(updated)
	op.Deadline, e3 = parseTS(deadline)
	return op, errors.Join(e1, e2, e3)
}

func insertOperation(ctx context.Context, q querier, op model.Operation) error {
	_, err := q.ExecContext(ctx, `INSERT INTO operations (`+operationCols+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		op.ID, op.OrgID, op.SandboxID, op.Kind, op.State, op.Target, op.Reason,
		ts(op.CreatedAt), ts(op.UpdatedAt), ts(op.Deadline))
	return classify("create operation "+op.ID, err)
}

// CreateOperation inserts an operation; ErrInvalid if its sandbox does not
// exist, ErrConflict if the id does.
func (s *Store) CreateOperation(ctx context.Context, op model.Operation) error {
	return insertOperation(ctx, s.w, op)
}

// GetOperation returns one operation.
func (s *Store) GetOperation(ctx context.Context, id string) (model.Operation, error) {
	op, err := scanOperation(s.r.QueryRowContext(ctx, `SELECT `+operationCols+` FROM operations WHERE id = ?`, id))
	return op, classify("get operation "+id, err)
}

// UpdateOperation writes op's state, target, reason and deadline (and
// UpdatedAt=now) if the stored operation is not Done.
func (s *Store) UpdateOperation(ctx context.Context, op model.Operation) (model.Operation, error) {
	var out model.Operation
	err := s.inTx(ctx, "update operation "+op.ID, func(tx *sql.Tx) error {
		var err error
		out, err = updateOperation(ctx, tx, op)
		return err
	})
	return out, err
}

func updateOperation(ctx context.Context, tx *sql.Tx, op model.Operation) (model.Operation, error) {
	out, err := scanOperation(tx.QueryRowContext(ctx, `UPDATE operations SET
			state = ?, target = ?, reason = ?, deadline = ?, updated_at = ?
		WHERE id = ? AND state NOT IN (?, ?, ?)
		RETURNING `+operationCols,
		op.State, op.Target, op.Reason, ts(op.Deadline), ts(time.Now()),
		op.ID, model.OpSucceeded, model.OpFailed, model.OpCancelled))
	if errors.Is(err, sql.ErrNoRows) {
		var state string
		err := tx.QueryRowContext(ctx, `SELECT state FROM operations WHERE id = ?`, op.ID).Scan(&state)
		if err != nil {
			return model.Operation{}, classify("update operation "+op.ID, err)
		}
		return model.Operation{}, fmt.Errorf("sqlite: update operation %s: already %s: %w", op.ID, state, model.ErrConflict)
	}
	return out, classify("update operation "+op.ID, err)
}

// ListOperations returns the operations of f.SandboxID (only open ones if
// f.Open), or, without a sandbox, every open operation; oldest first.
func (s *Store) ListOperations(ctx context.Context, f store.OperationFilter) ([]model.Operation, error) {
	var where []string
	var args []any
	if f.SandboxID != "" {
		where = append(where, "sandbox_id = ?")
		args = append(args, f.SandboxID)
	}
	if f.Open || f.SandboxID == "" {
		where = append(where, "state NOT IN (?, ?, ?)")
		args = append(args, model.OpSucceeded, model.OpFailed, model.OpCancelled)
	}
	q := `SELECT ` + operationCols + ` FROM operations WHERE ` + strings.Join(where, " AND ") + ` ORDER BY created_at, id`
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, classify("list operations", err)
	}
	defer rows.Close()
	var out []model.Operation
	for rows.Next() {
		op, err := scanOperation(rows)
		if err != nil {
			return nil, classify("list operations", err)
		}
		out = append(out, op)
	}
	return out, classify("list operations", rows.Err())
}

// ---- workers

// UpsertWorker inserts or replaces a worker, keeping its first CreatedAt.
func (s *Store) UpsertWorker(ctx context.Context, w model.Worker) error {
	rt, err := toJSON(w.Runtimes)
	if err != nil {
		return fmt.Errorf("sqlite: upsert worker %s: %w", w.ID, err)
	}
	tpl, err := toJSON(w.Templates)
	if err != nil {
		return fmt.Errorf("sqlite: upsert worker %s: %w", w.ID, err)
	}
	_, err = s.w.ExecContext(ctx, `INSERT INTO workers (`+workerCols+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET
			data_plane_url = excluded.data_plane_url, internal_url = excluded.internal_url,
			runtimes = excluded.runtimes, templates = excluded.templates,
			capacity_mib = excluded.capacity_mib, capacity_vcpus = excluded.capacity_vcpus,
			last_heartbeat = excluded.last_heartbeat`,
		w.ID, w.DataPlaneURL, w.InternalURL, rt, tpl, w.CapacityMiB, w.CapacityVCPUs,
		ts(w.LastHeartbeat), ts(w.CreatedAt))
	return classify("upsert worker "+w.ID, err)
}

const workerCols = `id, data_plane_url, internal_url, runtimes, templates, capacity_mib, capacity_vcpus, last_heartbeat, created_at`

func scanWorker(sc scanner) (model.Worker, error) {
	var w model.Worker
	var rt, tpl, hb, created string
	if err := sc.Scan(&w.ID, &w.DataPlaneURL, &w.InternalURL, &rt, &tpl, &w.CapacityMiB, &w.CapacityVCPUs, &hb, &created); err != nil {
		return w, err
	}
	var e3, e4 error
	w.LastHeartbeat, e3 = parseTS(hb)
	w.CreatedAt, e4 = parseTS(created)
	return w, errors.Join(fromJSON(rt, &w.Runtimes), fromJSON(tpl, &w.Templates), e3, e4)
}

// GetWorker returns one worker.
func (s *Store) GetWorker(ctx context.Context, id string) (model.Worker, error) {
	w, err := scanWorker(s.r.QueryRowContext(ctx, `SELECT `+workerCols+` FROM workers WHERE id = ?`, id))
	return w, classify("get worker "+id, err)
}

// ListWorkers returns every worker ordered by id.
func (s *Store) ListWorkers(ctx context.Context) ([]model.Worker, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+workerCols+` FROM workers ORDER BY id`)
	if err != nil {
		return nil, classify("list workers", err)
	}
	defer rows.Close()
	var out []model.Worker
	for rows.Next() {
		w, err := scanWorker(rows)
		if err != nil {
			return nil, classify("list workers", err)
		}
		out = append(out, w)
	}
	return out, classify("list workers", rows.Err())
}

// ---- events

// AppendEvent stores ev with the next Seq (and Time=now if unset) and
// returns it.
func (s *Store) AppendEvent(ctx context.Context, ev model.Event) (model.Event, error) {
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	ev.Time = ev.Time.UTC()
	err := s.w.QueryRowContext(ctx, `INSERT INTO events (org_id, sandbox_id, operation_id, type, data, time)
		VALUES (?, ?, ?, ?, ?, ?) RETURNING seq`,
		ev.OrgID, ev.SandboxID, ev.OperationID, ev.Type, string(ev.Data), ts(ev.Time)).Scan(&ev.Seq)
	if err != nil {
		return model.Event{}, classify("append event", err)
	}
	return ev, nil
}

// ListEvents returns events with Seq > afterSeq, oldest first, at most limit
// (0 means 100).
func (s *Store) ListEvents(ctx context.Context, orgID, sandboxID string, afterSeq int64, limit int) ([]model.Event, error) {
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
	rows, err := s.r.QueryContext(ctx, `SELECT seq, org_id, sandbox_id, operation_id, type, data, time
		FROM events WHERE `+strings.Join(where, " AND ")+` ORDER BY seq LIMIT ?`, args...)
	if err != nil {
		return nil, classify("list events", err)
	}
	defer rows.Close()
	var out []model.Event
	for rows.Next() {
		var ev model.Event
		var data, at string
		if err := rows.Scan(&ev.Seq, &ev.OrgID, &ev.SandboxID, &ev.OperationID, &ev.Type, &data, &at); err != nil {
			return nil, classify("list events", err)
		}
		if data != "" {
			ev.Data = json.RawMessage(data)
		}
		if ev.Time, err = parseTS(at); err != nil {
			return nil, classify("list events", err)
		}
		out = append(out, ev)
	}
	return out, classify("list events", rows.Err())
}

// ---- settings

// PutSettingIfAbsent stores value only if key is unset and returns the value
// now stored.
func (s *Store) PutSettingIfAbsent(ctx context.Context, key, value string) (string, error) {
	var stored string
	err := s.inTx(ctx, "put setting "+key, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING`, key, value); err != nil {
			return classify("put setting "+key, err)
		}
		return classify("put setting "+key, tx.QueryRowContext(ctx, `SELECT value FROM settings WHERE key = ?`, key).Scan(&stored))
	})
	return stored, err
}

// SwapSetting replaces key's value old with value.
func (s *Store) SwapSetting(ctx context.Context, key, old, value string) error {
	return s.inTx(ctx, "swap setting "+key, func(tx *sql.Tx) error {
		var stored string
		if err := tx.QueryRowContext(ctx, `SELECT value FROM settings WHERE key = ?`, key).Scan(&stored); err != nil {
			return classify("swap setting "+key, err)
		}
		if stored != old {
			return fmt.Errorf("sqlite: swap setting %s: the stored value changed: %w", key, model.ErrConflict)
		}
		_, err := tx.ExecContext(ctx, `UPDATE settings SET value = ? WHERE key = ?`, value, key)
		return classify("swap setting "+key, err)
	})
}

// ---- warm pools

// ClaimSandbox hands a pool member to sb.OrgID: see store.Store.
func (s *Store) ClaimSandbox(ctx context.Context, sb model.Sandbox, op model.Operation, idempotencyKey string) (model.Sandbox, model.Operation, bool, error) {
	var outSB model.Sandbox
	var outOp model.Operation
	var existed bool
	err := s.inTx(ctx, "claim sandbox "+sb.ID, func(tx *sql.Tx) error {
		if idempotencyKey != "" {
			var err error
			if outSB, outOp, existed, err = idempotent(ctx, tx, "claim sandbox", sb.OrgID, idempotencyKey); err != nil || existed {
				return err
			}
		}
		res, err := tx.ExecContext(ctx, `UPDATE sandboxes SET org_id = ? WHERE id = ? AND generation = ? AND pool != ''`,
			sb.OrgID, sb.ID, sb.Generation)
		if err != nil {
			return classify("claim sandbox "+sb.ID, err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return classify("claim sandbox "+sb.ID, err)
		} else if n == 0 {
			return fmt.Errorf("sqlite: claim sandbox %s: not a pool member at generation %d: %w", sb.ID, sb.Generation, model.ErrConflict)
		}
		if outSB, err = updateSandbox(ctx, tx, sb); err != nil {
			return err
		}
		if err := insertOperation(ctx, tx, op); err != nil {
			return err
		}
		if idempotencyKey != "" {
			if _, err := tx.ExecContext(ctx, `INSERT INTO idempotency_keys (org_id, key, sandbox_id, operation_id, created_at)
				VALUES (?, ?, ?, ?, ?)`, sb.OrgID, idempotencyKey, sb.ID, op.ID, ts(time.Now())); err != nil {
				return classify("claim sandbox: record idempotency key", err)
			}
		}
		outOp, err = scanOperation(tx.QueryRowContext(ctx, `SELECT `+operationCols+` FROM operations WHERE id = ?`, op.ID))
		return classify("claim sandbox: read back operation "+op.ID, err)
	})
	if err != nil {
		return model.Sandbox{}, model.Operation{}, false, err
	}
	return outSB, outOp, existed, nil
}

// PutPool upserts a pool by digest.
func (s *Store) PutPool(ctx context.Context, p model.Pool) error {
	res, err := toJSON(p.Resources)
	if err != nil {
		return fmt.Errorf("sqlite: put pool %s: %w", p.Digest, err)
	}
	_, err = s.w.ExecContext(ctx, `INSERT INTO pools (digest, template, size, resources, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (digest) DO UPDATE SET template = excluded.template, size = excluded.size,
			resources = excluded.resources, updated_at = excluded.updated_at`,
		p.Digest, p.Template, p.Size, res, ts(p.CreatedAt), ts(p.UpdatedAt))
	return classify("put pool "+p.Digest, err)
}

// ListPools returns every pool, ordered by template.
func (s *Store) ListPools(ctx context.Context) ([]model.Pool, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT digest, template, size, resources, created_at, updated_at FROM pools ORDER BY template, digest`)
	if err != nil {
		return nil, classify("list pools", err)
	}
	defer rows.Close()
	var out []model.Pool
	for rows.Next() {
		var p model.Pool
		var res, created, updated string
		if err := rows.Scan(&p.Digest, &p.Template, &p.Size, &res, &created, &updated); err != nil {
			return nil, classify("list pools", err)
		}
		if err := fromJSON(res, &p.Resources); err != nil {
			return nil, fmt.Errorf("sqlite: list pools: %w", err)
		}
		if p.CreatedAt, err = parseTS(created); err != nil {
			return nil, fmt.Errorf("sqlite: list pools: %w", err)
		}
		if p.UpdatedAt, err = parseTS(updated); err != nil {
			return nil, fmt.Errorf("sqlite: list pools: %w", err)
		}
		out = append(out, p)
	}
	return out, classify("list pools", rows.Err())
}

// DeletePool removes a pool's configuration.
func (s *Store) DeletePool(ctx context.Context, digest string) error {
	res, err := s.w.ExecContext(ctx, `DELETE FROM pools WHERE digest = ?`, digest)
	if err != nil {
		return classify("delete pool "+digest, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return classify("delete pool "+digest, err)
	} else if n == 0 {
		return fmt.Errorf("sqlite: delete pool %s: %w", digest, model.ErrNotFound)
	}
	return nil
}
