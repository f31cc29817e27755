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

// TestDepsNoInstallers keeps the driver off the first-run installers: it
// boots from image.VMAssets and builds template images and disks with
// internal/image; internal/setup (apt-get, debootstrap, the runsc build)
// runs before a driver exists and has no business in it.
func TestDepsNoInstallers(t *testing.T) {
	goBin := testenv.RequireTool(t, "go", "to list dependencies")
	out, err := exec.Command(goBin, "list", "-deps", "-f", "{{.ImportPath}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	var sawImage bool
	for _, pkg := range deps {
		if pkg == "github.com/airlock/airlock/internal/setup" || strings.HasPrefix(pkg, "github.com/airlock/airlock/internal/setup/") {
			t.Errorf("internal/runtime/qemu depends on %s; take what the driver needs from internal/image instead", pkg)
		}
		sawImage = sawImage || pkg == "github.com/airlock/airlock/internal/image"
	}
	if !sawImage {
		t.Fatalf("go list found no internal/image among %d deps: the check looks at the wrong package", len(deps))
	}
}
