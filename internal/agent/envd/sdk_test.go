package envd_test

import (
	"net/http/httptest"
	"net/http/httputil"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/testenv"
)

// TestSDKDebugMode runs the unmodified E2B JS SDK (npm e2b, installed by
// scripts/test.sh under test/e2b) in debug mode against envd in a gVisor
// sandbox from the base template, through a plain HTTP/1.1 front that
// forwards to the agent's /envd/ prefix as the data plane does.
func TestSDKDebugMode(t *testing.T) {
	testenv.RequireRunsc(t)
	node := testenv.RequireTool(t, "node", "to run the E2B SDK")
	module, err := filepath.Abs("../../../test/e2b/node_modules/e2b/dist/index.mjs")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(module); err != nil {
		t.Skip("needs the npm package e2b in test/e2b (npm ci --prefix test/e2b)")
	}
	sb := startGVisor(t)
	front := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", "agent"
			pr.Out.URL.Path = "/envd" + pr.In.URL.Path
			pr.Out.URL.RawPath = ""
		},
		Transport:     sb.hc.Transport,
		FlushInterval: -1,
	})
	t.Cleanup(front.Close)
	cmd := exec.CommandContext(testCtx(t), node, "testdata/sdk_debug.mjs")
	cmd.Env = append(os.Environ(), "E2B_DEBUG=true", "E2B_SANDBOX_URL="+front.URL, "E2B_MODULE=file://"+module)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasSuffix(strings.TrimSpace(string(out)), "ok") {
		t.Fatalf("E2B SDK script: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
