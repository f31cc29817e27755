package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
)

// waitPool polls `pool ls --json` until the pool of template has ready
// members (generous deadline: the scripted worker answers at once).
func (e *lifecycleEnv) waitPool(template string, ready int) apitypes.Pool {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ps := decodeJSON[[]apitypes.Pool](e.t, e.mustRun("pool", "ls", "--json"))
		for _, p := range ps {
			if p.Template == template && p.Ready == ready && p.Starting == 0 {
				return p
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("pool %s never had %d ready members: %+v", template, ready, ps)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestPoolCommands(t *testing.T) {
	e := newLifecycleEnv(t)
	if out := e.mustRun("pool", "set", "base", "2"); !strings.Contains(out, "pool base:latest") || !strings.Contains(out, "size 2") {
		t.Fatalf("pool set: %q", out)
	}
	p := e.waitPool("base:latest", 2)
	if p.Digest != testDigest || p.Resources != (model.Resources{VCPUs: 1, MemoryMiB: 512, DiskMiB: 4096}) {
		t.Fatalf("pool = %+v", p)
	}
	out := e.mustRun("pool", "ls")
	for _, want := range []string{"TEMPLATE", "base:latest", "512 MiB"} {
		if !strings.Contains(out, want) {
			t.Errorf("pool ls lacks %q:\n%s", want, out)
		}
	}
	// Members are not the operator's sandboxes.
	if sbs := decodeJSON[[]model.Sandbox](t, e.mustRun("sandbox", "ls", "--json")); len(sbs) != 0 {
		t.Fatalf("sandbox ls shows pool members: %+v", sbs)
	}
	// A create claims a member: running at once, with its env.
	sb := decodeJSON[createResult](t, e.mustRun("sandbox", "create", "--env", "K=v", "--json"))
	if sb.Sandbox.State != model.StateRunning || sb.Sandbox.Env["K"] != "v" || sb.Operation.State != model.OpSucceeded || sb.Sandbox.Pool != "" {
		t.Fatalf("claim: sandbox %+v op %+v", sb.Sandbox, sb.Operation)
	}
	e.waitPool("base:latest", 2) // refilled
	if sbs := decodeJSON[[]model.Sandbox](t, e.mustRun("sandbox", "ls", "--json")); len(sbs) != 1 || sbs[0].ID != sb.Sandbox.ID {
		t.Fatalf("sandbox ls = %+v, want only %s", sbs, sb.Sandbox.ID)
	}

	// Not an operator: forbidden.
	org := decodeJSON[model.Org](t, e.mustRun("org", "create", "acme", "--json"))
	key := strings.TrimSpace(e.mustRun("key", "create", "--org", org.ID, "--admin"))
	if code, _, errOut := e.runKey(key, "pool", "ls"); code != ExitError || !strings.Contains(errOut, "admin key of the") {
		t.Fatalf("pool ls by another org's admin: exit %d %q", code, errOut)
	}
	if code, _, errOut := e.run("pool", "set", "base", "x"); code != ExitUsage || !strings.Contains(errOut, "size") {
		t.Fatalf("pool set base x: exit %d %q", code, errOut)
	}
	if code, _, errOut := e.run("pool", "set", "nope", "1"); code != ExitError || !strings.Contains(errOut, "not found") {
		t.Fatalf("pool set nope: exit %d %q", code, errOut)
	}

	e.mustRun("pool", "rm", "base")
	if ps := decodeJSON[[]apitypes.Pool](t, e.mustRun("pool", "ls", "--json")); len(ps) != 0 {
		t.Fatalf("pool ls after rm: %+v", ps)
	}
	if code, _, errOut := e.run("pool", "rm", "base"); code != ExitError || !strings.Contains(errOut, "no warm pool") {
		t.Fatalf("pool rm again: exit %d %q", code, errOut)
	}
}
