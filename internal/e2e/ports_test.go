package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/service"
)

// headerEcho is a web server for a sandbox: it answers every GET on port
// 8000 with the request headers it received, as JSON.
const headerEcho = `import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = json.dumps({k.lower(): v for k, v in self.headers.items()}).encode()
        self.send_response(200)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(('127.0.0.1', 8000), H).serve_forever()
`

// TestSandboxPortAuth attacks a real sandbox's port through the server's
// sandbox router (server and worker in separate processes) as a stranger
// who knows only the sandbox id: a native sandbox's port 8000 is refused
// without its traffic token (401) and with a wrong one (403), and reached
// with it; the web server in the sandbox, which echoes the headers it gets,
// never sees the client's Authorization, X-API-KEY, tokens or X-Airlock-*
// headers. An E2B sandbox created with allowPublicTraffic false needs its
// trafficAccessToken the same way.
func TestSandboxPortAuth(t *testing.T) {
	s := need(t)
	c := s.client()
	ctx := ctxT(t, 5*time.Minute)

	native := newSandbox(t, c, client.CreateSandboxRequest{})
	var got struct {
		TrafficToken  string `json:"traffic_token"`
		PublicTraffic bool   `json:"public_traffic"`
	}
	getJSON(t, ctx, s.url()+"/v1/sandboxes/"+native.ID, "Authorization", "Bearer "+s.adminKey).decode(t, &got)
	if got.PublicTraffic || !strings.HasPrefix(got.TrafficToken, "tt_") {
		t.Fatalf("GET /v1/sandboxes/%s: public_traffic %v traffic_token %q; want a private sandbox with a token", native.ID, got.PublicTraffic, got.TrafficToken)
	}
	startEcho(t, c, native.ID)
	port := func(id string, hdr ...string) httpReply {
		return getJSON(t, ctx, s.url()+"/page", append([]string{"E2b-Sandbox-Id", id, "E2b-Sandbox-Port", "8000"}, hdr...)...)
	}
	waitPort(t, ctx, func() httpReply { return port(native.ID, service.TrafficTokenHeader, got.TrafficToken) })

	if r := port(native.ID); r.status != http.StatusUnauthorized || !strings.Contains(string(r.body), "does not accept public traffic") {
		t.Fatalf("port without a token: %d %s; want 401 naming the traffic token", r.status, r.body)
	}
	if r := port(native.ID, "Authorization", "Bearer "+s.adminKey); r.status != http.StatusUnauthorized {
		t.Fatalf("port with only an API key: %d %s; want 401", r.status, r.body)
	}
	if r := port(native.ID, service.TrafficTokenHeader, "tt_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"); r.status != http.StatusForbidden {
		t.Fatalf("port with a forged token: %d %s; want 403", r.status, r.body)
	}
	// Host routing ("<port>-<id>.<domain>") follows the same rule.
	req, _ := http.NewRequestWithContext(ctx, "GET", s.url()+"/page", nil)
	req.Host = "8000-" + native.ID + ".airlock.test"
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("Host-routed port without a token: %v %v; want 401", resp, err)
	} else {
		resp.Body.Close()
	}

	r := port(native.ID, service.TrafficTokenHeader, got.TrafficToken,
		"Authorization", "Bearer "+s.adminKey, "X-API-KEY", s.adminKey, "X-Access-Token", "v1.some.token",
		"X-Airlock-Dataplane-Token", "v1.forged.token", "X-Airlock-Other", "x", "X-Custom", "kept")
	var seen map[string]string
	r.decode(t, &seen)
	for _, k := range []string{"authorization", "x-api-key", "x-access-token", "e2b-traffic-access-token", "x-airlock-dataplane-token", "x-airlock-other"} {
		if v, ok := seen[k]; ok {
			t.Errorf("the web server in the sandbox saw %s: %s", k, v)
		}
	}
	if seen["x-custom"] != "kept" {
		t.Errorf("the web server in the sandbox saw %v; want the client's other headers", seen)
	}

	// E2B: allowPublicTraffic false.
	key, err := c.CreateKey(ctx, service.DefaultOrgID, client.CreateKeyRequest{Name: "e2b-ports", E2B: true})
	if err != nil {
		t.Fatal(err)
	}
	creq, _ := http.NewRequestWithContext(ctx, "POST", s.url()+"/sandboxes", strings.NewReader(`{"templateID":"base","timeout":600,"network":{"allowPublicTraffic":false}}`))
	creq.Header.Set("X-API-KEY", key.Secret)
	creq.Header.Set("Content-Type", "application/json")
	cresp, err := http.DefaultClient.Do(creq)
	if err != nil {
		t.Fatal(err)
	}
	var e2b struct {
		SandboxID          string  `json:"sandboxID"`
		TrafficAccessToken *string `json:"trafficAccessToken"`
	}
	b, _ := io.ReadAll(cresp.Body)
	cresp.Body.Close()
	if cresp.StatusCode != http.StatusCreated || json.Unmarshal(b, &e2b) != nil || e2b.TrafficAccessToken == nil {
		t.Fatalf("E2B create with allowPublicTraffic false: %d %s; want 201 with trafficAccessToken", cresp.StatusCode, b)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if op, err := c.DeleteSandbox(ctx, e2b.SandboxID); err == nil {
			c.WaitOperation(ctx, op.ID)
		}
	})
	startEcho(t, c, e2b.SandboxID)
	waitPort(t, ctx, func() httpReply { return port(e2b.SandboxID, "e2b-traffic-access-token", *e2b.TrafficAccessToken) })
	if r := port(e2b.SandboxID); r.status != http.StatusUnauthorized {
		t.Fatalf("E2B private sandbox port without a token: %d %s; want 401", r.status, r.body)
	}
}

type httpReply struct {
	status int
	body   []byte
}

func (r httpReply) decode(t *testing.T, v any) {
	t.Helper()
	if r.status != http.StatusOK || json.Unmarshal(r.body, v) != nil {
		t.Fatalf("got %d %s; want 200 with JSON", r.status, r.body)
	}
}

func getJSON(t *testing.T, ctx context.Context, url string, hdr ...string) httpReply {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return httpReply{resp.StatusCode, b}
}

// startEcho starts headerEcho in sandbox id, detached from the command
// that starts it.
func startEcho(t *testing.T, c *client.Client, id string) {
	t.Helper()
	if r := sh(t, c, id, "cat > /tmp/echo.py <<'EOF'\n"+headerEcho+"EOF\nsetsid python3 /tmp/echo.py </dev/null >/tmp/echo.log 2>&1 &"); r.exit.ExitCode != 0 {
		t.Fatalf("start the header echo server: %+v", r)
	}
}

// waitPort waits until try answers 200 (the server in the sandbox is up).
func waitPort(t *testing.T, ctx context.Context, try func() httpReply) {
	t.Helper()
	for {
		r := try()
		if r.status == http.StatusOK {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("the web server in the sandbox never answered: last %d %s", r.status, r.body)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// holdServer answers GET /hold on port 8000 only once /tmp/release exists,
// after noting each arrival in /tmp/arrived; any other path at once.
const holdServer = `import http.server, os, time, threading
lock = threading.Lock()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == '/hold':
            with lock:
                with open('/tmp/arrived', 'a') as f:
                    f.write('x')
            while not os.path.exists('/tmp/release'):
                time.sleep(0.05)
        b = b'done'
        self.send_response(200)
        self.send_header('Content-Length', str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(('127.0.0.1', 8000), H).serve_forever()
`

// TestSandboxPortInflightCap holds 64 requests open in a web server inside
// a real sandbox (public_traffic: true, so no token is needed) through the
// server's router; the 65th is 429 with a message, and once the server in
// the sandbox lets the held ones finish the port is served again.
func TestSandboxPortInflightCap(t *testing.T) {
	s := need(t)
	c := s.client()
	ctx := ctxT(t, 5*time.Minute)
	const limit = 64 // e2bcompat.MaxInflightPerSandbox
	sb := newSandbox(t, c, client.CreateSandboxRequest{PublicTraffic: true})
	if r := sh(t, c, sb.ID, "cat > /tmp/hold.py <<'EOF'\n"+holdServer+"EOF\nsetsid python3 /tmp/hold.py </dev/null >/tmp/hold.log 2>&1 &"); r.exit.ExitCode != 0 {
		t.Fatalf("start the hold server: %+v", r)
	}
	get := func(path string) httpReply {
		return getJSON(t, ctx, s.url()+path, "E2b-Sandbox-Id", sb.ID, "E2b-Sandbox-Port", "8000")
	}
	waitPort(t, ctx, func() httpReply { return get("/ready") })

	held := make(chan httpReply, limit)
	for range limit {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "GET", s.url()+"/hold", nil)
			req.Header.Set("E2b-Sandbox-Id", sb.ID)
			req.Header.Set("E2b-Sandbox-Port", "8000")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				held <- httpReply{status: -1, body: []byte(err.Error())}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			held <- httpReply{resp.StatusCode, b}
		}()
	}
	// Wait until the server in the sandbox holds all of them (asked through
	// the native command API, which the cap does not count).
	for {
		if r := sh(t, c, sb.ID, "wc -c < /tmp/arrived 2>/dev/null || echo 0"); strings.TrimSpace(r.stdout) == "64" {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the held requests never all reached the server in the sandbox")
		}
		time.Sleep(200 * time.Millisecond)
	}
	r := get("/more")
	if r.status != http.StatusTooManyRequests || !strings.Contains(string(r.body), "64 requests in flight") {
		t.Fatalf("request %d: %d %s; want 429 naming the limit", limit+1, r.status, r.body)
	}
	if r := sh(t, c, sb.ID, "touch /tmp/release"); r.exit.ExitCode != 0 {
		t.Fatalf("release: %+v", r)
	}
	for range limit {
		if r := <-held; r.status != http.StatusOK || string(r.body) != "done" {
			t.Fatalf("a held request: %d %s; want 200 done", r.status, r.body)
		}
	}
	if r := get("/after"); r.status != http.StatusOK {
		t.Fatalf("after the held requests: %d %s; want 200", r.status, r.body)
	}
}
