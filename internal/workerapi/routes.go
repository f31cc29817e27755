package workerapi

import (
	"net/url"
	"strconv"
)

// Worker API routes (server side; see the package doc).
const (
	// PathRegister is where a worker registers.
	PathRegister = "/internal/v1/workers/register"
	// RouteRegister, RouteSync and RouteWake are the handler's patterns.
	RouteRegister = "POST " + PathRegister
	RouteSync     = "POST /internal/v1/workers/{id}/sync"
	RouteWake     = "POST /internal/v1/workers/{id}/wake"
)

// SyncPath is the path of worker id's Sync.
func SyncPath(id string) string { return "/internal/v1/workers/" + url.PathEscape(id) + "/sync" }

// WakePath is the path of worker id's Wake.
func WakePath(id string) string { return "/internal/v1/workers/" + url.PathEscape(id) + "/wake" }

// The worker's data plane (served by internal/worker, called by the
// server's service and E2B proxy and by client). Every call
// carries a data-plane token the server signed (internal/token).
const (
	// HeaderDataPlaneToken carries the envd-scope token of a request on
	// the /e2b/ route (the server's E2B proxy sets it).
	HeaderDataPlaneToken = "X-Airlock-Dataplane-Token"
	// PathE2BPrefix starts the route of E2B traffic to a sandbox's port:
	// /e2b/{sid}/{port}/….
	PathE2BPrefix = "/e2b/"

	// DataPlaneSandbox is the pattern of a sandbox's data-plane root.
	DataPlaneSandbox = "/v1/sandboxes/{sid}"
	// Routes of the data plane the server calls (the file API's routes
	// are internal/worker's, called by client under FilesPath).
	RouteListCommands  = "GET " + DataPlaneSandbox + "/commands"
	RouteAttach        = "GET " + DataPlaneSandbox + "/commands/{cid}/attach"
	RouteExport        = "GET " + DataPlaneSandbox + "/snapshots/{snap}/export"
	RouteImport        = "POST " + DataPlaneSandbox + "/snapshots"
	RouteDropSnapshots = "DELETE " + DataPlaneSandbox + "/snapshots"
	RouteDropSnapshot  = "DELETE " + DataPlaneSandbox + "/snapshots/{snap}"
	RouteE2B           = PathE2BPrefix + "{sid}/{port}/{path...}"
)

// SandboxPath is the data-plane path of sandbox sid, followed by rest
// ("/commands", "/files", …; "" for the sandbox itself).
func SandboxPath(sid, rest string) string { return "/v1/sandboxes/" + url.PathEscape(sid) + rest }

// CommandsPath lists (GET) and runs (POST) sandbox sid's commands.
func CommandsPath(sid string) string { return SandboxPath(sid, "/commands") }

// AttachPath attaches (WebSocket) to command cid of sandbox sid.
func AttachPath(sid, cid string) string {
	return SandboxPath(sid, "/commands/"+url.PathEscape(cid)+"/attach")
}

// SnapshotsPath imports (POST) and drops (DELETE) sandbox sid's snapshots.
func SnapshotsPath(sid string) string { return SandboxPath(sid, "/snapshots") }

// SnapshotPath is snapshot snap of sandbox sid (DELETE drops it).
func SnapshotPath(sid, snap string) string {
	return SandboxPath(sid, "/snapshots/"+url.PathEscape(snap))
}

// ExportPath exports snapshot snap of sandbox sid (GET).
func ExportPath(sid, snap string) string {
	return SandboxPath(sid, "/snapshots/"+url.PathEscape(snap)+"/export")
}

// FilesPath is the file API root of sandbox sid.
func FilesPath(sid string) string { return SandboxPath(sid, "/files") }

// E2BPath is the data-plane path of sandbox sid's port, to which the
// proxied request's path is appended.
func E2BPath(sid string, port int) string { return PathE2BPrefix + sid + "/" + strconv.Itoa(port) }
