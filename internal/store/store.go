// Package store defines the control plane's persistence contract. One
// implementation serves it, internal/store/sqlstore over database/sql, on
// two databases: SQLite (internal/store/sqlite, embedded, one host) and
// PostgreSQL (internal/store/postgres, any number of servers), each of
// which keeps only its Open, its migrations and its sqlstore.Dialect. Both
// pass the same conformance suite (internal/store/storetest).
//
// Every sandbox write is a guarded transition: the caller names the
// generation it read, and the update applies only if the row still has it
// (compare-and-set). A lost race returns model.ErrConflict; the caller
// re-reads and decides again, which is what level-triggered controllers do
// anyway. Writes that must land together (a sandbox and its operation) run
// in one transaction, Store.InTx:
//
//	err := st.InTx(ctx, func(tx store.Tx) error {
//		if _, err := tx.UpdateSandbox(ctx, sb); err != nil {
//			return err
//		}
//		return tx.CreateOperation(ctx, op)
//	})
package store

import (
	"context"
	"io"
	"time"

	"github.com/airlock/airlock/internal/model"
)

// Store is the whole persistence surface: the per-aggregate interfaces
// below, transactions over them (InTx) and Close. Implementations must be
// safe for concurrent use. Errors wrap model.ErrNotFound,
// model.ErrConflict or model.ErrInvalid where those apply.
type Store interface {
	Tx
	Close() error
}

// Tx is the data surface, on the store itself or bound to one transaction
// (the argument of InTx's fn). Code that needs only part of it takes the
// aggregate's interface (Sandboxes, Events, …).
type Tx interface {
	Orgs
	Workers
	Templates
	Sandboxes
	Pools
	NetworkProfiles
	Secrets
	Operations
	Events
	Settings
	Builds
	Leases

	// InTx runs fn in one transaction and commits it if fn returns nil;
	// otherwise nothing fn wrote stays, and InTx returns fn's error as it
	// is. fn must use only the Tx it is given (on SQLite a write through the
	// store itself would wait for the transaction forever), must not keep
	// it, and may run more than once: the whole transaction is retried when
	// the database reports a serialization failure. On a Tx, InTx nests (a
	// savepoint): fn's failure undoes only fn's writes. After a method of a
	// transaction's Tx fails, fn should return (PostgreSQL refuses every
	// further statement of the transaction); a write that may fail and
	// that fn means to survive goes in a nested InTx. Each method that
	// writes several rows (CreateSandbox, ClaimSandbox, …) is atomic by
	// itself too, inside a transaction or not.
	InTx(ctx context.Context, fn func(tx Tx) error) error
}

// Orgs are organizations and their API keys.
type Orgs interface {
	CreateOrg(ctx context.Context, org model.Org) error
	GetOrg(ctx context.Context, id string) (model.Org, error)
	ListOrgs(ctx context.Context) ([]model.Org, error)
	// UpdateOrg writes an org's name, features, idle setting and quotas
	// (ErrNotFound if absent).
	UpdateOrg(ctx context.Context, org model.Org) error
	CreateAPIKey(ctx context.Context, key model.APIKey) error
	// GetAPIKeyByHash finds a key by the hex sha256 of its secret (revoked
	// and expired keys too: the caller refuses them by name).
	GetAPIKeyByHash(ctx context.Context, hash string) (model.APIKey, error)
	// ListAPIKeys returns every key of orgID (revoked and expired ones
	// too), oldest first.
	ListAPIKeys(ctx context.Context, orgID string) ([]model.APIKey, error)
	// RevokeAPIKey sets RevokedAt of key id of orgID to at (a key revoked
	// before keeps its first time) and returns the key; ErrNotFound if
	// orgID has no such key.
	RevokeAPIKey(ctx context.Context, orgID, id string, at time.Time) (model.APIKey, error)
}

// Workers are the registered workers and their credentials.
type Workers interface {
	UpsertWorker(ctx context.Context, w model.Worker) error
	GetWorker(ctx context.Context, id string) (model.Worker, error)
	ListWorkers(ctx context.Context) ([]model.Worker, error)
	// SetWorkerCordoned sets or clears the operator's cordon, which
	// UpsertWorker keeps; ErrNotFound for an unknown worker.
	SetWorkerCordoned(ctx context.Context, id string, cordoned bool) error
	// SetWorkerDraining cordons a worker and marks it draining (the
	// controller moves its sandboxes off; SetWorkerCordoned false ends it);
	// ErrNotFound for an unknown worker.
	SetWorkerDraining(ctx context.Context, id string) error

	// Worker credentials: the hash of each worker's own secret, bound to
	// its id. PutWorkerCredential stores c only if the stored hash is
	// oldHash ("": none stored yet), else ErrConflict;
	// DeleteWorkerCredential is ErrNotFound if absent.
	GetWorkerCredential(ctx context.Context, workerID string) (WorkerCredential, error)
	PutWorkerCredential(ctx context.Context, c WorkerCredential, oldHash string) error
	DeleteWorkerCredential(ctx context.Context, workerID string) error
}

// Templates map name:tag to an image digest (with the template's config),
// and record the deletions operators asked for, by digest.
type Templates interface {
	// PutTemplate upserts name:tag → digest.
	PutTemplate(ctx context.Context, t model.Template) error
	GetTemplate(ctx context.Context, name, tag string) (model.Template, error)
	GetTemplateByDigest(ctx context.Context, digest string) (model.Template, error)
	ListTemplates(ctx context.Context) ([]model.Template, error)
	// DeleteTemplate removes every name:tag pointing at digest and records
	// the deletion at at (a later deletion of the digest moves the time).
	DeleteTemplate(ctx context.Context, digest string, at time.Time) error
	// ListTemplateDeletions returns the recorded deletions, by digest.
	ListTemplateDeletions(ctx context.Context) (map[string]time.Time, error)
	// ClearTemplateDeletion forgets the deletion of digest (none: no error).
	ClearTemplateDeletion(ctx context.Context, digest string) error
}

// Sandboxes are the sandboxes' desired and observed state.
type Sandboxes interface {
	// CreateSandbox inserts the sandbox, its first operation and, when
	// idempotencyKey is not empty, the key → (sandbox, operation) mapping, in
	// one transaction. If the key was already used by the same org, nothing is
	// written and the earlier sandbox and operation are returned with
	// existed=true.
	CreateSandbox(ctx context.Context, sb model.Sandbox, op model.Operation, idempotencyKey string) (model.Sandbox, model.Operation, bool, error)
	GetSandbox(ctx context.Context, id string) (model.Sandbox, error)
	ListSandboxes(ctx context.Context, f SandboxFilter) ([]model.Sandbox, string, error)
	// UpdateSandbox writes sb if the stored generation equals sb.Generation,
	// and stores it with Generation+1 and UpdatedAt=now. It returns the stored
	// row. ErrConflict if the generation moved, ErrNotFound if absent.
	UpdateSandbox(ctx context.Context, sb model.Sandbox) (model.Sandbox, error)
	// TouchSandbox sets LastActivityAt without bumping the generation.
	TouchSandbox(ctx context.Context, id string, at time.Time) error
	// ClaimSandbox hands a warm-pool member to an org, in one transaction:
	// the guarded write of sb (as UpdateSandbox, except that OrgID is written
	// too, and only while the stored row is still a pool member: Pool not
	// empty, else ErrConflict), the insert of op and, when idempotencyKey is
	// not empty, the key → (sandbox, operation) mapping under sb.OrgID. If
	// that org already used the key, nothing is written and the earlier
	// sandbox and operation are returned with existed=true.
	ClaimSandbox(ctx context.Context, sb model.Sandbox, op model.Operation, idempotencyKey string) (model.Sandbox, model.Operation, bool, error)
}

// Pools are the warm pools' configuration, keyed by template digest.
type Pools interface {
	// PutPool upserts (CreatedAt is kept on update); DeletePool is
	// ErrNotFound if absent.
	PutPool(ctx context.Context, p model.Pool) error
	ListPools(ctx context.Context) ([]model.Pool, error)
	DeletePool(ctx context.Context, digest string) error
}

// NetworkProfiles are the operators' named egress policies (the built-in
// ones are not stored).
type NetworkProfiles interface {
	// PutNetworkProfile upserts (CreatedAt is kept on update).
	PutNetworkProfile(ctx context.Context, p model.NetworkProfile) error
	GetNetworkProfile(ctx context.Context, name string) (model.NetworkProfile, error)
	ListNetworkProfiles(ctx context.Context) ([]model.NetworkProfile, error)
	// DeleteNetworkProfile is ErrNotFound if absent.
	DeleteNetworkProfile(ctx context.Context, name string) error
}

// Secrets are orgs' named values for the egress gateway to inject
// (NetworkPolicyV1 "inject"); listing never returns values.
type Secrets interface {
	// PutSecret upserts (CreatedAt is kept on update).
	PutSecret(ctx context.Context, s model.Secret, value string) error
	ListSecrets(ctx context.Context, orgID string) ([]model.Secret, error)
	// SecretValues returns the values of those of names the org has set.
	SecretValues(ctx context.Context, orgID string, names []string) (map[string]string, error)
	// DeleteSecret is ErrNotFound if absent.
	DeleteSecret(ctx context.Context, orgID, name string) error
}

// Operations are the long-running requests on sandboxes.
type Operations interface {
	CreateOperation(ctx context.Context, op model.Operation) error
	GetOperation(ctx context.Context, id string) (model.Operation, error)
	// UpdateOperation writes op if the stored one is not Done yet
	// (ErrConflict otherwise) and stores it with UpdatedAt=now.
	UpdateOperation(ctx context.Context, op model.Operation) (model.Operation, error)
	// ListOperations returns operations that are not Done (for controllers),
	// or, when sandboxID is set, every operation of that sandbox.
	ListOperations(ctx context.Context, f OperationFilter) ([]model.Operation, error)
}

// Events are an append-only log with a monotonically increasing Seq.
type Events interface {
	// AppendEvent stores ev with the next Seq (Time=now if unset) and
	// returns it as stored.
	AppendEvent(ctx context.Context, ev model.Event) (model.Event, error)
	// ListEvents returns events with Seq > afterSeq, oldest first, at most
	// limit; orgID and sandboxID filter when not empty.
	ListEvents(ctx context.Context, orgID, sandboxID string, afterSeq int64, limit int) ([]model.Event, error)
}

// Settings are small cluster-wide values (e.g. the data-plane signing key).
// Leases are named, expiring leaderships shared through the database
// (the controller's, among server replicas).
type Leases interface {
	// AcquireLease takes or renews lease name for holder until now+ttl
	// when it is free, expired or holder's already, and returns the lease
	// as stored afterwards: held by holder, or by another until ExpiresAt.
	AcquireLease(ctx context.Context, name, holder string, now time.Time, ttl time.Duration) (Lease, error)
	// ReleaseLease lets lease name expire now if holder holds it.
	ReleaseLease(ctx context.Context, name, holder string, now time.Time) error
	// HoldLease returns nil when holder holds lease name at epoch and it
	// has not expired at now, else an error wrapping model.ErrConflict: a
	// fence. In a transaction it also locks the lease row until the
	// transaction ends, so that a takeover (AcquireLease by another) waits
	// for the fenced writes to commit, and none of them commits after it.
	HoldLease(ctx context.Context, name, holder string, epoch int64, now time.Time) error
}

// Lease is one lease as stored. Epoch grows by one whenever the holder
// changes: a fencing token a holder can compare.
type Lease struct {
	Name      string
	Holder    string
	Epoch     int64
	ExpiresAt time.Time
}

type Settings interface {
	// PutSettingIfAbsent stores value only if key is unset and returns the
	// value now stored.
	PutSettingIfAbsent(ctx context.Context, key, value string) (string, error)
	// SwapSetting replaces key's value old with value (ErrConflict if the
	// stored value is not old, ErrNotFound if key is unset).
	SwapSetting(ctx context.Context, key, old, value string) error
}

// Builds are template builds (model.Build), their progress events and
// the files orgs upload for their COPY steps.
type Builds interface {
	// PutBuildFile stores f with its content, exactly f.Size bytes read
	// from r (in chunks of BuildFileChunk bytes), unless f.OrgID has f.Key
	// already: then nothing is read or written and created is false.
	PutBuildFile(ctx context.Context, f BuildFile, r io.Reader) (created bool, err error)
	// GetBuildFile returns what is known of a file, without its content
	// (ErrNotFound if the org has none under key).
	GetBuildFile(ctx context.Context, orgID, key string) (BuildFile, error)
	// ReadBuildFileChunk returns chunk n (from 0) of a file's content;
	// ErrNotFound past its end.
	ReadBuildFileChunk(ctx context.Context, orgID, key string, n int) ([]byte, error)

	// CreateBuild inserts b (ErrConflict if its id exists).
	CreateBuild(ctx context.Context, b model.Build) error
	GetBuild(ctx context.Context, id string) (model.Build, error)
	// UpdateBuild writes b's state, spec, worker, digest, error, steps and
	// finished time while the stored build is not finished (ready or
	// failed): ErrConflict once it is, ErrNotFound if absent.
	UpdateBuild(ctx context.Context, b model.Build) error
	// ListBuilds returns an org's builds, newest first, at most limit (0:
	// 100).
	ListBuilds(ctx context.Context, orgID string, limit int) ([]model.Build, error)
	// AppendBuildEvents stores evs under build id with the Seq each has
	// (ErrConflict for a Seq stored already).
	AppendBuildEvents(ctx context.Context, buildID string, evs []model.BuildEvent) error
	// ListBuildEvents returns a build's events with Seq > after, oldest
	// first, at most limit (0: 100).
	ListBuildEvents(ctx context.Context, buildID string, after, limit int) ([]model.BuildEvent, error)
}

// BuildFileChunk is the size of the chunks a build file is stored in (the
// last one may be shorter).
const BuildFileChunk = 1 << 20

// BuildFile is one uploaded build file, without its content.
type BuildFile struct {
	OrgID string
	Key   string
	Size  int64
	// SHA256 is the lowercase hex sha256 of the content.
	SHA256    string
	CreatedAt time.Time
}

// Notifier is an optional power of a Store, found by type assertion: it
// tells of event appends by the other stores on the same database — other
// servers', on PostgreSQL (LISTEN/NOTIFY) — so that their writes wake this
// server's waiters at once instead of at its next poll.
type Notifier interface {
	// Listen calls wake after another store's event append has committed,
	// until ctx ends. Wake-ups carry nothing and may merge or come without
	// a new event (after a lost connection, in case one was missed): the
	// woken re-read. The store's own appends are not reported; their
	// writer announces them in process (events.Log does).
	Listen(ctx context.Context, wake func())
}

// WorkerCredential is the stored half of a worker's own secret.
type WorkerCredential struct {
	WorkerID   string
	SecretHash string // hex sha256 of the secret
	CreatedAt  time.Time
	UpdatedAt  time.Time
}

// SandboxFilter selects sandboxes. Zero values mean "any".
type SandboxFilter struct {
	OrgID    string
	WorkerID string
	States   []model.SandboxState
	// Metadata matches sandboxes whose metadata contains every pair.
	Metadata map[string]string
	// IncludeDeleted includes tombstones (StateDeleted).
	IncludeDeleted bool
	// Templates matches sandboxes made from one of these templates (by the
	// name they were created with).
	Templates []string
	// CreatedAfter, when set, matches sandboxes created at or after it.
	CreatedAfter time.Time
	// Cursor is the opaque value returned by the previous page; Limit caps the
	// page (0 means 100). Pages are ordered by creation time, then id: oldest
	// first, or newest first with Descending. A cursor belongs to the order
	// it was made in; used with the other it is invalid (model.ErrInvalid).
	Cursor     string
	Limit      int
	Descending bool
}

// OperationFilter selects operations.
type OperationFilter struct {
	SandboxID string
	// Open restricts to operations that are not Done.
	Open bool
}

// SandboxSnapshots is how both backends store a sandbox's snapshot-feature
// fields (model.Sandbox.Checkpoints, Task and Source) in one JSON column,
// "snapshots".
type SandboxSnapshots struct {
	Checkpoints []model.Checkpoint `json:"checkpoints,omitempty"`
	Task        *model.Task        `json:"task,omitempty"`
	Source      *model.Source      `json:"source,omitempty"`
	StartedFrom string             `json:"started_from,omitempty"`
}

// SnapshotsOf returns the snapshot-feature fields of sb.
func SnapshotsOf(sb model.Sandbox) SandboxSnapshots {
	return SandboxSnapshots{Checkpoints: sb.Checkpoints, Task: sb.Task, Source: sb.Source, StartedFrom: sb.StartedFrom}
}

// Apply sets the snapshot-feature fields of sb.
func (s SandboxSnapshots) Apply(sb *model.Sandbox) {
	sb.Checkpoints, sb.Task, sb.Source, sb.StartedFrom = s.Checkpoints, s.Task, s.Source, s.StartedFrom
}

// ListAllSandboxes returns every page of f (500 per page unless f.Limit
// says otherwise).
func ListAllSandboxes(ctx context.Context, st Sandboxes, f SandboxFilter) ([]model.Sandbox, error) {
	var all []model.Sandbox
	if f.Limit == 0 {
		f.Limit = 500
	}
	for {
		page, next, err := st.ListSandboxes(ctx, f)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if next == "" || len(page) == 0 {
			return all, nil
		}
		f.Cursor = next
	}
}
