package service_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestServiceIsTransportFree fences the service off the adapters and the
// wire: it takes its own parameter types (params.go), not /v1's
// (api/apitypes) or E2B's, and links no adapter, controller, worker or
// runtime code (tests may; they are not in this list).
//
// net/http is still linked: the service calls workers' data planes itself
// (workerRequest: command lists, checkpoint export, import and snapshot
// delete) and reads their answers. When those calls go through a
// workerapi client, add "net/http" to the forbidden list below.
func TestServiceIsTransportFree(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("needs the go command to list dependencies")
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	forbidden := []string{
		"api", // api/apitypes included: /v1 wire types stay in the REST adapter
		"e2bcompat", "controller", "worker", "daemon", "cli", "client", "bench", "e2e",
		"runtime", "agent", "agentclient", "setup", "image",
	}
	for _, dep := range strings.Fields(string(out)) {
		rest, ok := strings.CutPrefix(dep, "github.com/airlock/airlock/internal/")
		if !ok {
			continue
		}
		top := strings.SplitN(rest, "/", 2)[0]
		for _, f := range forbidden {
			if top == f {
				t.Errorf("service links %s; translate in the adapter, or put what both need in a lower package", dep)
			}
		}
	}
}

// TestAdaptersGoThroughTheService: the REST and E2B adapters do not import
// the store; what they need of it is a Service method (Route, DataPlaneURL,
// …), so that every write has the service's events and guards.
func TestAdaptersGoThroughTheService(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("needs the go command to list imports")
	}
	for _, pkg := range []string{"../api", "../e2bcompat"} {
		out, err := exec.Command(goBin, "list", "-f", `{{join .Imports "\n"}}`, pkg).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		for _, imp := range strings.Fields(string(out)) {
			if strings.HasPrefix(imp, "github.com/airlock/airlock/internal/store") {
				t.Errorf("%s imports %s; add a Service method instead", pkg, imp)
			}
		}
	}
}
