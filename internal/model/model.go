// Package model holds Airlock's vocabulary: the records the control plane
// stores and serves (orgs, keys, templates, sandboxes, operations, workers,
// events) and the state machines that govern them. It has no I/O and no
// dependencies beyond the standard library, so every other package can use it.
package model

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Sentinel errors shared by every layer. Adapters (REST, E2B, worker API)
// translate them to wire codes in exactly one place each.
var (
	ErrNotFound      = errors.New("not found")
	ErrConflict      = errors.New("conflict")
	ErrInvalid       = errors.New("invalid")
	ErrUnauthorized  = errors.New("unauthorized")
	ErrForbidden     = errors.New("forbidden")
	ErrTooLarge      = errors.New("too large")
	ErrUnavailable   = errors.New("unavailable")
	ErrRateLimited   = errors.New("rate limited")
	ErrUnprocessable = errors.New("unprocessable")
	// ErrQuotaExceeded is a kind of ErrRateLimited (adapters that know no
	// better answer 429): an org is at one of its quotas.
	ErrQuotaExceeded = fmt.Errorf("quota exceeded: %w", ErrRateLimited)
	// ErrGone is a kind of ErrNotFound: the thing existed and is no longer
	// kept (a command's output after its retention). The internal surfaces
	// answer it 410 "gone"; the public API, which has no such answer, 404.
	ErrGone = fmt.Errorf("gone: %w", ErrNotFound)
)

// Errorf wraps a sentinel with a user-facing message: errors.Is still finds the
// sentinel, and Error() returns only the message. The format may wrap a
// cause with %w (as fmt.Errorf): errors.Is and errors.As then find the
// cause too.
func Errorf(kind error, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	e := &kindError{kind: kind, msg: err.Error()}
	switch err.(type) {
	case interface{ Unwrap() error }, interface{ Unwrap() []error }:
		e.cause = err
	}
	return e
}

type kindError struct {
	kind  error
	msg   string
	cause error // the fmt error that wraps the %w operands, if any
}

func (e *kindError) Error() string { return e.msg }

func (e *kindError) Unwrap() []error {
	if e.cause == nil {
		return []error{e.kind}
	}
	return []error{e.kind, e.cause}
}

// SandboxState is where a sandbox is in its lifecycle.
type SandboxState string

const (
	StatePending    SandboxState = "pending"    // accepted, not yet placed on a worker
	StateStarting   SandboxState = "starting"   // placed; the worker is starting it
	StateRunning    SandboxState = "running"    // the agent answers
	StatePaused     SandboxState = "paused"     // frozen, memory resident
	StateSuspending SandboxState = "suspending" // snapshot being written
	StateSuspended  SandboxState = "suspended"  // snapshot complete, runtime released
	StateWaking     SandboxState = "waking"     // snapshot being restored
	StateDeleting   SandboxState = "deleting"   // the worker is tearing it down
	StateDeleted    SandboxState = "deleted"    // gone; kept as a tombstone
	StateFailed     SandboxState = "failed"     // see Reason; can only be deleted
	StateLost       SandboxState = "lost"       // its worker was lost (see Reason); can only be deleted
)

// SandboxStates lists every state, in lifecycle order.
var SandboxStates = []SandboxState{StatePending, StateStarting, StateRunning, StatePaused, StateSuspending,
	StateSuspended, StateWaking, StateDeleting, StateDeleted, StateFailed, StateLost}

// Terminal reports whether no further transition except deletion can happen.
func (s SandboxState) Terminal() bool { return s == StateDeleted || s == StateFailed || s == StateLost }

// Broken reports a sandbox that ended without being deleted: failed, or
// lost with its worker. It can only be deleted.
func (s SandboxState) Broken() bool { return s == StateFailed || s == StateLost }

// Valid reports whether s is a known state.
func (s SandboxState) Valid() bool {
	switch s {
	case StatePending, StateStarting, StateRunning, StatePaused, StateSuspending,
		StateSuspended, StateWaking, StateDeleting, StateDeleted, StateFailed, StateLost:
		return true
	}
	return false
}

// Resources are the limits a sandbox runs with.
type Resources struct {
	VCPUs     int `json:"vcpus"`
	MemoryMiB int `json:"memory_mib"`
	// DiskMiB bounds what the guest can write to its filesystem (the gVisor
	// overlay, the QEMU writable disk); 0 in records older than the limit,
	// which runtimes treat as their default.
	DiskMiB int `json:"disk_mib,omitempty"`
}

// Sandbox is one isolated guest. DesiredState is what the user asked for
// (running or deleted); State is what the system has observed. Generation
// increases on every write and guards compare-and-set updates.
type Sandbox struct {
	ID             string            `json:"id"`
	OrgID          string            `json:"org_id"`
	Template       string            `json:"template"`        // the reference as requested, e.g. "base" or "base:latest"
	TemplateDigest string            `json:"template_digest"` // the resolved content digest, "sha256:…"
	Runtime        string            `json:"runtime"`
	State          SandboxState      `json:"state"`
	DesiredState   SandboxState      `json:"desired_state"`
	Reason         string            `json:"reason,omitempty"`
	WorkerID       string            `json:"worker_id,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	Metadata       map[string]string `json:"metadata,omitempty"`
	Resources      Resources         `json:"resources"`
	TimeoutS       int               `json:"timeout_s,omitempty"` // 0: no expiry
	Generation     int64             `json:"generation"`
	CreatedAt      time.Time         `json:"created_at"`
	UpdatedAt      time.Time         `json:"updated_at"`
	LastActivityAt time.Time         `json:"last_activity_at"`
	ExpiresAt      *time.Time        `json:"expires_at,omitempty"`
	// OnExpiry is what the controller does once ExpiresAt has passed
	// (empty: ExpiryDelete).
	OnExpiry ExpiryAction `json:"on_expiry,omitempty"`

	// Lifecycle (issue "Lifecycle"). IdleSuspendS is resolved at create from
	// the request, the org, or DefaultIdleSuspend; 0 disables it.
	IdleSuspendS int64 `json:"idle_suspend_after_s"`
	// NoAutoWake opts out of waking a suspended sandbox on data-plane use.
	NoAutoWake bool `json:"no_auto_wake,omitempty"`
	// PublicTraffic lets requests reach the sandbox's ports (other than
	// envd's) without its traffic token (see service.CheckTraffic).
	PublicTraffic bool `json:"public_traffic,omitempty"`
	// Network is the sandbox's egress policy (nil in records from before
	// egress policies: the worker's default applies).
	Network *SandboxNetwork `json:"network,omitempty"`
	// SnapshotID and SnapshotBytes describe the snapshot of a suspended
	// sandbox (or the last one taken).
	SnapshotID    string `json:"snapshot_id,omitempty"`
	SnapshotBytes int64  `json:"snapshot_bytes,omitempty"`
	// SnapshotShared: the suspend snapshot is in the shared blob store
	// (package blob) too, so the sandbox may wake on another worker that
	// uses the same store (Worker.BlobStore).
	SnapshotShared bool `json:"snapshot_shared,omitempty"`
	// MoveFrom names the worker a drain is moving the sandbox off (""
	// none): it is suspended there, then woken on another worker.
	MoveFrom string `json:"move_from,omitempty"`
	// Pool is the template digest of the warm pool this sandbox waits in;
	// empty once claimed (or for ordinary sandboxes).
	Pool string `json:"pool,omitempty"`

	// Snapshot features (feature gate "snapshots"); stored together.
	// Checkpoints are the sandbox's named, restorable snapshots (on its
	// worker), oldest first.
	Checkpoints []Checkpoint `json:"checkpoints,omitempty"`
	// Task is the checkpoint or rollback the worker is asked to run; it is
	// cleared when the worker reports its outcome.
	Task *Task `json:"task,omitempty"`
	// Source is the snapshot a fork or an imported sandbox starts from
	// instead of booting its template.
	Source *Source `json:"source,omitempty"`
	// StartedFrom says how the worker last started the sandbox: "boot"
	// (its template), "template_image" (a started-and-checkpointed image of
	// its template) or "snapshot" (its Source).
	StartedFrom string `json:"started_from,omitempty"`
}

// ExpiryAction is what happens to a sandbox when its ExpiresAt passes
// (Sandbox.OnExpiry), through the ordinary lifecycle: an operation, events.
type ExpiryAction string

const (
	// ExpiryDelete deletes the sandbox (the default; E2B's "kill").
	ExpiryDelete ExpiryAction = "delete"
	// ExpirySuspend suspends a running sandbox and clears its expiry (E2B's
	// autoPause, lifecycle.onTimeout "pause"); a paused one stays paused
	// and loses its expiry; one that cannot be suspended then is deleted.
	ExpirySuspend ExpiryAction = "suspend"
)

// How a sandbox was started (Sandbox.StartedFrom).
const (
	StartedBoot          = "boot"
	StartedTemplateImage = "template_image"
	StartedSnapshot      = "snapshot"
)

// Checkpoint is a named snapshot of a running or paused sandbox, kept on the
// sandbox's worker until the sandbox is deleted.
type Checkpoint struct {
	Name       string    `json:"name"`
	SnapshotID string    `json:"snapshot_id"`
	Bytes      int64     `json:"bytes"`
	CreatedAt  time.Time `json:"created_at"`
}

// Task is a one-off job on a sandbox's runtime, tracked by operation
// OperationID: Kind OpCheckpoint writes checkpoint Checkpoint; Kind
// OpRollback restores the sandbox from checkpoint Checkpoint (SnapshotID).
type Task struct {
	OperationID string        `json:"operation_id"`
	Kind        OperationKind `json:"kind"`
	Checkpoint  string        `json:"checkpoint"`
	SnapshotID  string        `json:"snapshot_id,omitempty"`
}

// Source is a committed snapshot in the snapshot store of worker WorkerID,
// filed under sandbox SandboxID: a fork starts from its source sandbox's
// checkpoint, an imported sandbox from the archive it was given.
type Source struct {
	WorkerID   string `json:"worker_id"`
	SandboxID  string `json:"sandbox_id"`
	Checkpoint string `json:"checkpoint,omitempty"`
	SnapshotID string `json:"snapshot_id"`
}

// FindCheckpoint returns the checkpoint of sb named name.
func (sb Sandbox) FindCheckpoint(name string) (Checkpoint, bool) {
	for _, c := range sb.Checkpoints {
		if c.Name == name {
			return c, true
		}
	}
	return Checkpoint{}, false
}

// TaskKind reports whether kind is run by the worker as a Task: such an
// operation completes when the worker reports the task's outcome, not when
// the sandbox reaches a state.
func TaskKind(kind OperationKind) bool { return kind == OpCheckpoint || kind == OpRollback }

// DefaultIdleSuspend is how long a sandbox may be idle before it is
// suspended, unless its org or its create request says otherwise.
const DefaultIdleSuspend = 6 * time.Hour

// OperationState is where an asynchronous operation is.
type OperationState string

const (
	OpPending   OperationState = "pending"
	OpRunning   OperationState = "running"
	OpSucceeded OperationState = "succeeded"
	OpFailed    OperationState = "failed"
	OpCancelled OperationState = "cancelled"
)

// Done reports whether the operation has finished.
func (s OperationState) Done() bool { return s == OpSucceeded || s == OpFailed || s == OpCancelled }

// OperationKind names what an operation does.
type OperationKind string

const (
	OpCreate  OperationKind = "create"
	OpDelete  OperationKind = "delete"
	OpPause   OperationKind = "pause"
	OpResume  OperationKind = "resume"
	OpSuspend OperationKind = "suspend"
	OpWake    OperationKind = "wake"
	// Snapshot features (feature gate "snapshots").
	OpCheckpoint OperationKind = "checkpoint"
	OpRollback   OperationKind = "rollback"
	OpFork       OperationKind = "fork"
)

// DefaultOperationDeadline is how long an operation may take before it fails.
const DefaultOperationDeadline = 30 * time.Minute

// Operation records one asynchronous lifecycle request. Target is the
// sandbox state that completes it.
type Operation struct {
	ID        string         `json:"id"`
	OrgID     string         `json:"org_id"`
	SandboxID string         `json:"sandbox_id"`
	Kind      OperationKind  `json:"kind"`
	State     OperationState `json:"state"`
	Target    SandboxState   `json:"target"`
	Reason    string         `json:"reason,omitempty"`
	CreatedAt time.Time      `json:"created_at"`
	UpdatedAt time.Time      `json:"updated_at"`
	Deadline  time.Time      `json:"deadline"`
	// TraceParent is the W3C traceparent of the request (or controller
	// round) that made the operation, "" when tracing was off: the spans
	// that act on the operation later join that trace. Never on the wire.
	TraceParent string `json:"-"`
}

// Org is a tenant.
type Org struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	// Features are the org's feature gates, e.g. "snapshots"; admins set them.
	Features []string `json:"features,omitempty"`
	// IdleSuspendS overrides DefaultIdleSuspend for the org's sandboxes
	// (nil: the default; 0: never).
	IdleSuspendS *int64 `json:"idle_suspend_after_s,omitempty"`
	// Quotas bound what the org's sandboxes may hold at once; operators
	// set them.
	Quotas Quotas `json:"quotas"`
	// Network is what the org's sandboxes may choose for their egress;
	// operators set it.
	Network OrgNetwork `json:"network"`
}

// SandboxNetwork is a sandbox's egress policy (internal/netpolicy,
// NetworkPolicyV1): the policy in force, and the operator profile it came
// from ("" for an inline policy). A profile is resolved when it is set: a
// later change of the profile reaches a sandbox when its network is set
// again.
type SandboxNetwork struct {
	Profile string          `json:"profile,omitempty"`
	Policy  json.RawMessage `json:"policy"`
}

// Secret is an org's named value for the egress gateway to inject into
// intercepted requests; the value itself is write-only (never listed).
type Secret struct {
	OrgID     string    `json:"-"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// NetworkProfile is an operator's named egress policy.
type NetworkProfile struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Policy      json.RawMessage `json:"policy"`
	Builtin     bool            `json:"builtin,omitempty"` // none and public: not stored, cannot be removed
	CreatedAt   time.Time       `json:"created_at"`
	UpdatedAt   time.Time       `json:"updated_at"`
}

// OrgNetwork is what an org's sandboxes may choose for their egress:
// the profiles they may name (empty: only Default), the profile they get
// without asking (empty: DefaultNetworkProfile), and whether they may send
// policies of their own.
type OrgNetwork struct {
	Profiles       []string `json:"profiles,omitempty"`
	Default        string   `json:"default_profile,omitempty"`
	InlinePolicies bool     `json:"inline_policies,omitempty"`
}

// DefaultNetworkProfile is the profile of an org that names none: any
// public address, nothing private (netpolicy.Public).
const DefaultNetworkProfile = "public"

// Quotas are an org's limits; 0 in a field means unlimited. Sandboxes,
// VCPUs and MemoryMiB count the sandboxes that hold a worker's capacity
// (every state but suspended, failed, deleting and deleted); DiskMiB counts
// the disk_mib of every sandbox not deleted or being deleted (a suspended
// sandbox's disk is in its snapshot); Checkpoints counts the stored checkpoints of the org's
// sandboxes; Transfers counts checkpoint exports and imports in progress.
type Quotas struct {
	Sandboxes   int `json:"sandboxes"`
	VCPUs       int `json:"vcpus"`
	MemoryMiB   int `json:"memory_mib"`
	DiskMiB     int `json:"disk_mib"`
	Checkpoints int `json:"checkpoints"`
	Transfers   int `json:"transfers"`
}

// FeatureSnapshots gates checkpoints, rollback, fork and export/import.
const FeatureSnapshots = "snapshots"

// FeatureUnsignedImports lets an org import archives this installation did not sign.
const FeatureUnsignedImports = "unsigned_imports"

// APIKey authenticates a caller as a member of one org. Only the hash of the
// secret is stored.
type APIKey struct {
	ID        string    `json:"id"`
	OrgID     string    `json:"org_id"`
	Name      string    `json:"name"`
	Prefix    string    `json:"prefix"` // first characters of the secret, for display
	Hash      string    `json:"-"`      // hex sha256 of the secret
	Admin     bool      `json:"admin"`
	CreatedAt time.Time `json:"created_at"`
	// ExpiresAt: the key is refused from then on (nil: never expires).
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// RevokedAt: when an admin revoked the key; it is refused from then on.
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// Template is an immutable root filesystem, addressed by digest, with a
// mutable name:tag pointing at it.
type Template struct {
	Name      string    `json:"name"`
	Tag       string    `json:"tag"`
	Digest    string    `json:"digest"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
	// Config is the defaults of an imported image for commands (nil: the
	// agent's own, as for base); see TemplateConfig.
	Config *TemplateConfig `json:"config,omitempty"`
	// SourceKey names what the template is apart from the guest agent in
	// it (which every worker build replaces): the template builder's
	// cache keys start from it, so that a new agent does not rebuild
	// every recipe ("": the digest stands in).
	SourceKey string `json:"source_key,omitempty"`
}

// Worker is one host that runs sandboxes.
type Worker struct {
	ID           string `json:"id"`
	DataPlaneURL string `json:"data_plane_url"` // base URL clients attach to
	InternalURL  string `json:"internal_url"`   // base URL the server calls
	// Runtimes are the runtimes the worker offers, with what each can do.
	Runtimes  []RuntimeInfo `json:"runtimes"`
	Templates []string      `json:"templates"` // digests present on the worker
	// CapacityMiB and CapacityVCPUs are what the worker offers sandboxes'
	// limits: its memory and cores, each multiplied by the operator's
	// overcommit (docs/operations.md).
	CapacityMiB   int `json:"capacity_mib"`
	CapacityVCPUs int `json:"capacity_vcpus"`
	// FreeMiB is the memory the worker's host had free for sandboxes at its
	// last report (available memory less the worker's reserve), measured,
	// unlike the reservations capacity counts; nil: never reported (an
	// older worker), and placement checks reservations only.
	FreeMiB *int `json:"free_mib,omitempty"`
	// Cordoned workers take no new sandboxes (an operator's mark, kept
	// across the worker's own re-registrations); what runs there stays.
	Cordoned bool `json:"cordoned,omitempty"`
	// Draining workers are cordoned and have their running sandboxes moved
	// to other workers (an operator's mark, like the cordon).
	Draining bool `json:"draining,omitempty"`
	// BlobStore is the shared blob store the worker uses (its URL without
	// credentials; "" none): workers with the same one can restore each
	// other's snapshots.
	BlobStore     string    `json:"blob_store,omitempty"`
	LastHeartbeat time.Time `json:"last_heartbeat"`
	CreatedAt     time.Time `json:"created_at"`
}

// RuntimeCaps are the optional powers of a runtime, as its driver declares
// them (internal/runtime: Info) and its worker registers them. Placement
// (internal/scheduler) and the service's gates decide on them, never on a
// runtime's name.
type RuntimeCaps struct {
	// Pause: freeze a sandbox in memory and thaw it.
	Pause bool `json:"pause,omitempty"`
	// Snapshot: suspend and wake (write a sandbox's state and stop it,
	// restore it later under the same id), and template images.
	Snapshot bool `json:"snapshot,omitempty"`
	// LeaveRunning: checkpoints of a sandbox that keep it running, the
	// start of the snapshot features users see (checkpoints, rollback,
	// forks of a checkpoint, export and import).
	LeaveRunning bool `json:"leave_running,omitempty"`
	// Fork: one snapshot restores several times, under new ids.
	Fork bool `json:"fork,omitempty"`
	// Network: the guest has a network device (not only loopback).
	Network bool `json:"network,omitempty"`
	// Build: runs template builds' RUN steps (a root the guest writes
	// straight into: runtime.Spec.WritableRoot).
	Build bool `json:"build,omitempty"`
}

// Has reports whether c has every power need asks for.
func (c RuntimeCaps) Has(need RuntimeCaps) bool {
	return (c.Pause || !need.Pause) && (c.Snapshot || !need.Snapshot) && (c.LeaveRunning || !need.LeaveRunning) &&
		(c.Fork || !need.Fork) && (c.Network || !need.Network) && (c.Build || !need.Build)
}

// And is the powers both c and o have.
func (c RuntimeCaps) And(o RuntimeCaps) RuntimeCaps {
	return RuntimeCaps{Pause: c.Pause && o.Pause, Snapshot: c.Snapshot && o.Snapshot, LeaveRunning: c.LeaveRunning && o.LeaveRunning,
		Fork: c.Fork && o.Fork, Network: c.Network && o.Network, Build: c.Build && o.Build}
}

// RuntimeInfo is one runtime a worker offers and what it can do.
type RuntimeInfo struct {
	Name string      `json:"name"`
	Caps RuntimeCaps `json:"caps"`
}

// UnmarshalJSON also reads a bare name, as workers registered (and stores
// kept) before runtimes declared their powers: such a runtime gets
// LegacyRuntimeInfo.
func (r *RuntimeInfo) UnmarshalJSON(b []byte) error {
	var name string
	if err := json.Unmarshal(b, &name); err == nil {
		*r = LegacyRuntimeInfo(name)
		return nil
	}
	type plain RuntimeInfo
	return json.Unmarshal(b, (*plain)(r))
}

// LegacyRuntimeInfo is what a runtime named by a worker that did not
// declare its powers (a version before RuntimeCaps) could do: those
// versions knew only gvisor (every power but a network device), qemu (pause,
// suspend and template images; a network device; checkpoints were
// gvisor's only) and "auto" (what both have). Workers that declare their
// powers are taken at their word; nothing else consults this.
func LegacyRuntimeInfo(name string) RuntimeInfo {
	gvisor := RuntimeCaps{Pause: true, Snapshot: true, LeaveRunning: true, Fork: true}
	qemu := RuntimeCaps{Pause: true, Snapshot: true, Fork: true, Network: true}
	switch name {
	case "gvisor":
		return RuntimeInfo{Name: name, Caps: gvisor}
	case "qemu":
		return RuntimeInfo{Name: name, Caps: qemu}
	case "auto":
		return RuntimeInfo{Name: name, Caps: gvisor.And(qemu)}
	}
	return RuntimeInfo{Name: name}
}

// LegacyRuntimes is LegacyRuntimeInfo of every runtime it knows.
func LegacyRuntimes() []RuntimeInfo { return NamedRuntimes("gvisor", "qemu", "auto") }

// NamedRuntimes is LegacyRuntimeInfo of each name.
func NamedRuntimes(names ...string) []RuntimeInfo {
	out := make([]RuntimeInfo, 0, len(names))
	for _, n := range names {
		out = append(out, LegacyRuntimeInfo(n))
	}
	return out
}

// Runtime returns the runtime w offers under name.
func (w Worker) Runtime(name string) (RuntimeInfo, bool) {
	for _, r := range w.Runtimes {
		if r.Name == name {
			return r, true
		}
	}
	return RuntimeInfo{}, false
}

// RuntimeNames lists the names of the runtimes w offers.
func (w Worker) RuntimeNames() []string {
	out := make([]string, 0, len(w.Runtimes))
	for _, r := range w.Runtimes {
		out = append(out, r.Name)
	}
	return out
}

// Event is one entry in the ordered log behind the SSE streams.
type Event struct {
	Seq         int64           `json:"seq"`
	OrgID       string          `json:"org_id"`
	SandboxID   string          `json:"sandbox_id,omitempty"`
	OperationID string          `json:"operation_id,omitempty"`
	Type        string          `json:"type"` // "sandbox.state", "operation.state"
	Data        json.RawMessage `json:"data"`
	Time        time.Time       `json:"time"`
}

// CommandSpec is what a client asked to run. It travels, signed, inside the
// command session token from the server to the worker. Env is the
// command's own env only: the sandbox's env reaches the worker with its
// assignment, and SandboxEnv (EnvDigest of the sandbox env the server saw)
// lets the worker wait for an assignment it has not synced yet (a warm-pool
// claim sets the env of a running sandbox), so a token's size does not
// depend on the sandbox env.
type CommandSpec struct {
	ID         string            `json:"id"`
	SandboxID  string            `json:"sandbox_id"`
	Argv       []string          `json:"argv"`
	Env        map[string]string `json:"env,omitempty"`
	SandboxEnv string            `json:"sandbox_env,omitempty"`
	Cwd        string            `json:"cwd,omitempty"`
	User       string            `json:"user,omitempty"`
	Stdin      bool              `json:"stdin,omitempty"`
	TimeoutS   int               `json:"timeout_s,omitempty"`
	PTY        *PTYSize          `json:"pty,omitempty"`
}

// PTYSize is the terminal size of a command run on a pseudo-terminal.
type PTYSize struct {
	Cols int `json:"cols"`
	Rows int `json:"rows"`
}

// Pool is the configuration of one warm pool: Size running sandboxes of the
// template Digest with Resources, kept ready so that a create can claim one
// instead of booting (issue "Lifecycle"). Template is the reference the
// operator named ("base:latest"); Digest, the key, is what it resolved to.
type Pool struct {
	Template  string    `json:"template"`
	Digest    string    `json:"digest"`
	Size      int       `json:"size"`
	Resources Resources `json:"resources"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// EnvDigest is a short digest of env (sha256 over its sorted pairs; "" for
// an empty env).
func EnvDigest(env map[string]string) string {
	if len(env) == 0 {
		return ""
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	h := sha256.New()
	for _, k := range keys {
		h.Write([]byte(k))
		h.Write([]byte{0})
		h.Write([]byte(env[k]))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// NewID returns prefix + "-" + 26 lowercase base32 characters (128 random
// bits): the ids of sandboxes, operations, snapshots and the rest. Every id
// of one kind has the same length, which runsc needs (it matches container
// ids by prefix).
func NewID(prefix string) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return prefix + "-" + idEncoding.EncodeToString(b)
}
