package workerapi_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/airlock/airlock/internal/workerapi"
)

// TestPathsMatchRoutes: every path a caller builds reaches the route the
// worker (or the server) serves, with the same path values.
func TestPathsMatchRoutes(t *testing.T) {
	const sid, cid, snap = "sb-1", "cmd-2", "snap-3"
	for _, c := range []struct {
		route, method, path string
		values              map[string]string
	}{
		{workerapi.RouteRegister, "POST", workerapi.PathRegister, nil},
		{workerapi.RouteSync, "POST", workerapi.SyncPath("w.1"), map[string]string{"id": "w.1"}},
		{workerapi.RouteWake, "POST", workerapi.WakePath("w.1"), map[string]string{"id": "w.1"}},
		{workerapi.RouteListCommands, "GET", workerapi.CommandsPath(sid), map[string]string{"sid": sid}},
		{workerapi.RouteAttach, "GET", workerapi.AttachPath(sid, cid), map[string]string{"sid": sid, "cid": cid}},
		{workerapi.RouteExport, "GET", workerapi.ExportPath(sid, snap), map[string]string{"sid": sid, "snap": snap}},
		{workerapi.RouteImport, "POST", workerapi.SnapshotsPath(sid), map[string]string{"sid": sid}},
		{workerapi.RouteDropSnapshots, "DELETE", workerapi.SnapshotsPath(sid), map[string]string{"sid": sid}},
		{workerapi.RouteE2B, "GET", workerapi.E2BPath(sid, 49983) + "/health", map[string]string{"sid": sid, "port": "49983", "path": "health"}},
	} {
		mux := http.NewServeMux()
		hit := false
		mux.HandleFunc(c.route, func(w http.ResponseWriter, r *http.Request) {
			hit = true
			for k, v := range c.values {
				if got := r.PathValue(k); got != v {
					t.Errorf("%s: %s = %q, want %q", c.route, k, got, v)
				}
			}
		})
		mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(c.method, c.path, nil))
		if !hit {
			t.Errorf("%s %s does not reach %s", c.method, c.path, c.route)
		}
	}
}
