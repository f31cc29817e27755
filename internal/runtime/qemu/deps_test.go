package qemu_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/testenv"
)

// TestDepsNoGuestAgent keeps the host driver off the guest agent: the VM
// link's devices, command line and handshake words come from
// internal/agentapi (vmlink.go), never from internal/agent, whose server
// (and its process, file and envd code) has no business in the worker's
// driver.
func TestDepsNoGuestAgent(t *testing.T) {
	goBin := testenv.RequireTool(t, "go", "to list dependencies")
	out, err := exec.Command(goBin, "list", "-deps", "-f", "{{.ImportPath}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	var sawAPI bool
	for _, pkg := range deps {
		if pkg == "github.com/airlock/airlock/internal/agent" || strings.HasPrefix(pkg, "github.com/airlock/airlock/internal/agent/") {
			t.Errorf("internal/runtime/qemu depends on %s; take the VM link from internal/agentapi instead", pkg)
		}
		sawAPI = sawAPI || pkg == "github.com/airlock/airlock/internal/agentapi"
	}
	if !sawAPI {
		t.Fatalf("go list found no internal/agentapi among %d deps: the check looks at the wrong package", len(deps))
	}
}
