package cli

import (
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
)

// TestOrgSetQuotas: `airlock org set --max-…` sets an org's quotas (others
// kept, 0 unlimited), `org get` shows usage against them, and a create
// past one fails naming it.
func TestOrgSetQuotas(t *testing.T) {
	e := newAPIEnv(t)
	org := decodeJSON[model.Org](t, e.mustRun("org", "create", "acme", "--json"))
	got := decodeJSON[apitypes.Org](t, e.mustRun("org", "set", org.ID, "--max-sandboxes", "1", "--max-vcpus", "4", "--json"))
	if got.Quotas != (model.Quotas{Sandboxes: 1, VCPUs: 4}) {
		t.Fatalf("quotas after org set: %+v", got.Quotas)
	}
	got = decodeJSON[apitypes.Org](t, e.mustRun("org", "set", org.ID, "--max-disk-mib", "8192", "--json"))
	if got.Quotas != (model.Quotas{Sandboxes: 1, VCPUs: 4, DiskMiB: 8192}) {
		t.Fatalf("quotas after a second org set (the others kept): %+v", got.Quotas)
	}
	out := e.mustRun("org", "get", org.ID)
	for _, want := range []string{"Sandboxes:", "0 of 1", "vCPUs:", "0 of 4", "Disk MiB:", "0 of 8192", "Memory MiB:", "0 of unlimited"} {
		if !strings.Contains(out, want) {
			t.Errorf("org get lacks %q:\n%s", want, out)
		}
	}
	if code, _, errOut := e.run("org", "set", org.ID, "--max-vcpus", "-2"); code != ExitError || !strings.Contains(errOut, "quotas.vcpus") {
		t.Fatalf("negative quota: exit %d, %q", code, errOut)
	}
}
