package worker

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/token"
)

// TestE2BRoute drives the worker's /e2b route against a real agent on the
// host: token checks, envd health and a streamed Connect call, the 502 for
// an unknown sandbox, and a user port proxied into the sandbox.
func TestE2BRoute(t *testing.T) {
	e := newHostEnv(t)
	base := strings.TrimRight(e.tw.w.DataPlaneURL(), "/") + "/e2b/"
	good := e.srv.sign(t, token.Claims{SandboxID: e.sid, Scope: token.ScopeEnvd})
	do := func(method, path, tok string, body io.Reader, hdr ...string) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(testContext(t), method, base+path, body)
		if err != nil {
			t.Fatal(err)
		}
		if tok != "" {
			req.Header.Set(e2bTokenHeader, tok)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}

	for _, tc := range []struct {
		name, tok string
	}{
		{"no token", ""},
		{"files scope", e.srv.sign(t, token.Claims{SandboxID: e.sid, Scope: token.ScopeFiles})},
		{"other sandbox", e.srv.sign(t, token.Claims{SandboxID: "sbx-other", Scope: token.ScopeEnvd})},
	} {
		if resp := do("GET", e.sid+"/49983/health", tc.tok, nil); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: status %d; want 401", tc.name, resp.StatusCode)
		}
	}

	other := e.srv.sign(t, token.Claims{SandboxID: "sbx-missing", Scope: token.ScopeEnvd})
	resp := do("GET", "sbx-missing/49983/health", other, nil)
	var se struct {
		SandboxID string `json:"sandboxId"`
		Code      int    `json:"code"`
	}
	json.NewDecoder(resp.Body).Decode(&se)
	if resp.StatusCode != http.StatusBadGateway || se.Code != 502 || se.SandboxID != "sbx-missing" {
		t.Fatalf("unknown sandbox: %d %+v; want 502 with sandboxId", resp.StatusCode, se)
	}

	if resp := do("POST", e.sid+"/49983/init", good, strings.NewReader("{}")); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("/init from outside: %d; want 404", resp.StatusCode)
	}

	resp = do("GET", e.sid+"/49983/health", good, nil)
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("envd health: %d %s", resp.StatusCode, b)
	}

	// A Connect server stream: Start a process, read its events.
	msg, _ := json.Marshal(map[string]any{"process": map[string]any{"cmd": "/bin/sh", "args": []string{"-c", "echo hello-e2b"}}})
	var env bytes.Buffer
	env.WriteByte(0)
	binary.Write(&env, binary.BigEndian, uint32(len(msg)))
	env.Write(msg)
	resp = do("POST", e.sid+"/49983/process.Process/Start", good, &env,
		"Content-Type", "application/connect+json", "Connect-Protocol-Version", "1", "Authorization", "Basic cm9vdDo=") // root:
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("Start: %d %s", resp.StatusCode, b)
	}
	var events []string
	br := bufio.NewReader(resp.Body)
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			t.Fatalf("read envelope: %v (events so far %v)", err, events)
		}
		body := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
		if _, err := io.ReadFull(br, body); err != nil {
			t.Fatal(err)
		}
		if hdr[0]&2 != 0 {
			if string(body) != "{}" {
				t.Fatalf("end of stream: %s", body)
			}
			break
		}
		events = append(events, string(body))
	}
	all := strings.Join(events, "\n")
	if !strings.Contains(events[0], `"start"`) || !strings.Contains(all, "aGVsbG8tZTJi") /* base64 "hello-e2b" */ || !strings.Contains(all, `"end"`) {
		t.Fatalf("events = %v; want start, stdout hello-e2b, end", events)
	}

	// A user port: a TCP listener on the host (the host agent's sandbox is
	// the host) answering one HTTP request.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "port says %s %s", r.Method, r.URL.RequestURI())
	}))
	port := ln.Addr().(*net.TCPAddr).Port
	resp = do("GET", fmt.Sprintf("%s/%d/some/page?x=1", e.sid, port), good, nil)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(b) != "port says GET /some/page?x=1" {
		t.Fatalf("user port: %d %q", resp.StatusCode, b)
	}

	// An upgrade (as a WebSocket would): a raw TCP server on the host that
	// answers 101 and then echoes, reached through the route.
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	gotPath := make(chan string, 1)
	go func() {
		c, err := up.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		gotPath <- req.URL.RequestURI() + " " + req.Header.Get("Upgrade")
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
		io.Copy(c, br)
	}()
	dp := strings.TrimPrefix(e.tw.w.DataPlaneURL(), "http://")
	c, err := net.Dial("tcp", dp)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /e2b/%s/%d/ws?room=1 HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n%s: %s\r\n\r\n",
		e.sid, up.Addr().(*net.TCPAddr).Port, e2bTokenHeader, good)
	cr := bufio.NewReader(c)
	uresp, err := http.ReadResponse(cr, nil)
	if err != nil || uresp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade answer: %v %v", uresp, err)
	}
	if p := <-gotPath; p != "/ws?room=1 echo" {
		t.Fatalf("the port got %q; want the request path and Upgrade header", p)
	}
	io.WriteString(c, "ping\n")
	if line, err := cr.ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("echo through the tunnel: %q %v", line, err)
	}
}

// TestE2BRouteStripsCredentials attacks the guest side of the /e2b route:
// a port service inside the sandbox (here the host agent's "sandbox", the
// host) that echoes the request headers it receives must never see what
// the client authenticated with (API keys, envd and traffic tokens, the
// data-plane token, any X-Airlock-* header), on plain requests and on
// upgraded connections; envd's port keeps only the Basic user of
// Authorization.
func TestE2BRouteStripsCredentials(t *testing.T) {
	e := newHostEnv(t)
	good := e.srv.sign(t, token.Claims{SandboxID: e.sid, Scope: token.ScopeEnvd})
	secrets := map[string]string{
		"Authorization":            "Bearer al_0123456789abcdef0123456789abcdef01234567",
		"X-API-KEY":                "e2b_0123456789abcdef0123456789abcdef01234567",
		"X-Access-Token":           "v1.envd.token",
		"E2b-Traffic-Access-Token": "tt_traffic",
		"X-Airlock-Whatever":       "internal",
	}
	leaked := func(h http.Header) []string {
		var out []string
		for k := range secrets {
			if v := h.Get(k); v != "" {
				out = append(out, k+": "+v)
			}
		}
		if v := h.Get(e2bTokenHeader); v != "" {
			out = append(out, e2bTokenHeader+": "+v)
		}
		return out
	}

	// A plain request to a port.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	seen := make(chan http.Header, 1)
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		io.WriteString(w, "ok")
	}))
	port := ln.Addr().(*net.TCPAddr).Port
	req, _ := http.NewRequestWithContext(testContext(t), "GET", fmt.Sprintf("%s/e2b/%s/%d/echo", strings.TrimRight(e.tw.w.DataPlaneURL(), "/"), e.sid, port), nil)
	for k, v := range secrets {
		req.Header.Set(k, v)
	}
	req.Header.Set(e2bTokenHeader, good)
	req.Header.Set("X-Custom", "kept")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("port request: %d", resp.StatusCode)
	}
	h := <-seen
	if l := leaked(h); len(l) > 0 || h.Get("X-Custom") != "kept" {
		t.Fatalf("the port in the sandbox saw %v (X-Custom %q); want no credentials and the client's other headers", l, h.Get("X-Custom"))
	}

	// An upgraded connection to a port.
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	go func() {
		c, err := up.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		r, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		seen <- r.Header
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
	}()
	c, err := net.Dial("tcp", strings.TrimPrefix(e.tw.w.DataPlaneURL(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var extra strings.Builder
	for k, v := range secrets {
		fmt.Fprintf(&extra, "%s: %s\r\n", k, v)
	}
	fmt.Fprintf(c, "GET /e2b/%s/%d/ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n%s: %s\r\n%s\r\n",
		e.sid, up.Addr().(*net.TCPAddr).Port, e2bTokenHeader, good, extra.String())
	if uresp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || uresp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade answer: %v %v", uresp, err)
	}
	if l := leaked(<-seen); len(l) > 0 {
		t.Fatalf("the upgraded port in the sandbox saw %v; want no credentials", l)
	}

	// stripCredentials on envd's port keeps the Basic user only.
	hdr := http.Header{}
	hdr.Set("Authorization", "Basic dXNlcjpzM2NyZXQ=") // user:s3cret
	hdr.Set("X-API-KEY", "k")
	stripCredentials(hdr, true)
	if got := hdr.Get("Authorization"); got != "Basic dXNlcjo=" /* user: */ || hdr.Get("X-API-KEY") != "" {
		t.Fatalf("envd headers after stripping: %v; want Authorization Basic user: only", hdr)
	}
	hdr.Set("Authorization", "Bearer al_x")
	if stripCredentials(hdr, true); hdr.Get("Authorization") != "" {
		t.Fatalf("a Bearer Authorization reached envd: %v", hdr)
	}
}

// TestE2BRouteBodyBound hands the route a request whose body the server's
// router bounded (in process, under `airlock up`): beyond the bound the
// answer is 413, not a 502 blaming the sandbox.
func TestE2BRouteBodyBound(t *testing.T) {
	e := newHostEnv(t)
	good := e.srv.sign(t, token.Claims{SandboxID: e.sid, Scope: token.ScopeEnvd})
	rec := httptest.NewRecorder()
	body := http.MaxBytesReader(rec, io.NopCloser(strings.NewReader(strings.Repeat("x", 1<<20))), 1024)
	req := httptest.NewRequestWithContext(testContext(t), "POST", "/e2b/"+e.sid+"/49983/process.Process/List", body)
	req.Header.Set(e2bTokenHeader, good)
	req.Header.Set("Content-Type", "application/json")
	req.SetPathValue("sid", e.sid)
	req.SetPathValue("port", "49983")
	req.SetPathValue("path", "process.Process/List")
	e.tw.w.handleE2B(rec, req)
	if rec.Code != http.StatusRequestEntityTooLarge || !strings.Contains(rec.Body.String(), "larger than 1024 bytes") {
		t.Fatalf("bounded body: %d %s; want 413 naming the bound", rec.Code, rec.Body)
	}
}

// TestE2BRoutePathTricks tries to climb from a sandbox port's route to
// envd's (which needs envd's own token at the router, while a port may be
// public) or to another sandbox, with "..", encoded slashes and dots: the
// worker refuses every attempt itself (400, or its mux's redirect within
// the sandbox) instead of handing it to the agent, whose routing would
// otherwise be all that stands between a port and envd.
func TestE2BRoutePathTricks(t *testing.T) {
	e := newHostEnv(t)
	good := e.srv.sign(t, token.Claims{SandboxID: e.sid, Scope: token.ScopeEnvd})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-From", "port")
		io.WriteString(w, "port")
	}))
	port := ln.Addr().(*net.TCPAddr).Port
	base := fmt.Sprintf("/e2b/%s/%d/", e.sid, port)
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, p := range []string{
		"../49983/health",
		"..%2F49983%2Fhealth",
		"%2e%2e/49983/health",
		"%2E%2E%2F49983%2Fprocess.Process%2FList",
		"x/../../49983/health",
		"x%2F..%2F..%2F..%2F..%2Fenvd%2Fhealth",
		"..%2F..%2Fsbx-other%2F49983%2Fhealth",
		"%2e%2e%2f%2e%2e%2f%2e%2e%2fenvd/health",
	} {
		dp := strings.TrimRight(e.tw.w.DataPlaneURL(), "/")
		req, err := http.NewRequestWithContext(testContext(t), "GET", dp+base+p, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(e2bTokenHeader, good)
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		// Refused by the worker (400), or redirected by its mux to a clean
		// path of this sandbox: never handed to the agent (whose redirect
		// would name /ports/… or /envd/…).
		loc := resp.Header.Get("Location")
		if resp.StatusCode != http.StatusBadRequest && !(resp.StatusCode/100 == 3 && strings.HasPrefix(loc, "/e2b/"+e.sid+"/")) {
			t.Errorf("%s: %d (Location %q) %q; want 400 from the worker or its mux's redirect within the sandbox", p, resp.StatusCode, loc, b)
		}
	}
}
