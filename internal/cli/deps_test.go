package cli

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/testenv"
)

// TestLinksOnlyTheClient keeps the CLI a pure API client: no store, service,
// controller, worker or runtime code may be linked into internal/cli (tests
// may use them; they are not in this list).
func TestLinksOnlyTheClient(t *testing.T) {
	goBin := testenv.RequireTool(t, "go", "to list dependencies")
	for _, pkg := range []string{".", "../bench"} {
		out, err := exec.Command(goBin, "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			rest, ok := strings.CutPrefix(dep, "github.com/airlock/airlock/internal/")
			if !ok {
				continue
			}
			switch strings.SplitN(rest, "/", 2)[0] {
			case "cli", "bench", "client", "model", "agentapi", "httperr", "dockerfile", "mcp": // httperr: the error wire mapping (model + stdlib); dockerfile: the build frontend (model + BuildKit's parser)
			case "api":
				if rest != "api/apitypes" {
					t.Errorf("%s links %s", pkg, dep)
				}
			default:
				t.Errorf("%s links %s; the CLI must talk only to the API", pkg, dep)
			}
		}
	}
}
