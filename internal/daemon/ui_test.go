package daemon

import (
	"net/http"
	"strings"
	"testing"
)

// The server serves the web console at /ui/ without a key, under a CSP
// that names the registered worker's data plane (both its http and ws
// forms) and nothing else besides its own origin.
func TestConsoleMounted(t *testing.T) {
	s := startFakeStack(t)
	r, err := http.Get(s.c.BaseURL + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusOK || !strings.HasPrefix(r.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /ui/: %d %s", r.StatusCode, r.Header.Get("Content-Type"))
	}
	ws, err := s.srv.svc.DataPlaneOrigins(t.Context())
	if err != nil || len(ws) != 2 {
		t.Fatalf("data-plane origins: %v, %v; want the worker's http and ws forms", ws, err)
	}
	csp := r.Header.Get("Content-Security-Policy")
	if !strings.Contains(csp, "connect-src 'self' "+strings.Join(ws, " ")+";") || !strings.Contains(csp, "ws://127.0.0.1:") {
		t.Fatalf("CSP %q does not name the data plane %v", csp, ws)
	}
	r, err = http.Get(s.c.BaseURL + "/ui")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.Request.URL.Path != "/ui/" {
		t.Fatalf("/ui ends at %s, want /ui/", r.Request.URL.Path)
	}
}
