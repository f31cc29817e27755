// Package postgres implements store.Store on PostgreSQL (pgx/v5, pgxpool),
// for installations that run several servers against one database.
//
// The schema is migrated on Open from the SQL files embedded in this package,
// under an advisory lock so that servers starting together do not race.
// Event appends are serialized with a transaction-scoped advisory lock, so a
// reader that has seen Seq n never later finds a committed event below n.
package postgres

import (
	"context"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Advisory lock keys (arbitrary, fixed).
const (
	lockMigrate int64 = 0x6169726c6f636b01 // "airlock" + 1
	lockEvents  int64 = 0x6169726c6f636b02
)

// defaultLimit caps a page when the caller does not.
const defaultLimit = 100

// Store is the PostgreSQL store. It is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
}

var _ store.Store = (*Store)(nil)

// Open connects to the database at url (a postgres:// URL or key=value DSN)
// and migrates it.
func Open(ctx context.Context, url string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, model.Errorf(model.ErrInvalid, "postgres: parse url: %v", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: connect: %w", err)
	}
	s := &Store{pool: pool}
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the pool.
func (s *Store) Close() error {
	s.pool.Close()
	return nil
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("postgres: ping: %w", err)
	}
	return nil
}

func (s *Store) migrate(ctx context.Context) error {
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return fmt.Errorf("postgres: list migrations: %w", err)
	}
	sort.Strings(names)
	return s.inTx(ctx, "migrate", func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockMigrate); err != nil {
			return fmt.Errorf("postgres: migrate: lock: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version    integer PRIMARY KEY,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return fmt.Errorf("postgres: migrate: create schema_migrations: %w", err)
		}
		for _, name := range names {
			base := strings.TrimPrefix(name, "migrations/")
			version, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
			if err != nil {
				return fmt.Errorf("postgres: migrate: bad migration name %s: %w", base, err)
			}
			var applied bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version = $1)`, version).Scan(&applied); err != nil {
				return fmt.Errorf("postgres: migrate: read schema_migrations: %w", err)
			}
			if applied {
				continue
			}
			body, err := migrations.ReadFile(name)
			if err != nil {
				return fmt.Errorf("postgres: migrate: read %s: %w", base, err)
			}
			// No arguments: the simple protocol runs every statement in the file.
			if _, err := tx.Exec(ctx, string(body)); err != nil {
				return fmt.Errorf("postgres: migrate: apply %s: %w", base, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version) VALUES ($1)`, version); err != nil {
				return fmt.Errorf("postgres: migrate: record %s: %w", base, err)
			}
		}
		return nil
	})
}

// ---- helpers

func utc(t time.Time) time.Time { return t.UTC() }

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
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("postgres: %s: %w", step, model.ErrNotFound)
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "23505": // unique_violation
			return fmt.Errorf("postgres: %s: %w: %w", step, model.ErrConflict, err)
		case "23503", "23502", "23514", "22P02", "22001": // fk, not null, check, bad text, too long
			return fmt.Errorf("postgres: %s: %w: %w", step, model.ErrInvalid, err)
		}
	}
	return fmt.Errorf("postgres: %s: %w", step, err)
}

func isUniqueViolation(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}

// querier is what *pgxpool.Pool and pgx.Tx share.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

type scanner interface{ Scan(dest ...any) error }

// inTx runs fn in a read-committed transaction.
func (s *Store) inTx(ctx context.Context, step string, fn func(tx pgx.Tx) error) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return classify(step+": begin", err)
	}
	defer tx.Rollback(ctx)
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return classify(step+": commit", err)
	}
	return nil
}

// collect reads every row with scan.
func collect[T any](rows pgx.Rows, scan func(scanner) (T, error)) ([]T, error) {
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// ---- orgs and keys

// CreateOrg inserts an org; ErrConflict if the id exists.
func (s *Store) CreateOrg(ctx context.Context, org model.Org) error {
	features, err := toJSON(org.Features)
	if err != nil {
		return fmt.Errorf("postgres: create org %s: %w", org.ID, err)
	}
	quotas, err := toJSON(org.Quotas)
	if err != nil {
		return fmt.Errorf("postgres: create org %s: %w", org.ID, err)
	}
	_, err = s.pool.Exec(ctx, `INSERT INTO orgs (`+orgCols+`) VALUES ($1, $2, $3, $4, $5, $6)`,
		org.ID, org.Name, org.CreatedAt, features, org.IdleSuspendS, quotas)
	return classify("create org "+org.ID, err)
}

// UpdateOrg writes the org's name, features, idle setting and quotas;
// ErrNotFound if it does not exist.
func (s *Store) UpdateOrg(ctx context.Context, org model.Org) error {
	features, err := toJSON(org.Features)
	if err != nil {
		return fmt.Errorf("postgres: update org %s: %w", org.ID, err)
	}
	quotas, err := toJSON(org.Quotas)
	if err != nil {
		return fmt.Errorf("postgres: update org %s: %w", org.ID, err)
	}
	tag, err := s.pool.Exec(ctx, `UPDATE orgs SET name = $1, features = $2, idle_suspend_s = $3, quotas = $4 WHERE id = $5`,
		org.Name, features, org.IdleSuspendS, quotas, org.ID)
	if err != nil {
		return classify("update org "+org.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("postgres: update org %s: %w", org.ID, model.ErrNotFound)
	}
	return nil
}

const orgCols = `id, name, created_at, features, idle_suspend_s, quotas`

func scanOrg(sc scanner) (model.Org, error) {
	var o model.Org
	var features, quotas string
	err := sc.Scan(&o.ID, &o.Name, &o.CreatedAt, &features, &o.IdleSuspendS, &quotas)
	if err != nil {
		return o, err
	}
	o.CreatedAt = utc(o.CreatedAt)
	return o, errors.Join(fromJSON(features, &o.Features), fromJSON(quotas, &o.Quotas))
}

// GetOrg returns one org.
func (s *Store) GetOrg(ctx context.Context, id string) (model.Org, error) {
	o, err := scanOrg(s.pool.QueryRow(ctx, `SELECT `+orgCols+` FROM orgs WHERE id = $1`, id))
	return o, classify("get org "+id, err)
}

// ListOrgs returns every org, oldest first.
func (s *Store) ListOrgs(ctx context.Context) ([]model.Org, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+orgCols+` FROM orgs ORDER BY created_at, id`)
	if err != nil {
		return nil, classify("list orgs", err)
	}
	out, err := collect(rows, scanOrg)
	return out, classify("list orgs", err)
}

// CreateAPIKey inserts a key; ErrConflict if the id or hash exists,
// ErrInvalid if the org does not.
func (s *Store) CreateAPIKey(ctx context.Context, k model.APIKey) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO api_keys (`+apiKeyCols+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		k.ID, k.OrgID, k.Name, k.Prefix, k.Hash, k.Admin, k.CreatedAt, k.ExpiresAt, k.RevokedAt)
	return classify("create api key "+k.ID, err)
}

const apiKeyCols = `id, org_id, name, prefix, hash, admin, created_at, expires_at, revoked_at`

func scanAPIKey(sc scanner) (model.APIKey, error) {
	var k model.APIKey
	if err := sc.Scan(&k.ID, &k.OrgID, &k.Name, &k.Prefix, &k.Hash, &k.Admin, &k.CreatedAt, &k.ExpiresAt, &k.RevokedAt); err != nil {
		return k, err
	}
	k.CreatedAt = utc(k.CreatedAt)
	for _, p := range []**time.Time{&k.ExpiresAt, &k.RevokedAt} {
		if *p != nil {
			t := utc(**p)
			*p = &t
		}
	}
	return k, nil
}

// GetAPIKeyByHash finds a key by the hex sha256 of its secret.
func (s *Store) GetAPIKeyByHash(ctx context.Context, hash string) (model.APIKey, error) {
	k, err := scanAPIKey(s.pool.QueryRow(ctx, `SELECT `+apiKeyCols+` FROM api_keys WHERE hash = $1`, hash))
	return k, classify("get api key by hash", err)
}

// ListAPIKeys returns every key of orgID, oldest first.
func (s *Store) ListAPIKeys(ctx context.Context, orgID string) ([]model.APIKey, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+apiKeyCols+` FROM api_keys WHERE org_id = $1 ORDER BY created_at, id`, orgID)
	if err != nil {
		return nil, classify("list api keys", err)
	}
	out, err := collect(rows, scanAPIKey)
	if out == nil {
		out = []model.APIKey{}
	}
	return out, classify("list api keys", err)
}

// RevokeAPIKey marks key id of orgID revoked at at (keeping an earlier
// revocation) and returns it.
func (s *Store) RevokeAPIKey(ctx context.Context, orgID, id string, at time.Time) (model.APIKey, error) {
	k, err := scanAPIKey(s.pool.QueryRow(ctx, `UPDATE api_keys SET revoked_at = coalesce(revoked_at, $1)
		WHERE org_id = $2 AND id = $3 RETURNING `+apiKeyCols, at, orgID, id))
	return k, classify("revoke api key "+id, err)
}

// ---- worker credentials

// GetWorkerCredential returns the stored credential of workerID.
func (s *Store) GetWorkerCredential(ctx context.Context, workerID string) (store.WorkerCredential, error) {
	c := store.WorkerCredential{WorkerID: workerID}
	err := s.pool.QueryRow(ctx, `SELECT secret_hash, created_at, updated_at FROM worker_credentials WHERE worker_id = $1`, workerID).
		Scan(&c.SecretHash, &c.CreatedAt, &c.UpdatedAt)
	c.CreatedAt, c.UpdatedAt = utc(c.CreatedAt), utc(c.UpdatedAt)
	return c, classify("get worker credential "+workerID, err)
}

// PutWorkerCredential stores c if the stored hash is oldHash ("": none).
func (s *Store) PutWorkerCredential(ctx context.Context, c store.WorkerCredential, oldHash string) error {
	step := "put worker credential " + c.WorkerID
	var tag pgconn.CommandTag
	var err error
	if oldHash == "" {
		tag, err = s.pool.Exec(ctx, `INSERT INTO worker_credentials (worker_id, secret_hash, created_at, updated_at)
			VALUES ($1, $2, $3, $4) ON CONFLICT (worker_id) DO NOTHING`, c.WorkerID, c.SecretHash, c.CreatedAt, c.UpdatedAt)
	} else {
		tag, err = s.pool.Exec(ctx, `UPDATE worker_credentials SET secret_hash = $1, updated_at = $2
			WHERE worker_id = $3 AND secret_hash = $4`, c.SecretHash, c.UpdatedAt, c.WorkerID, oldHash)
	}
	if err != nil {
		return classify(step, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("postgres: %s: the stored credential changed: %w", step, model.ErrConflict)
	}
	return nil
}

// DeleteWorkerCredential removes the credential of workerID.
func (s *Store) DeleteWorkerCredential(ctx context.Context, workerID string) error {
	tag, err := s.pool.Exec(ctx, `DELETE FROM worker_credentials WHERE worker_id = $1`, workerID)
	if err != nil {
		return classify("delete worker credential "+workerID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("postgres: delete worker credential %s: %w", workerID, model.ErrNotFound)
	}
	return nil
}

// ---- templates

// PutTemplate upserts name:tag → digest.
func (s *Store) PutTemplate(ctx context.Context, t model.Template) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO templates (name, tag, digest, size_bytes, created_at)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (name, tag) DO UPDATE SET
			digest = excluded.digest, size_bytes = excluded.size_bytes, created_at = excluded.created_at`,
		t.Name, t.Tag, t.Digest, t.SizeBytes, t.CreatedAt)
	return classify("put template "+t.Name+":"+t.Tag, err)
}

const templateCols = `name, tag, digest, size_bytes, created_at`

func scanTemplate(sc scanner) (model.Template, error) {
	var t model.Template
	err := sc.Scan(&t.Name, &t.Tag, &t.Digest, &t.SizeBytes, &t.CreatedAt)
	t.CreatedAt = utc(t.CreatedAt)
	return t, err
}

// GetTemplate looks a template up by name and tag.
func (s *Store) GetTemplate(ctx context.Context, name, tag string) (model.Template, error) {
	t, err := scanTemplate(s.pool.QueryRow(ctx, `SELECT `+templateCols+` FROM templates WHERE name = $1 AND tag = $2`, name, tag))
	return t, classify("get template "+name+":"+tag, err)
}

// GetTemplateByDigest returns the newest name:tag pointing at digest.
func (s *Store) GetTemplateByDigest(ctx context.Context, digest string) (model.Template, error) {
	t, err := scanTemplate(s.pool.QueryRow(ctx, `SELECT `+templateCols+` FROM templates
		WHERE digest = $1 ORDER BY created_at DESC, name, tag LIMIT 1`, digest))
	return t, classify("get template by digest "+digest, err)
}

// ListTemplates returns every template ordered by name, then tag.
func (s *Store) ListTemplates(ctx context.Context) ([]model.Template, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+templateCols+` FROM templates ORDER BY name, tag`)
	if err != nil {
		return nil, classify("list templates", err)
	}
	out, err := collect(rows, scanTemplate)
	return out, classify("list templates", err)
}

// ---- sandboxes

const sandboxCols = `id, org_id, template, template_digest, runtime, state, desired_state, reason,
	worker_id, env, metadata, resources, timeout_s, generation, created_at, updated_at,
	last_activity_at, expires_at, idle_suspend_s, no_auto_wake, snapshot_id, snapshot_bytes, pool, snapshots, public_traffic`

func scanSandbox(sc scanner) (model.Sandbox, error) {
	var sb model.Sandbox
	var env, meta, res, snaps string
	if err := sc.Scan(&sb.ID, &sb.OrgID, &sb.Template, &sb.TemplateDigest, &sb.Runtime, &sb.State,
		&sb.DesiredState, &sb.Reason, &sb.WorkerID, &env, &meta, &res, &sb.TimeoutS, &sb.Generation,
		&sb.CreatedAt, &sb.UpdatedAt, &sb.LastActivityAt, &sb.ExpiresAt, &sb.IdleSuspendS, &sb.NoAutoWake,
		&sb.SnapshotID, &sb.SnapshotBytes, &sb.Pool, &snaps, &sb.PublicTraffic); err != nil {
		return sb, err
	}
	sb.CreatedAt = utc(sb.CreatedAt)
	sb.UpdatedAt = utc(sb.UpdatedAt)
	sb.LastActivityAt = utc(sb.LastActivityAt)
	if sb.ExpiresAt != nil {
		t := utc(*sb.ExpiresAt)
		sb.ExpiresAt = &t
	}
	var sn store.SandboxSnapshots
	err := errors.Join(fromJSON(env, &sb.Env), fromJSON(meta, &sb.Metadata), fromJSON(res, &sb.Resources), fromJSON(snaps, &sn))
	sn.Apply(&sb)
	return sb, err
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

// CreateSandbox inserts the sandbox, its first operation and the
// idempotency key mapping in one transaction. Concurrent creates with the
// same org and key resolve to one sandbox: the losers' transactions roll
// back and they return the winner's pair.
func (s *Store) CreateSandbox(ctx context.Context, sb model.Sandbox, op model.Operation, idempotencyKey string) (model.Sandbox, model.Operation, bool, error) {
	if idempotencyKey != "" {
		osb, oop, err := s.idempotent(ctx, sb.OrgID, idempotencyKey)
		if err == nil {
			return osb, oop, true, nil
		} else if !errors.Is(err, model.ErrNotFound) {
			return model.Sandbox{}, model.Operation{}, false, err
		}
	}
	env, meta, res, snaps, err := sandboxJSON(sb)
	if err != nil {
		return model.Sandbox{}, model.Operation{}, false, fmt.Errorf("postgres: create sandbox %s: %w", sb.ID, err)
	}
	var outSB model.Sandbox
	var outOp model.Operation
	err = s.inTx(ctx, "create sandbox "+sb.ID, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO sandboxes (`+sandboxCols+`)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
				$19, $20, $21, $22, $23, $24, $25)`,
			sb.ID, sb.OrgID, sb.Template, sb.TemplateDigest, sb.Runtime, sb.State, sb.DesiredState,
			sb.Reason, sb.WorkerID, env, meta, res, sb.TimeoutS, sb.Generation, sb.CreatedAt,
			sb.UpdatedAt, sb.LastActivityAt, sb.ExpiresAt,
			sb.IdleSuspendS, sb.NoAutoWake, sb.SnapshotID, sb.SnapshotBytes, sb.Pool, snaps, sb.PublicTraffic); err != nil {
			if idempotencyKey != "" && isUniqueViolation(err) {
				// Perhaps a concurrent create with the same key and id.
				return errKeyTaken
			}
			return classify("create sandbox "+sb.ID, err)
		}
		if err := insertOperation(ctx, tx, op); err != nil {
			return err
		}
		if idempotencyKey != "" {
			// Waits for a concurrent insert of the same key, then does nothing
			// if that one committed.
			tag, err := tx.Exec(ctx, `INSERT INTO idempotency_keys (org_id, key, sandbox_id, operation_id, created_at)
				VALUES ($1, $2, $3, $4, now()) ON CONFLICT (org_id, key) DO NOTHING`,
				sb.OrgID, idempotencyKey, sb.ID, op.ID)
			if err != nil {
				return classify("create sandbox: record idempotency key", err)
			}
			if tag.RowsAffected() == 0 {
				return errKeyTaken
			}
		}
		var err error
		if outSB, err = scanSandbox(tx.QueryRow(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = $1`, sb.ID)); err != nil {
			return classify("create sandbox: read back "+sb.ID, err)
		}
		if outOp, err = scanOperation(tx.QueryRow(ctx, `SELECT `+operationCols+` FROM operations WHERE id = $1`, op.ID)); err != nil {
			return classify("create sandbox: read back operation "+op.ID, err)
		}
		return nil
	})
	if errors.Is(err, errKeyTaken) {
		// The transaction rolled back; return the pair that holds the key.
		osb, oop, err := s.idempotent(ctx, sb.OrgID, idempotencyKey)
		if err != nil {
			if errors.Is(err, model.ErrNotFound) {
				return model.Sandbox{}, model.Operation{}, false, fmt.Errorf("postgres: create sandbox %s: %w", sb.ID, model.ErrConflict)
			}
			return model.Sandbox{}, model.Operation{}, false, err
		}
		return osb, oop, true, nil
	}
	if err != nil {
		return model.Sandbox{}, model.Operation{}, false, err
	}
	return outSB, outOp, false, nil
}

// errKeyTaken aborts a create whose idempotency key another transaction
// holds.
var errKeyTaken = errors.New("idempotency key taken")

// idempotent returns the pair an org's idempotency key maps to.
func (s *Store) idempotent(ctx context.Context, orgID, key string) (model.Sandbox, model.Operation, error) {
	var sbID, opID string
	err := s.pool.QueryRow(ctx, `SELECT sandbox_id, operation_id FROM idempotency_keys
		WHERE org_id = $1 AND key = $2`, orgID, key).Scan(&sbID, &opID)
	if err != nil {
		return model.Sandbox{}, model.Operation{}, classify("read idempotency key", err)
	}
	sb, err := s.GetSandbox(ctx, sbID)
	if err != nil {
		return model.Sandbox{}, model.Operation{}, err
	}
	op, err := s.GetOperation(ctx, opID)
	if err != nil {
		return model.Sandbox{}, model.Operation{}, err
	}
	return sb, op, nil
}

// GetSandbox returns one sandbox.
func (s *Store) GetSandbox(ctx context.Context, id string) (model.Sandbox, error) {
	sb, err := scanSandbox(s.pool.QueryRow(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = $1`, id))
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
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if f.OrgID != "" {
		where = append(where, "org_id = "+arg(f.OrgID))
	}
	if f.WorkerID != "" {
		where = append(where, "worker_id = "+arg(f.WorkerID))
	}
	if len(f.States) > 0 {
		states := make([]string, len(f.States))
		for i, st := range f.States {
			states[i] = string(st)
		}
		where = append(where, "state = ANY("+arg(states)+")")
	} else if !f.IncludeDeleted {
		where = append(where, "state <> "+arg(string(model.StateDeleted)))
	}
	if len(f.Metadata) > 0 {
		meta, err := toJSON(f.Metadata)
		if err != nil {
			return nil, "", fmt.Errorf("postgres: list sandboxes: %w", err)
		}
		where = append(where, "metadata @> "+arg(meta)+"::jsonb")
	}
	if f.Cursor != "" {
		c, err := decodeCursor(f.Cursor)
		if err != nil {
			return nil, "", err
		}
		where = append(where, "(created_at, id) > ("+arg(c.CreatedAt)+"::timestamptz, "+arg(c.ID)+"::text)")
	}
	limit := f.Limit
	if limit <= 0 {
		limit = defaultLimit
	}
	q := `SELECT ` + sandboxCols + ` FROM sandboxes`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY created_at, id LIMIT " + arg(limit+1)
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, "", classify("list sandboxes", err)
	}
	out, err := collect(rows, scanSandbox)
	if err != nil {
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
	return updateSandbox(ctx, s.pool, sb)
}

// updateSandbox is the guarded write. LastActivityAt never moves backwards,
// so a stale read cannot undo a TouchSandbox.
func updateSandbox(ctx context.Context, q querier, sb model.Sandbox) (model.Sandbox, error) {
	env, meta, res, snaps, err := sandboxJSON(sb)
	if err != nil {
		return model.Sandbox{}, fmt.Errorf("postgres: update sandbox %s: %w", sb.ID, err)
	}
	out, err := scanSandbox(q.QueryRow(ctx, `UPDATE sandboxes SET
			template = $1, template_digest = $2, runtime = $3, state = $4, desired_state = $5,
			reason = $6, worker_id = $7, env = $8, metadata = $9, resources = $10, timeout_s = $11,
			generation = generation + 1, updated_at = $12,
			last_activity_at = GREATEST(last_activity_at, $13), expires_at = $14,
			idle_suspend_s = $17, no_auto_wake = $18, snapshot_id = $19, snapshot_bytes = $20, pool = $21, snapshots = $22,
			public_traffic = $23
		WHERE id = $15 AND generation = $16
		RETURNING `+sandboxCols,
		sb.Template, sb.TemplateDigest, sb.Runtime, sb.State, sb.DesiredState,
		sb.Reason, sb.WorkerID, env, meta, res, sb.TimeoutS,
		time.Now(), sb.LastActivityAt, sb.ExpiresAt,
		sb.ID, sb.Generation,
		sb.IdleSuspendS, sb.NoAutoWake, sb.SnapshotID, sb.SnapshotBytes, sb.Pool, snaps, sb.PublicTraffic))
	if errors.Is(err, pgx.ErrNoRows) {
		var gen int64
		err := q.QueryRow(ctx, `SELECT generation FROM sandboxes WHERE id = $1`, sb.ID).Scan(&gen)
		if err != nil {
			return model.Sandbox{}, classify("update sandbox "+sb.ID, err)
		}
		return model.Sandbox{}, fmt.Errorf("postgres: update sandbox %s: generation %d, stored %d: %w",
			sb.ID, sb.Generation, gen, model.ErrConflict)
	}
	return out, classify("update sandbox "+sb.ID, err)
}

// UpdateSandboxAndOperation does both guarded writes in one transaction.
func (s *Store) UpdateSandboxAndOperation(ctx context.Context, sb model.Sandbox, op model.Operation) (model.Sandbox, model.Operation, error) {
	var outSB model.Sandbox
	var outOp model.Operation
	err := s.inTx(ctx, "update sandbox and operation", func(tx pgx.Tx) error {
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
	err := s.inTx(ctx, "update sandbox and create operation", func(tx pgx.Tx) error {
		var err error
		if outSB, err = updateSandbox(ctx, tx, sb); err != nil {
			return err
		}
		if err := insertOperation(ctx, tx, op); err != nil {
			return err
		}
		outOp, err = scanOperation(tx.QueryRow(ctx, `SELECT `+operationCols+` FROM operations WHERE id = $1`, op.ID))
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
	tag, err := s.pool.Exec(ctx, `UPDATE sandboxes SET last_activity_at = GREATEST(last_activity_at, $1) WHERE id = $2`, at, id)
	if err != nil {
		return classify("touch sandbox "+id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("postgres: touch sandbox %s: %w", id, model.ErrNotFound)
	}
	return nil
}

// ---- operations

const operationCols = `id, org_id, sandbox_id, kind, state, target, reason, created_at, updated_at, deadline`

var doneStates = []string{string(model.OpSucceeded), string(model.OpFailed), string(model.OpCancelled)}

func scanOperation(sc scanner) (model.Operation, error) {
	var op model.Operation
	err := sc.Scan(&op.ID, &op.OrgID, &op.SandboxID, &op.Kind, &op.State, &op.Target, &op.Reason,
		&op.CreatedAt, &op.UpdatedAt, &op.Deadline)
	op.CreatedAt = utc(op.CreatedAt)
	op.UpdatedAt = utc(op.UpdatedAt)
	op.Deadline = utc(op.Deadline)
	return op, err
}

func insertOperation(ctx context.Context, q querier, op model.Operation) error {
	_, err := q.Exec(ctx, `INSERT INTO operations (`+operationCols+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
		op.ID, op.OrgID, op.SandboxID, op.Kind, op.State, op.Target, op.Reason,
		op.CreatedAt, op.UpdatedAt, op.Deadline)
	return classify("create operation "+op.ID, err)
}

// CreateOperation inserts an operation; ErrInvalid if its sandbox does not
// exist, ErrConflict if the id does.
func (s *Store) CreateOperation(ctx context.Context, op model.Operation) error {
	return insertOperation(ctx, s.pool, op)
}

// GetOperation returns one operation.
func (s *Store) GetOperation(ctx context.Context, id string) (model.Operation, error) {
	op, err := scanOperation(s.pool.QueryRow(ctx, `SELECT `+operationCols+` FROM operations WHERE id = $1`, id))
	return op, classify("get operation "+id, err)
}

// UpdateOperation writes op's state, target, reason and deadline (and
// UpdatedAt=now) if the stored operation is not Done.
func (s *Store) UpdateOperation(ctx context.Context, op model.Operation) (model.Operation, error) {
	return updateOperation(ctx, s.pool, op)
}

func updateOperation(ctx context.Context, q querier, op model.Operation) (model.Operation, error) {
	out, err := scanOperation(q.QueryRow(ctx, `UPDATE operations SET
			state = $1, target = $2, reason = $3, deadline = $4, updated_at = $5
		WHERE id = $6 AND NOT (state = ANY($7))
		RETURNING `+operationCols,
		op.State, op.Target, op.Reason, op.Deadline, time.Now(), op.ID, doneStates))
	if errors.Is(err, pgx.ErrNoRows) {
		var state string
		err := q.QueryRow(ctx, `SELECT state FROM operations WHERE id = $1`, op.ID).Scan(&state)
		if err != nil {
			return model.Operation{}, classify("update operation "+op.ID, err)
		}
		return model.Operation{}, fmt.Errorf("postgres: update operation %s: already %s: %w", op.ID, state, model.ErrConflict)
	}
	return out, classify("update operation "+op.ID, err)
}

// ListOperations returns the operations of f.SandboxID (only open ones if
// f.Open), or, without a sandbox, every open operation; oldest first.
func (s *Store) ListOperations(ctx context.Context, f store.OperationFilter) ([]model.Operation, error) {
	var where []string
	var args []any
	if f.SandboxID != "" {
		args = append(args, f.SandboxID)
		where = append(where, "sandbox_id = $"+strconv.Itoa(len(args)))
	}
	if f.Open || f.SandboxID == "" {
		args = append(args, doneStates)
		where = append(where, "NOT (state = ANY($"+strconv.Itoa(len(args))+"))")
	}
	rows, err := s.pool.Query(ctx, `SELECT `+operationCols+` FROM operations WHERE `+
		strings.Join(where, " AND ")+` ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, classify("list operations", err)
	}
	out, err := collect(rows, scanOperation)
	return out, classify("list operations", err)
}

// ---- workers

const workerCols = `id, data_plane_url, internal_url, runtimes, templates, capacity_mib, capacity_vcpus, last_heartbeat, created_at`

// UpsertWorker inserts or replaces a worker, keeping its first CreatedAt.
func (s *Store) UpsertWorker(ctx context.Context, w model.Worker) error {
	rt, err := toJSON(w.Runtimes)
	if err != nil {
		return fmt.Errorf("postgres: upsert worker %s: %w", w.ID, err)
	}
	tpl, err := toJSON(w.Templates)
	if err != nil {
		return fmt.Errorf("postgres: upsert worker %s: %w", w.ID, err)
	}
	_, err = s.pool.Exec(ctx, `INSERT INTO workers (`+workerCols+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (id) DO UPDATE SET
			data_plane_url = excluded.data_plane_url, internal_url = excluded.internal_url,
			runtimes = excluded.runtimes, templates = excluded.templates,
			capacity_mib = excluded.capacity_mib, capacity_vcpus = excluded.capacity_vcpus,
			last_heartbeat = excluded.last_heartbeat`,
		w.ID, w.DataPlaneURL, w.InternalURL, rt, tpl, w.CapacityMiB, w.CapacityVCPUs,
		w.LastHeartbeat, w.CreatedAt)
	return classify("upsert worker "+w.ID, err)
}

func scanWorker(sc scanner) (model.Worker, error) {
	var w model.Worker
	var rt, tpl string
	if err := sc.Scan(&w.ID, &w.DataPlaneURL, &w.InternalURL, &rt, &tpl, &w.CapacityMiB, &w.CapacityVCPUs, &w.LastHeartbeat, &w.CreatedAt); err != nil {
		return w, err
	}
	w.LastHeartbeat = utc(w.LastHeartbeat)
	w.CreatedAt = utc(w.CreatedAt)
	return w, errors.Join(fromJSON(rt, &w.Runtimes), fromJSON(tpl, &w.Templates))
}

// GetWorker returns one worker.
func (s *Store) GetWorker(ctx context.Context, id string) (model.Worker, error) {
	w, err := scanWorker(s.pool.QueryRow(ctx, `SELECT `+workerCols+` FROM workers WHERE id = $1`, id))
	return w, classify("get worker "+id, err)
}

// ListWorkers returns every worker ordered by id.
func (s *Store) ListWorkers(ctx context.Context) ([]model.Worker, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+workerCols+` FROM workers ORDER BY id`)
	if err != nil {
		return nil, classify("list workers", err)
	}
	out, err := collect(rows, scanWorker)
	return out, classify("list workers", err)
}

// ---- events

// AppendEvent stores ev with the next Seq (and Time=now if unset) and
// returns it. Appends are serialized so that Seq order is commit order.
func (s *Store) AppendEvent(ctx context.Context, ev model.Event) (model.Event, error) {
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	ev.Time = ev.Time.UTC().Truncate(time.Microsecond)
	err := s.inTx(ctx, "append event", func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockEvents); err != nil {
			return classify("append event: lock", err)
		}
		return classify("append event", tx.QueryRow(ctx, `INSERT INTO events (org_id, sandbox_id, operation_id, type, data, time)
			VALUES ($1, $2, $3, $4, $5, $6) RETURNING seq`,
			ev.OrgID, ev.SandboxID, ev.OperationID, ev.Type, string(ev.Data), ev.Time).Scan(&ev.Seq))
	})
	if err != nil {
		return model.Event{}, err
	}
	return ev, nil
}

// ListEvents returns events with Seq > afterSeq, oldest first, at most limit
// (0 means 100).
func (s *Store) ListEvents(ctx context.Context, orgID, sandboxID string, afterSeq int64, limit int) ([]model.Event, error) {
	if limit <= 0 {
		limit = defaultLimit
	}
	rows, err := s.pool.Query(ctx, `SELECT seq, org_id, sandbox_id, operation_id, type, data, time
		FROM events
		WHERE seq > $1 AND ($2 = '' OR org_id = $2) AND ($3 = '' OR sandbox_id = $3)
		ORDER BY seq LIMIT $4`, afterSeq, orgID, sandboxID, limit)
	if err != nil {
		return nil, classify("list events", err)
	}
	out, err := collect(rows, func(sc scanner) (model.Event, error) {
		var ev model.Event
		var data string
		err := sc.Scan(&ev.Seq, &ev.OrgID, &ev.SandboxID, &ev.OperationID, &ev.Type, &data, &ev.Time)
		if data != "" {
			ev.Data = json.RawMessage(data)
		}
		ev.Time = utc(ev.Time)
		return ev, err
	})
	return out, classify("list events", err)
}

// ---- settings

// PutSettingIfAbsent stores value only if key is unset and returns the value
// now stored.
func (s *Store) PutSettingIfAbsent(ctx context.Context, key, value string) (string, error) {
	if _, err := s.pool.Exec(ctx, `INSERT INTO settings (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING`, key, value); err != nil {
		return "", classify("put setting "+key, err)
	}
	var stored string
	err := s.pool.QueryRow(ctx, `SELECT value FROM settings WHERE key = $1`, key).Scan(&stored)
	return stored, classify("put setting "+key, err)
}

// SwapSetting replaces key's value old with value.
func (s *Store) SwapSetting(ctx context.Context, key, old, value string) error {
	tag, err := s.pool.Exec(ctx, `UPDATE settings SET value = $1 WHERE key = $2 AND value = $3`, value, key, old)
	if err != nil {
		return classify("swap setting "+key, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var stored string
	if err := s.pool.QueryRow(ctx, `SELECT value FROM settings WHERE key = $1`, key).Scan(&stored); err != nil {
		return classify("swap setting "+key, err)
	}
	return fmt.Errorf("postgres: swap setting %s: the stored value changed: %w", key, model.ErrConflict)
}

// ---- warm pools

// ClaimSandbox hands a pool member to sb.OrgID: see store.Store. The first
// guarded UPDATE locks the row, so concurrent claims of one member
// serialize and all but one see ErrConflict.
func (s *Store) ClaimSandbox(ctx context.Context, sb model.Sandbox, op model.Operation, idempotencyKey string) (model.Sandbox, model.Operation, bool, error) {
	if idempotencyKey != "" {
		osb, oop, err := s.idempotent(ctx, sb.OrgID, idempotencyKey)
		if err == nil {
			return osb, oop, true, nil
		} else if !errors.Is(err, model.ErrNotFound) {
			return model.Sandbox{}, model.Operation{}, false, err
		}
	}
	var outSB model.Sandbox
	var outOp model.Operation
	err := s.inTx(ctx, "claim sandbox "+sb.ID, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE sandboxes SET org_id = $1 WHERE id = $2 AND generation = $3 AND pool <> ''`,
			sb.OrgID, sb.ID, sb.Generation)
		if err != nil {
			return classify("claim sandbox "+sb.ID, err)
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("postgres: claim sandbox %s: not a pool member at generation %d: %w", sb.ID, sb.Generation, model.ErrConflict)
		}
		if outSB, err = updateSandbox(ctx, tx, sb); err != nil {
			return err
		}
		if err := insertOperation(ctx, tx, op); err != nil {
			return err
		}
		if idempotencyKey != "" {
			tag, err := tx.Exec(ctx, `INSERT INTO idempotency_keys (org_id, key, sandbox_id, operation_id, created_at)
				VALUES ($1, $2, $3, $4, now()) ON CONFLICT (org_id, key) DO NOTHING`,
				sb.OrgID, idempotencyKey, sb.ID, op.ID)
			if err != nil {
				return classify("claim sandbox: record idempotency key", err)
			}
			if tag.RowsAffected() == 0 {
				return errKeyTaken
			}
		}
		outOp, err = scanOperation(tx.QueryRow(ctx, `SELECT `+operationCols+` FROM operations WHERE id = $1`, op.ID))
		return classify("claim sandbox: read back operation "+op.ID, err)
	})
	if errors.Is(err, errKeyTaken) {
		osb, oop, err := s.idempotent(ctx, sb.OrgID, idempotencyKey)
		if err != nil {
			if errors.Is(err, model.ErrNotFound) {
				return model.Sandbox{}, model.Operation{}, false, fmt.Errorf("postgres: claim sandbox %s: %w", sb.ID, model.ErrConflict)
			}
			return model.Sandbox{}, model.Operation{}, false, err
		}
		return osb, oop, true, nil
	}
	if err != nil {
		return model.Sandbox{}, model.Operation{}, false, err
	}
	return outSB, outOp, false, nil
}

// PutPool upserts a pool by digest.
func (s *Store) PutPool(ctx context.Context, p model.Pool) error {
	res, err := toJSON(p.Resources)
	if err != nil {
		return fmt.Errorf("postgres: put pool %s: %w", p.Digest, err)
	}
	_, err = s.pool.Exec(ctx, `INSERT INTO pools (digest, template, size, resources, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (digest) DO UPDATE SET template = excluded.template, size = excluded.size,
			resources = excluded.resources, updated_at = excluded.updated_at`,
		p.Digest, p.Template, p.Size, res, p.CreatedAt, p.UpdatedAt)
	return classify("put pool "+p.Digest, err)
}

// ListPools returns every pool, ordered by template.
func (s *Store) ListPools(ctx context.Context) ([]model.Pool, error) {
	rows, err := s.pool.Query(ctx, `SELECT digest, template, size, resources::text, created_at, updated_at FROM pools ORDER BY template, digest`)
	if err != nil {
		return nil, classify("list pools", err)
	}
	out, err := collect(rows, func(sc scanner) (model.Pool, error) {
		var p model.Pool
		var res string
		if err := sc.Scan(&p.Digest, &p.Template, &p.Size, &res, &p.CreatedAt, &p.UpdatedAt); err != nil {
			return p, err
		}
		p.CreatedAt, p.UpdatedAt = utc(p.CreatedAt), utc(p.UpdatedAt)
		return p, fromJSON(res, &p.Resources)
	})
	return out, classify("list pools", err)
}

// DeletePool removes a pool's configuration.
func (s *Store) DeletePool(ctx context.Context, digest string) error {
	tag, err := s.pool.Exec(ctx, `DELETE FROM pools WHERE digest = $1`, digest)
	if err != nil {
		return classify("delete pool "+digest, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("postgres: delete pool %s: %w", digest, model.ErrNotFound)
	}
	return nil
}
