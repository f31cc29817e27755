// Package workerapi is the contract between the server (control plane) and
// workers. Workers never touch the database: they register, then call Sync
// in a loop. Sync carries the worker's heartbeat and observed state up, and
// long-polls for the desired state of every sandbox assigned to it.
//
// Register is authenticated with "Authorization: Bearer <join token>" (the
// server's --worker-token; `airlock up` generates one). The first
// registration of a worker id returns the worker's own secret
// (RegisterResponse.WorkerSecret), stored hashed on the server and bound to
// that id; every later call of that worker sends it: Sync and Wake as
// "Authorization: Bearer <worker secret>" (the join token is refused
// there), a re-registration as RegisterRequest.Secret (without it, an id
// that has a secret is refused, so a holder of the join token cannot take
// over another worker or redirect its data-plane URL).
//
//	POST /internal/v1/workers/register  RegisterRequest → RegisterResponse
//	POST /internal/v1/workers/{id}/sync?wait=25s&version=N  SyncRequest → SyncResponse
//
// Sync returns at once when the worker's observed state changed anything or
// when the assignment version differs from N; otherwise it waits up to wait
// for a change. The worker reconciles its runtime toward Assignments, level
// triggered: anything running locally that is not assigned is deleted. An
// assignment carries a SandboxSpec, the few fields of the sandbox the
// worker acts on, not the server's whole record.
//
// The server calls a worker's data plane (WorkerInfo.DataPlaneURL) only with
// data-plane tokens it signs itself (internal/token), e.g. to list commands.
//
// Both ends live here: Client is the worker's side, NewHandler serves the
// server's over a Server (internal/controller implements it; workerapitest
// is an in-memory one for worker tests), and routes.go names the worker
// API's and the data plane's routes and headers. Errors are model
// sentinels on both ends and cross as internal/httperr answers, so a
// Server's model.ErrConflict is the Client's model.ErrConflict.
package workerapi

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/airlock/airlock/internal/model"
)

// RegisterRequest announces a worker.
type RegisterRequest struct {
	ID            string   `json:"id"`
	DataPlaneURL  string   `json:"data_plane_url"`
	Runtimes      []string `json:"runtimes"`
	CapacityMiB   int      `json:"capacity_mib"`
	CapacityVCPUs int      `json:"capacity_vcpus"`
	// FreeMiB is the memory the worker's host has free for sandboxes now
	// (model.Worker.FreeMiB; nil: the worker does not measure it).
	FreeMiB   *int             `json:"free_mib,omitempty"`
	Templates []model.Template `json:"templates"` // templates present on this worker
	// Secret is the worker's own secret from its first registration; it
	// proves the id when the worker registers again.
	Secret string `json:"secret,omitempty"`
	// RuntimeInfo declares what each of Runtimes can do; a worker that
	// sends none (an older one) is taken to have model.LegacyRuntimeInfo.
	RuntimeInfo []model.RuntimeInfo `json:"runtime_info,omitempty"`
	// BlobStore is the shared blob store the worker pushes suspend
	// snapshots to and pulls them from (its URL without credentials; ""
	// none): model.Worker.BlobStore.
	BlobStore string `json:"blob_store,omitempty"`
}

// Offered is the runtimes r registers, with their powers: RuntimeInfo,
// else each of Runtimes as model.LegacyRuntimeInfo.
func (r RegisterRequest) Offered() []model.RuntimeInfo {
	if len(r.RuntimeInfo) > 0 {
		return r.RuntimeInfo
	}
	return model.NamedRuntimes(r.Runtimes...)
}

// RegisterResponse gives the worker what it needs to serve the data plane.
type RegisterResponse struct {
	WorkerID string `json:"worker_id"`
	// SigningKey verifies data-plane tokens (base64 of the HMAC key). It is
	// this worker's own key (token.WorkerKey), never the master.
	SigningKey string `json:"signing_key"`
	// WorkerSecret is set on a worker id's first registration only: the
	// worker's own credential, to keep (0600) and send from then on.
	WorkerSecret string `json:"worker_secret,omitempty"`
	// SigningKeys are the worker's keys by master key id: the current one
	// and, during a rotation's grace period, the previous one (SigningKey
	// is the current one, for older workers).
	SigningKeys []SigningKey `json:"signing_keys,omitempty"`
	// WorkerLossGraceS is how long, in seconds, the server lets a worker go
	// without a heartbeat before it counts it lost with its sandboxes
	// (which may then be restored elsewhere); 0: not said. A worker cut
	// off from every server for most of it pauses its sandboxes (self
	// fencing: see internal/worker's fence.go).
	WorkerLossGraceS int64 `json:"worker_loss_grace_s,omitempty"`
}

// SigningKey is one of a worker's data-plane verification keys.
type SigningKey struct {
	ID       string    `json:"id"`  // token.KeyID of the master key
	Key      string    `json:"key"` // base64 of the worker's derived key
	NotAfter time.Time `json:"not_after,omitzero"`
}

// FreeReportStepMiB is how far a worker's free memory (FreeMiB) must move
// to matter at once, on both ends: the worker syncs as soon as its
// measurement moved that far from its last report, and the server writes
// such a report at once (smaller moves wait for the next heartbeat write),
// waking placement when it rose. It is the start footprint of one more
// sandbox (scheduler.StartFootprintMiB), so that sandboxes pending for
// memory are placed within seconds of it coming free.
const FreeReportStepMiB = 64

// Observed is what the worker sees of one sandbox.
type Observed struct {
	SandboxID string             `json:"sandbox_id"`
	State     model.SandboxState `json:"state"` // starting, running, paused, suspending, suspended, waking, deleted (= gone), failed
	Reason    string             `json:"reason,omitempty"`
	// SnapshotID/SnapshotBytes name the complete, verified snapshot once the
	// sandbox is suspended.
	SnapshotID    string `json:"snapshot_id,omitempty"`
	SnapshotBytes int64  `json:"snapshot_bytes,omitempty"`
	// SnapshotShared: that snapshot is in the worker's blob store too
	// (model.Sandbox.SnapshotShared).
	SnapshotShared bool `json:"snapshot_shared,omitempty"`
	// LastActivity is the last data-plane use (a command attached or running
	// with a client attached, a file request); zero if none since start.
	LastActivity time.Time `json:"last_activity,omitzero"`
	// Task is the outcome of the sandbox's task (model.Sandbox.Task), sent
	// until the assignment no longer carries that task.
	Task *TaskResult `json:"task,omitempty"`
	// StartedFrom: how a starting sandbox was started (model.Started*).
	StartedFrom string `json:"started_from,omitempty"`
	// Action is the outcome of the worker's last suspend or wake of the
	// sandbox when it failed, sent while Reason is that failure's: the
	// server decides on it, not on Reason's text. Without it (a worker
	// before typed results) the server reads Reason as it always did.
	Action *ActionResult `json:"action,omitempty"`
}

// ActionResult is the typed outcome of one action the worker took on a
// sandbox on its own schedule (a suspend, a wake), as opposed to a task
// (TaskResult), which the assignment names.
type ActionResult struct {
	Kind model.OperationKind `json:"kind"` // model.OpSuspend or model.OpWake
	// OperationID is the operation the action served, when the worker
	// knows it; empty otherwise (suspends and wakes are level-triggered).
	OperationID string `json:"operation_id,omitempty"`
	// ErrorCode is the failure's internal/httperr code ("internal" when it
	// names no sentinel); empty when the action succeeded.
	ErrorCode string `json:"error_code,omitempty"`
	// Message says what failed (at most MaxReason bytes).
	Message string `json:"message,omitempty"`
}

// Failed reports whether r is a failed action of kind.
func (r *ActionResult) Failed(kind model.OperationKind) bool {
	return r != nil && r.Kind == kind && r.ErrorCode != ""
}

// TaskResult is the outcome of one task: Error is empty on success; a
// checkpoint names its committed snapshot.
type TaskResult struct {
	OperationID string `json:"operation_id"`
	Error       string `json:"error,omitempty"`
	SnapshotID  string `json:"snapshot_id,omitempty"`
	Bytes       int64  `json:"bytes,omitempty"`
}

// SyncRequest is a heartbeat with the observed state of every sandbox the
// worker knows about (assigned or not).
type SyncRequest struct {
	// Epoch names the worker process (random, new at each start) and Seq
	// numbers its Syncs, strictly increasing within the epoch. A Sync the
	// worker cut short (a change during the long poll) may reach the
	// server after its successor: a server that has seen a higher Seq of
	// the same epoch from the worker ignores the older Sync's
	// observations, templates and denials (SyncOrder) instead of letting
	// a stale state overwrite a newer one. Zero values: unordered (an
	// older worker).
	Epoch    string     `json:"epoch,omitempty"`
	Seq      uint64     `json:"seq,omitempty"`
	Observed []Observed `json:"observed"`
	// FreeMiB: as in RegisterRequest, measured as the Sync is sent.
	FreeMiB   *int             `json:"free_mib,omitempty"`
	Templates []model.Template `json:"templates,omitempty"`
	// NetDenied are egress denials since the last Sync, for the server to
	// publish as network.denied events (netlog.go; at most MaxNetDenials).
	NetDenied []NetDenial `json:"net_denied,omitempty"`
}

// Assignment is the desired state of one sandbox on this worker.
type Assignment struct {
	Sandbox SandboxSpec `json:"sandbox"`
	// Desired is running, paused, suspended or deleted. A suspended sandbox
	// with Desired running is woken from Sandbox.SnapshotID.
	Desired model.SandboxState `json:"desired"`
	// Egress is what the worker's gateway needs of the sandbox's org
	// beyond its policy (nil: a sandbox without a network policy).
	Egress *Egress `json:"egress,omitempty"`
	// Operation is the sandbox's newest open operation while the server
	// traces (nil otherwise): the worker's spans for the step that serves
	// it join the operation's trace (TraceParent, W3C). It is telemetry
	// only; the worker decides on Desired and Sandbox alone.
	Operation *OperationRef `json:"operation,omitempty"`
}

// OperationRef names the operation an assignment serves, for tracing.
type OperationRef struct {
	ID          string              `json:"id"`
	Kind        model.OperationKind `json:"kind"`
	OrgID       string              `json:"org_id,omitempty"`
	TraceParent string              `json:"trace_parent,omitempty"`
}

// Egress is a sandbox's interception material: its org's Airlock CA and
// the secrets its policy injects. It travels only in sync responses, and
// the worker holds it in memory: it is never written to disk, logged
// (String redacts it) or given to the guest, but for CACert, which the
// guest trusts.
type Egress struct {
	// CACert is the org's CA certificate (PEM), in the guest's trust store.
	CACert string `json:"ca_cert,omitempty"`
	// CAKey is the CA's private key (PEM), only for a policy with a
	// "tls": "intercept" rule.
	CAKey string `json:"ca_key,omitempty"`
	// Secrets are the values of the secrets the policy's inject rules
	// name, by name (a name the org has not set is absent).
	Secrets map[string]string `json:"secrets,omitempty"`
}

// String redacts the key and the secret values.
func (e *Egress) String() string {
	if e == nil {
		return "<nil>"
	}
	names := make([]string, 0, len(e.Secrets))
	for n := range e.Secrets {
		names = append(names, n)
	}
	slices.Sort(names)
	return fmt.Sprintf("egress{ca:%v key:%v secrets:%v}", e.CACert != "", e.CAKey != "", names)
}

// GoString redacts too (%#v).
func (e *Egress) GoString() string { return e.String() }

// Equal reports whether e and o carry the same material.
func (e *Egress) Equal(o *Egress) bool {
	if e == nil || o == nil {
		return e == o
	}
	return e.CACert == o.CACert && e.CAKey == o.CAKey && maps.Equal(e.Secrets, o.Secrets)
}

// SandboxSpec is what a worker is given of a sandbox: exactly the fields
// it acts on to start, pause, suspend, wake, checkpoint, roll back and
// build template images, and nothing else. The server's record
// (model.Sandbox: metadata, reasons, desired state, timestamps, pool,
// expiry) stays the server's; the worker has no use for it and a worker
// that never receives it cannot come to depend on it.
//
// Each field has the json tag it has in model.Sandbox, so the wire is
// model.Sandbox's less the other fields: a worker of the previous
// version, which decodes an assignment into a model.Sandbox, gets every
// field it reads, and a worker given a whole model.Sandbox (by a server
// of the previous version) ignores the rest. The same holds for the spec
// a worker records on disk for an interrupted rollback.
type SandboxSpec struct {
	ID             string             `json:"id"`
	Template       string             `json:"template"`        // the reference as requested, for messages and manifests
	TemplateDigest string             `json:"template_digest"` // picks the rootfs and the template image
	Runtime        string             `json:"runtime"`         // empty: the worker's default
	State          model.SandboxState `json:"state"`           // the server's view: whether it ever ran (plan.go rule 1)
	Env            map[string]string  `json:"env,omitempty"`   // merged into every command's environment
	Resources      model.Resources    `json:"resources"`
	// SnapshotID is the snapshot a suspended sandbox wakes from.
	SnapshotID string `json:"snapshot_id,omitempty"`
	// Task is the checkpoint or rollback to run (model.Sandbox.Task).
	Task *model.Task `json:"task,omitempty"`
	// Source is the snapshot a fork or an import starts from instead of
	// booting its template (model.Sandbox.Source).
	Source *model.Source `json:"source,omitempty"`
	// Network is the egress policy the worker's gateway applies (nil: the
	// worker's default).
	Network *model.SandboxNetwork `json:"network,omitempty"`
}

// SpecOf is the part of s a worker is given (SandboxSpec).
func SpecOf(s model.Sandbox) SandboxSpec {
	return SandboxSpec{
		ID:             s.ID,
		Template:       s.Template,
		TemplateDigest: s.TemplateDigest,
		Runtime:        s.Runtime,
		State:          s.State,
		Env:            s.Env,
		Resources:      s.Resources,
		SnapshotID:     s.SnapshotID,
		Task:           s.Task,
		Source:         s.Source,
		Network:        s.Network,
	}
}

// SyncResponse lists every sandbox assigned to the worker.
type SyncResponse struct {
	Version     int64        `json:"version"`
	Assignments []Assignment `json:"assignments"`
	// SigningKeys: as in RegisterResponse, so a rotation reaches running
	// workers.
	SigningKeys []SigningKey `json:"signing_keys,omitempty"`
	// RemoveTemplates are deleted templates the worker last reported
	// holding: it removes each copy imported before DeletedAt (its
	// catalog entry, its ext4 image, its template images) unless a local
	// sandbox still uses it, and stops reporting it.
	RemoveTemplates []TemplateRemoval `json:"remove_templates,omitempty"`
}

// TemplateRemoval is a template deletion as a worker acts on it.
type TemplateRemoval struct {
	Digest    string    `json:"digest"`
	DeletedAt time.Time `json:"deleted_at"`
}

// WakeRequest asks the server to wake (or resume) a sandbox because a
// data-plane request arrived for it while it was suspended or paused:
//
//	POST /internal/v1/workers/{id}/wake  WakeRequest → 202 {"operation": model.Operation}
//
// 409 when the sandbox opted out of auto-wake (model.Sandbox.NoAutoWake) or
// cannot be woken from its state; the worker then fails the data-plane
// request with that message.
type WakeRequest struct {
	SandboxID string `json:"sandbox_id"`
}

// SyncOrder tells stale Syncs from current ones per worker (see
// SyncRequest.Epoch); a server keeps one. It holds what the Syncs of one
// server process saw: a worker whose Syncs alternate between servers is
// ordered per server only.
type SyncOrder struct {
	mu   sync.Mutex
	last map[string]syncMark
}

type syncMark struct {
	epoch string
	seq   uint64
}

// Stale records req of worker id and reports whether a Sync after it (a
// higher Seq of the same epoch) was seen already. Unnumbered Syncs are
// never stale; a new epoch (the worker restarted) starts over.
func (o *SyncOrder) Stale(id string, req SyncRequest) bool {
	if req.Epoch == "" || req.Seq == 0 {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.last == nil {
		o.last = map[string]syncMark{}
	}
	m, ok := o.last[id]
	if ok && m.epoch == req.Epoch && req.Seq <= m.seq {
		return true
	}
	o.last[id] = syncMark{epoch: req.Epoch, seq: req.Seq}
	return false
}
