package client

import (
	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
)

// The types of the API, named here so that a program outside this module
// (which cannot import internal/) can use every method of Client: they
// are aliases of the types the server encodes, so the two cannot disagree
// on a JSON name. TestPublicSurfaceNeedsNoInternal fails when an exported
// method reaches an internal type without an alias here.

// Sandboxes and operations.
type (
	Sandbox        = model.Sandbox
	SandboxState   = model.SandboxState
	Resources      = model.Resources
	Checkpoint     = model.Checkpoint
	ExpiryAction   = model.ExpiryAction
	Source         = model.Source
	Task           = model.Task
	Operation      = model.Operation
	OperationKind  = model.OperationKind
	OperationState = model.OperationState
	Event          = model.Event
	PTYSize        = model.PTYSize
)

// Commands and files (the data plane).
type (
	Exit                 = agentapi.Exit
	ProcessInfo          = agentapi.ProcessInfo
	FileInfo             = agentapi.FileInfo
	ListCommandsResponse = apitypes.ListCommandsResponse
)

// Templates and builds.
type (
	Template        = model.Template
	TemplateDetail  = apitypes.Template
	TemplateConfig  = model.TemplateConfig
	Build           = model.Build
	BuildSpec       = model.BuildSpec
	BuildState      = model.BuildState
	BuildStep       = model.BuildStep
	BuildStepReport = model.BuildStepReport
	BuildEvent      = model.BuildEvent
)

// Orgs, keys, quotas, pools and secrets.
type (
	Org         = model.Org
	OrgDetail   = apitypes.Org
	OrgUsage    = apitypes.OrgUsage
	OrgNetwork  = model.OrgNetwork
	Quotas      = model.Quotas
	QuotasPatch = apitypes.QuotasPatch
	APIKey      = model.APIKey
	PoolSpec    = model.Pool
	Secret      = model.Secret
)

// Workers (operators).
type (
	Worker       = apitypes.Worker
	WorkerRecord = model.Worker
	RuntimeInfo  = model.RuntimeInfo
	RuntimeCaps  = model.RuntimeCaps
)

// Network policies and the network log.
type (
	SandboxNetwork        = model.SandboxNetwork
	NetworkRequest        = apitypes.NetworkRequest
	NetworkProfile        = model.NetworkProfile
	NetworkProfileRequest = apitypes.NetworkProfileRequest
	NetworkLogResponse    = apitypes.NetworkLogResponse
	NetDecision           = model.NetDecision
)

// Sandbox states (Sandbox.State, Sandbox.DesiredState).
const (
	StatePending    = model.StatePending
	StateStarting   = model.StateStarting
	StateRunning    = model.StateRunning
	StatePaused     = model.StatePaused
	StateSuspending = model.StateSuspending
	StateSuspended  = model.StateSuspended
	StateWaking     = model.StateWaking
	StateDeleting   = model.StateDeleting
	StateDeleted    = model.StateDeleted
	StateFailed     = model.StateFailed
	StateLost       = model.StateLost
)

// Operation kinds and states.
const (
	OpCreate     = model.OpCreate
	OpDelete     = model.OpDelete
	OpPause      = model.OpPause
	OpResume     = model.OpResume
	OpSuspend    = model.OpSuspend
	OpWake       = model.OpWake
	OpCheckpoint = model.OpCheckpoint
	OpRollback   = model.OpRollback
	OpFork       = model.OpFork

	OpPending   = model.OpPending
	OpRunning   = model.OpRunning
	OpSucceeded = model.OpSucceeded
	OpFailed    = model.OpFailed
	OpCancelled = model.OpCancelled
)

// Build states, and what a sandbox does when its timeout_s expires.
const (
	BuildWaiting  = model.BuildWaiting
	BuildBuilding = model.BuildBuilding
	BuildReady    = model.BuildReady
	BuildFailed   = model.BuildFailed

	ExpiryDelete  = model.ExpiryDelete
	ExpirySuspend = model.ExpirySuspend
)

// Errors the API's answers match with errors.Is (see APIError.Is):
// errors.Is(err, client.ErrNotFound) for any 404, and so on.
var (
	ErrNotFound      = model.ErrNotFound      // 404
	ErrConflict      = model.ErrConflict      // 409: the state does not allow it, or another operation is in progress
	ErrInvalid       = model.ErrInvalid       // 400 or 422: the request says what to fix
	ErrUnauthorized  = model.ErrUnauthorized  // 401
	ErrForbidden     = model.ErrForbidden     // 403
	ErrTooLarge      = model.ErrTooLarge      // 413
	ErrQuotaExceeded = model.ErrQuotaExceeded // 429 quota_exceeded
	ErrRateLimited   = model.ErrRateLimited   // 429 rate_limited
	ErrUnavailable   = model.ErrUnavailable   // 503: retry
)

// Frame kinds of a command attachment (CommandSession.Next and the
// attach WebSocket; docs/api.md "The attach WebSocket").
const (
	FrameStdout     = agentapi.FrameStdout
	FrameStderr     = agentapi.FrameStderr
	FrameExit       = agentapi.FrameExit
	FrameStarted    = agentapi.FrameStarted
	FrameError      = agentapi.FrameError
	FrameStdin      = agentapi.FrameStdin
	FrameStdinClose = agentapi.FrameStdinClose
	FrameSignal     = agentapi.FrameSignal
	FrameResize     = agentapi.FrameResize
)
