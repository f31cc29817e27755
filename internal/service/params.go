package service

import (
	"time"

	"github.com/airlock/airlock/internal/model"
)

// The service's own parameter and result types. Adapters translate their
// wire types (api/apitypes for /v1, the E2B shapes in e2bcompat) into these,
// so that no wire format reaches the core and a wire change is an adapter
// change. Field names follow the /v1 fields they usually come from.

// CreateParams is what a sandbox create, fork or import asks for.
type CreateParams struct {
	Template  string
	Runtime   string
	Resources model.Resources
	Env       map[string]string
	Metadata  map[string]string
	// TimeoutS is the sandbox's lifetime in seconds (0: no expiry).
	TimeoutS int
	// OnExpiry is what the controller does when the lifetime ends (empty:
	// delete; model.ExpirySuspend: suspend, E2B's autoPause).
	OnExpiry model.ExpiryAction
	// IdleSuspendAfterS suspends the sandbox after this many seconds
	// without activity (0: never; nil: the org's setting, else 6 h).
	IdleSuspendAfterS *int64
	// AutoWake wakes the sandbox on a command or file request while it is
	// paused or suspended (nil: true).
	AutoWake *bool
	// PublicTraffic lets its ports be reached without the traffic token.
	PublicTraffic bool
	// Network chooses its egress policy (nil: the org's default profile).
	Network *NetworkParams

	// FromCheckpoint and Count are for ForkSandboxes only: Count sandboxes
	// (0: 1, at most MaxForks) start from that checkpoint.
	FromCheckpoint *CheckpointRef
	Count          int
	// Import names the part that holds the archive of an import; set, it
	// makes a create request an import (which the adapter routes).
	Import string
}

// MaxForks bounds CreateParams.Count.
const MaxForks = 32

// CheckpointRef names one checkpoint of one sandbox.
type CheckpointRef struct {
	SandboxID  string
	Checkpoint string
}

// Created is one sandbox a fork created and its create operation.
type Created struct {
	Sandbox   model.Sandbox
	Operation model.Operation
}

// ListParams selects a page of sandboxes: States (empty: every state but
// deleted), Metadata pairs that must all match, the Cursor of the previous
// page's next cursor and Limit (0: DefaultListLimit).
type ListParams struct {
	States   []model.SandboxState
	Metadata map[string]string
	// Templates and CreatedAfter narrow the list before it is paged.
	Templates    []string
	CreatedAfter time.Time
	Cursor       string
	Limit        int
	// Descending lists newest first (default: oldest first).
	Descending bool
}

// CommandParams is a command to run: exactly one of Cmd (run by
// /bin/bash -lc) and Argv is set.
type CommandParams struct {
	Cmd      string
	Argv     []string
	Env      map[string]string
	Cwd      string
	User     string
	Stdin    bool
	TimeoutS int
	PTY      *model.PTYSize // run on a pseudo-terminal of this size
}

// CommandSession is a prepared command: open a WebSocket to AttachURL with
// Token as the bearer token.
type CommandSession struct {
	ID        string
	AttachURL string
	Token     string
	ExpiresAt time.Time
}

// FilesSession is the data-plane base URL for a sandbox's files and a
// files-scoped token.
type FilesSession struct {
	URL       string
	Token     string
	ExpiresAt time.Time
}

// OrgUpdate changes an org's settings; nil fields are left as they are.
type OrgUpdate struct {
	// Features replaces the org's feature gates; operators only.
	Features *[]string
	// IdleSuspendAfterS: 0 never suspends, -1 returns to the default.
	IdleSuspendAfterS *int64
	// Quotas sets quotas field by field (0 is unlimited); operators only.
	Quotas *QuotasPatch
	// Network replaces the org's network settings; operators only.
	Network *model.OrgNetwork
}

// QuotasPatch is a partial model.Quotas: nil fields are left as they are.
type QuotasPatch struct {
	Sandboxes   *int
	VCPUs       *int
	MemoryMiB   *int
	DiskMiB     *int
	Checkpoints *int
	Transfers   *int
}

// Usage is what an org's sandboxes hold, in the units of model.Quotas.
type Usage struct {
	Sandboxes   int
	VCPUs       int
	MemoryMiB   int
	DiskMiB     int
	Checkpoints int
	Transfers   int
}

// PoolParams configures a warm pool: Size members with Resources.
type PoolParams struct {
	Size      int
	Resources model.Resources
}

// PoolStatus is a warm pool's configuration and how many members are ready
// (running) or on their way (pending, starting).
type PoolStatus struct {
	model.Pool
	Ready    int
	Starting int
}
