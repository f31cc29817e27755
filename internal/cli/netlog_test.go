package cli

import (
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
)

// TestNetworkLogCommand: `sandbox network log` against a real API (no
// worker: the sandbox stays pending, on no worker) prints the empty log's
// note, --json the API's page; bad flags are usage errors, an unknown
// sandbox a failure.
func TestNetworkLogCommand(t *testing.T) {
	e := newAPIEnv(t)
	e.mustRun("sandbox", "create", "--no-wait")
	sbs := decodeJSON[[]model.Sandbox](t, e.mustRun("sandbox", "ls", "--json"))
	if len(sbs) != 1 {
		t.Fatalf("sandboxes: %d", len(sbs))
	}
	sid := sbs[0].ID

	code, out, errOut := e.run("sandbox", "network", "log", sid)
	if code != 0 || out != "" || !strings.Contains(errOut, "note: sandbox "+sid+" is pending and on no worker") {
		t.Errorf("log of a pending sandbox: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	lg := decodeJSON[apitypes.NetworkLogResponse](t, e.mustRun("sandbox", "network", "log", sid, "--json", "--after", "3", "--limit", "10"))
	if lg.Entries == nil || len(lg.Entries) != 0 || lg.Next != 3 || lg.Note == "" {
		t.Errorf("--json: %+v", lg)
	}
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"sandbox", "network", "log", sid, "--after", "-1"}, ExitUsage, "--after"},
		{[]string{"sandbox", "network", "log", sid, "--limit", "-5"}, ExitUsage, "--limit"},
		{[]string{"sandbox", "network", "log", sid, "--profile", "none"}, ExitUsage, "for set"},
		{[]string{"sandbox", "network", "log", sid, "--limit", "5000"}, ExitError, "limit 5000"},
		{[]string{"sandbox", "network", "log", "sb-nope"}, ExitError, "not found"},
		{[]string{"sandbox", "network", "watch", sid}, ExitUsage, "log <sandbox-id>"},
	} {
		if code, _, errOut := e.run(c.args...); code != c.code || !strings.Contains(errOut, c.msg) {
			t.Errorf("airlock %s: exit %d, stderr %q; want exit %d naming %q", strings.Join(c.args, " "), code, errOut, c.code, c.msg)
		}
	}
}
