// Package apitypes holds the wire shapes of the native REST API (/v1) that
// are not model records: request bodies, response envelopes and the error
// body. The server (internal/api, internal/service) and the Go client
// (client) share them, so the two cannot disagree on JSON names.
// It imports only internal/model and internal/agentapi.
package apitypes

import (
	"encoding/json"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/model"
)

// CreateSandboxRequest is the body of POST /v1/sandboxes. Every field is
// optional: template defaults to "base", resources to 1 vCPU and 512 MiB.
type CreateSandboxRequest struct {
	Template  string            `json:"template,omitempty"`
	Runtime   string            `json:"runtime,omitempty"`
	Resources model.Resources   `json:"resources,omitzero"`
	Env       map[string]string `json:"env,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	TimeoutS  int               `json:"timeout_s,omitempty"`
	// IdleSuspendAfterS suspends the sandbox after this many seconds
	// without activity (0: never; absent: the org's setting, else 6 h).
	IdleSuspendAfterS *int64 `json:"idle_suspend_after_s,omitempty"`
	// AutoWake wakes the sandbox when a command or file request arrives
	// while it is paused or suspended (absent: true).
	AutoWake *bool `json:"auto_wake,omitempty"`
	// PublicTraffic lets anyone who knows the sandbox id reach its ports
	// through the server's sandbox router without the traffic token
	// (absent: false; GET /v1/sandboxes/{id} returns the token).
	PublicTraffic bool `json:"public_traffic,omitempty"`
	// Network chooses the sandbox's egress (absent: its org's default
	// profile; docs/network.md).
	Network *NetworkRequest `json:"network,omitempty"`

	// FromCheckpoint forks: Count sandboxes (default 1, at most MaxForks)
	// start from that checkpoint of a sandbox of the caller's org, on that
	// sandbox's worker, with its template, runtime and resources (template,
	// runtime and resources must be absent). Feature gate "snapshots".
	FromCheckpoint *CheckpointRef `json:"from_checkpoint,omitempty"`
	Count          int            `json:"count,omitempty"`
	// Import names the multipart/form-data part that holds a checkpoint
	// archive (from GET /v1/sandboxes/{id}/checkpoints/{name}/export); the
	// sandbox starts from it, with the archive's template and resources.
	// Only in a multipart request whose first part, "request", is this
	// JSON. Feature gate "snapshots".
	Import string `json:"import,omitempty"`
}

// NetworkRequest chooses a sandbox's egress: a profile, or an inline
// NetworkPolicyV1 (if the org may send its own). It is the network field
// of a create and the body of PUT /v1/sandboxes/{id}/network.
type NetworkRequest struct {
	Profile string          `json:"profile,omitempty"`
	Policy  json.RawMessage `json:"policy,omitempty"`
}

// NetworkProfileRequest is the body of PUT /v1/network-profiles/{name}.
type NetworkProfileRequest struct {
	Description string          `json:"description,omitempty"`
	Policy      json.RawMessage `json:"policy"`
}

// SecretRequest is the body of PUT /v1/secrets/{name}.
type SecretRequest struct {
	Value string `json:"value"`
}

// SecretsResponse is the body of GET /v1/secrets: names and times, never
// values.
type SecretsResponse struct {
	Secrets []model.Secret `json:"secrets"`
}

// NetworkProfilesResponse is the body of GET /v1/network-profiles.
type NetworkProfilesResponse struct {
	Profiles []model.NetworkProfile `json:"profiles"`
}

// SandboxResponse is the body of GET /v1/sandboxes/{id}: the sandbox and,
// unless it has public traffic, the traffic token its ports need (header
// E2b-Traffic-Access-Token).
type SandboxResponse struct {
	model.Sandbox
	TrafficToken string `json:"traffic_token,omitempty"`
}

// MaxForks bounds CreateSandboxRequest.Count.
const MaxForks = 32

// CheckpointRef names one checkpoint of one sandbox.
type CheckpointRef struct {
	SandboxID  string `json:"sandbox_id"`
	Checkpoint string `json:"checkpoint"`
}

// CreateSandboxResponse is the 202 body of POST /v1/sandboxes. A fork
// request lists every sandbox it created in Forks (the first one is also
// Sandbox and Operation).
type CreateSandboxResponse struct {
	Sandbox   model.Sandbox           `json:"sandbox"`
	Operation model.Operation         `json:"operation"`
	Forks     []CreateSandboxResponse `json:"forks,omitempty"`
}

// CreateCheckpointRequest is the body of POST /v1/sandboxes/{id}/checkpoints
// (202 OperationResponse). Name: 1-63 of a-z, 0-9, '.', '_', '-', starting
// with a letter or digit; unique within the sandbox.
type CreateCheckpointRequest struct {
	Name string `json:"name"`
}

// ListCheckpointsResponse is the body of GET /v1/sandboxes/{id}/checkpoints.
type ListCheckpointsResponse struct {
	Checkpoints []model.Checkpoint `json:"checkpoints"`
}

// RollbackRequest is the body of POST /v1/sandboxes/{id}/rollback (202
// OperationResponse): the sandbox's memory, processes and files go back to
// checkpoint Checkpoint; it is running afterwards.
type RollbackRequest struct {
	Checkpoint string `json:"checkpoint"`
}

// OperationResponse is the 202 body of DELETE /v1/sandboxes/{id} and of
// POST /v1/sandboxes/{id}/pause|resume|suspend|wake.
type OperationResponse struct {
	Operation model.Operation `json:"operation"`
}

// SandboxFilter selects sandboxes in GET /v1/sandboxes (query parameters
// state=…&state=…, metadata=k=v&metadata=…, cursor, limit).
type SandboxFilter struct {
	States   []model.SandboxState
	Metadata map[string]string
	Cursor   string
	Limit    int
}

// ListSandboxesResponse is the body of GET /v1/sandboxes. NextCursor is
// empty on the last page.
type ListSandboxesResponse struct {
	Sandboxes  []model.Sandbox `json:"sandboxes"`
	NextCursor string          `json:"next_cursor,omitempty"`
}

// CreateCommandRequest is the body of POST /v1/sandboxes/{id}/commands.
// Exactly one of Cmd (run by /bin/bash -lc) and Argv is set.
type CreateCommandRequest struct {
	Cmd      string            `json:"cmd,omitempty"`
	Argv     []string          `json:"argv,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Cwd      string            `json:"cwd,omitempty"`
	User     string            `json:"user,omitempty"`
	Stdin    bool              `json:"stdin,omitempty"`
	TimeoutS int               `json:"timeout_s,omitempty"`
	// PTY runs the command on a pseudo-terminal of this size: stdin is
	// implied, the terminal's output arrives as stdout frames, and resize
	// frames (agentapi.FrameResize) change the size.
	PTY *model.PTYSize `json:"pty,omitempty"`
}

// CommandSession is the 201 body of POST /v1/sandboxes/{id}/commands: open a
// WebSocket to AttachURL with "Authorization: Bearer <Token>".
type CommandSession struct {
	ID        string    `json:"id"`
	AttachURL string    `json:"attach_url"`
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}

// ListCommandsResponse is the body of GET /v1/sandboxes/{id}/commands
// (?limit=, ?cursor=). NextCursor is set when more commands remain: pass
// it as ?cursor= for the next page.
type ListCommandsResponse struct {
	Commands   []agentapi.ProcessInfo `json:"commands"`
	NextCursor string                 `json:"next_cursor,omitempty"`
}

// FilesSession is the body of POST /v1/sandboxes/{id}/files/session: the
// data-plane base URL for the sandbox's files and a files-scoped token.
type FilesSession struct {
	URL       string    `json:"url"`
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}

// ListTemplatesResponse is the body of GET /v1/templates.
type ListTemplatesResponse struct {
	Templates []model.Template `json:"templates"`
}

// Template is the body of GET /v1/templates/{ref} and of the 202 answer
// of DELETE /v1/templates/{ref}: the template and the workers that hold it
// (after a DELETE: the workers that remove it at their next sync).
type Template struct {
	model.Template
	Workers []string `json:"workers"`
}

// CreateOrgRequest is the body of POST /v1/orgs.
type CreateOrgRequest struct {
	Name string `json:"name"`
}

// ListOrgsResponse is the body of GET /v1/orgs.
type ListOrgsResponse struct {
	Orgs []model.Org `json:"orgs"`
}

// UpdateOrgRequest is the body of PATCH /v1/orgs/{id}; absent fields are
// left as they are.
type UpdateOrgRequest struct {
	// Features replaces the org's feature gates (known: "snapshots");
	// operators only.
	Features *[]string `json:"features,omitempty"`
	// IdleSuspendAfterS is the idle auto-suspend delay of the org's new
	// sandboxes in seconds: 0 never suspends, -1 returns to the default (6 h).
	IdleSuspendAfterS *int64 `json:"idle_suspend_after_s,omitempty"`
	// Quotas sets the org's quotas, field by field (absent fields are left
	// as they are; 0 is unlimited); operators only.
	Quotas *QuotasPatch `json:"quotas,omitempty"`
	// Network replaces the org's network settings (profiles it may use,
	// its default, inline policies); operators only.
	Network *model.OrgNetwork `json:"network,omitempty"`
}

// QuotasPatch is a partial model.Quotas.
type QuotasPatch struct {
	Sandboxes   *int `json:"sandboxes,omitempty"`
	VCPUs       *int `json:"vcpus,omitempty"`
	MemoryMiB   *int `json:"memory_mib,omitempty"`
	DiskMiB     *int `json:"disk_mib,omitempty"`
	Checkpoints *int `json:"checkpoints,omitempty"`
	Transfers   *int `json:"transfers,omitempty"`
}

// Org is an org as GET /v1/orgs/{id} and PATCH return it: its settings,
// its quotas and what it uses of them.
type Org struct {
	model.Org
	Usage OrgUsage `json:"usage"`
}

// Worker is one registered worker as GET /v1/workers shows it (operators).
type Worker struct {
	model.Worker
	// State is ready (fresh heartbeat, takes new sandboxes), cordoned
	// (takes none) or stale (no heartbeat within the heartbeat TTL).
	State string `json:"state"`
	// Sandboxes counts the worker's sandboxes by state (deleted ones
	// excluded).
	Sandboxes map[model.SandboxState]int `json:"sandboxes"`
	// UsedMiB and UsedVCPUs are what they reserve of the capacity.
	UsedMiB   int `json:"used_mib"`
	UsedVCPUs int `json:"used_vcpus"`
}

// ListWorkersResponse is the body of GET /v1/workers.
type ListWorkersResponse struct {
	Workers []Worker `json:"workers"`
}

// OrgUsage is what an org's sandboxes hold, in the units of model.Quotas.
type OrgUsage struct {
	Sandboxes   int `json:"sandboxes"`
	VCPUs       int `json:"vcpus"`
	MemoryMiB   int `json:"memory_mib"`
	DiskMiB     int `json:"disk_mib"`
	Checkpoints int `json:"checkpoints"`
	Transfers   int `json:"transfers"`
}

// CreateKeyRequest is the body of POST /v1/orgs/{id}/keys.
type CreateKeyRequest struct {
	Name  string `json:"name,omitempty"`
	Admin bool   `json:"admin,omitempty"`
	// E2B issues an E2B-shaped secret (e2b_…) for the E2B SDKs.
	E2B bool `json:"e2b,omitempty"`
	// ExpiresAt, when set, is when the key stops working (RFC 3339, in the
	// future, at most 10 years away); absent: the key works until revoked.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// ListKeysResponse is the body of GET /v1/orgs/{id}/keys: every key of the
// org, revoked and expired ones included, without secrets.
type ListKeysResponse struct {
	Keys []model.APIKey `json:"keys"`
}

// CreateKeyResponse is the 201 body of POST /v1/orgs/{id}/keys. Secret is
// shown only here; the server keeps only its hash.
type CreateKeyResponse struct {
	Key    model.APIKey `json:"key"`
	Secret string       `json:"secret"`
}

// Health is the body of GET /healthz.
type Health struct {
	Status string `json:"status"`           // "ok" or "unavailable"
	Reason string `json:"reason,omitempty"` // why not ok
}

// Error codes in ErrorBody.Code.
const (
	CodeBadRequest    = "bad_request"
	CodeUnauthorized  = "unauthorized"
	CodeForbidden     = "forbidden"
	CodeNotFound      = "not_found"
	CodeMethod        = "method_not_allowed"
	CodeConflict      = "conflict"
	CodeTooLarge      = "too_large"
	CodeUnprocessable = "unprocessable"
	CodeRateLimited   = "rate_limited"
	CodeQuotaExceeded = "quota_exceeded"
	CodeUnavailable   = "unavailable"
	CodeInternal      = "internal"
)

// ErrorResponse is the body of every error response.
type ErrorResponse struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody says what went wrong and, where it can, what to do next.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// SetPoolRequest is the body of PUT /v1/pools/{template}. Resources default
// to 1 vCPU / 512 MiB: only creates that ask for exactly these claim from
// the pool.
type SetPoolRequest struct {
	Size      int             `json:"size"`
	Resources model.Resources `json:"resources,omitzero"`
}

// Pool is one warm pool as the admin API shows it: its configuration and
// how many members are ready (running) or on their way (pending, starting).
type Pool struct {
	model.Pool
	Ready    int `json:"ready"`
	Starting int `json:"starting"`
}

// PoolList is the body of GET /v1/pools.
type PoolList struct {
	Pools []Pool `json:"pools"`
}

// BuildFile is the answer of PUT /v1/templates/files/{hash}: the hash the
// file is stored under and its size in bytes.
type BuildFile struct {
	Hash string `json:"hash"`
	Size int64  `json:"size"`
}

// ListBuildsResponse is the body of GET /v1/templates/builds.
type ListBuildsResponse struct {
	Builds []model.Build `json:"builds"`
}

// BuildEvents is the body of GET /v1/templates/builds/{id}/events: the
// events after the asked Seq, oldest first, and the build's state when
// they were read (follow until it is ready or failed and events is
// empty).
type BuildEvents struct {
	Events []model.BuildEvent `json:"events"`
	State  model.BuildState   `json:"state"`
}
