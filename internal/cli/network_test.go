package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/model"
)

// TestNetworkCommands: network-profile set/ls/rm, sandbox create
// --network-profile and sandbox network get/set, and the errors a user
// gets for bad input.
func TestNetworkCommands(t *testing.T) {
	e := newAPIEnv(t)
	dir := t.TempDir()
	policy := filepath.Join(dir, "ci.json")
	if err := os.WriteFile(policy, []byte(`{"version":1,"default":"deny","rules":[{"action":"allow","domains":["pypi.example.org"],"ports":[443]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"version":1,"default":"maybe"}`), 0o600)

	if out := e.mustRun("network-profile", "set", "ci", "--policy", policy, "--description", "CI boxes"); !strings.Contains(out, "network profile ci set") {
		t.Fatalf("network-profile set: %q", out)
	}
	if code, _, errOut := e.run("network-profile", "set", "ci2", "--policy", bad); code != ExitError || !strings.Contains(errOut, "default") {
		t.Errorf("a bad policy: exit %d, %q", code, errOut)
	}
	out := e.mustRun("network-profile", "ls")
	for _, want := range []string{"none", "public", "ci", "CI boxes"} {
		if !strings.Contains(out, want) {
			t.Errorf("network-profile ls lacks %q:\n%s", want, out)
		}
	}
	id := strings.TrimSpace(e.mustRun("sandbox", "create", "--no-wait", "--network-profile", "ci"))
	if !strings.HasPrefix(id, "op-") {
		// --no-wait prints the operation id; find the sandbox.
		t.Logf("create printed %q", id)
	}
	sbs := decodeJSON[[]model.Sandbox](t, e.mustRun("sandbox", "ls", "--json"))
	if len(sbs) != 1 {
		t.Fatalf("sandboxes: %d", len(sbs))
	}
	sid := sbs[0].ID
	n := decodeJSON[model.SandboxNetwork](t, e.mustRun("sandbox", "network", "get", sid, "--json"))
	if n.Profile != "ci" || !strings.Contains(string(n.Policy), "pypi.example.org") {
		t.Fatalf("network of the sandbox: %+v", n)
	}
	if out := e.mustRun("sandbox", "network", "set", sid, "--profile", "none"); !strings.Contains(out, "profile none") {
		t.Errorf("sandbox network set: %q", out)
	}
	if out := e.mustRun("sandbox", "network", "set", sid, "--policy", policy); !strings.Contains(out, "inline policy") {
		t.Errorf("sandbox network set --policy: %q", out)
	}
	if code, _, errOut := e.run("sandbox", "network", "set", sid); code != ExitUsage || !strings.Contains(errOut, "--profile or --policy") {
		t.Errorf("set without a policy: exit %d, %q", code, errOut)
	}
	if code, _, errOut := e.run("sandbox", "create", "--network-profile", "ci", "--network-policy", policy); code != ExitUsage || !strings.Contains(errOut, "not both") {
		t.Errorf("both: exit %d, %q", code, errOut)
	}
	e.mustRun("network-profile", "rm", "ci")
	if code, _, errOut := e.run("network-profile", "rm", "ci"); code != ExitError || !strings.Contains(errOut, "no network profile") {
		t.Errorf("rm again: exit %d, %q", code, errOut)
	}
}
