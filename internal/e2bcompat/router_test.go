package e2bcompat

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/airlock/airlock/internal/service"
)

// nativeSandbox creates a sandbox through the native service (as
// POST /v1/sandboxes does) and waits until the stand-in controller runs it.
func (e *env) nativeSandbox(req service.CreateParams) string {
	e.t.Helper()
	p := service.Principal{OrgID: service.DefaultOrgID}
	sb, op, err := e.svc.CreateSandbox(e.ctx, p, req, "")
	if err != nil {
		e.t.Fatalf("create native sandbox: %v", err)
	}
	if _, err := e.a.s.waitOp(e.ctx, p, op, "start"); err != nil {
		e.t.Fatalf("start native sandbox: %v", err)
	}
	return sb.ID
}

// port sends GET /page to port 8000 of sandbox id with no API key, as a
// stranger on the network would.
func (e *env) port(id string, hdr ...string) reply {
	e.t.Helper()
	req, err := http.NewRequestWithContext(e.ctx, "GET", e.srv.URL+"/page", nil)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set(HeaderSandboxID, id)
	req.Header.Set(HeaderSandboxPort, "8000")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("port request: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, b}
}

func wantSandboxError(t *testing.T, what string, r reply, status int, msgPart string) {
	t.Helper()
	var se sandboxError
	if r.status != status || json.Unmarshal(r.body, &se) != nil || se.Code != status || !strings.Contains(se.Message, msgPart) {
		t.Fatalf("%s: got %d %s; want %d with a message containing %q", what, r.status, r.body, status, msgPart)
	}
}

// TestPortsNeedTrafficToken attacks a sandbox's ports from a stranger who
// knows only the sandbox id: a native sandbox's ports answer 401 (no token)
// or 403 (a wrong one, or another sandbox's) and are reached with the
// traffic token; public_traffic: true opens them. An E2B sandbox follows
// E2B: public by default, and with network.allowPublicTraffic false it
// returns trafficAccessToken and its ports need it.
func TestPortsNeedTrafficToken(t *testing.T) {
	e := newEnv(t)
	p := service.Principal{OrgID: service.DefaultOrgID}

	native := e.nativeSandbox(service.CreateParams{})
	sb, err := e.st.GetSandbox(e.ctx, native)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := e.svc.SandboxTrafficToken(e.ctx, p, sb)
	if err != nil || !strings.HasPrefix(tok, "tt_") {
		t.Fatalf("traffic token %q, %v", tok, err)
	}
	other := e.nativeSandbox(service.CreateParams{})
	otherSB, _ := e.st.GetSandbox(e.ctx, other)
	otherTok, _ := e.svc.TrafficToken(e.ctx, otherSB)
	envd := e.create(`{"templateID":"base"}`).EnvdAccessToken

	wantSandboxError(t, "native, no token", e.port(native), 401, "does not accept public traffic")
	wantSandboxError(t, "native, Host routing, no token", e.do("GET", "/x", "", "Host", "8000-"+native+".airlock.test"), 401, service.TrafficTokenHeader)
	wantSandboxError(t, "native, API key only", e.port(native, "X-API-KEY", e.key, "Authorization", "Bearer "+e.key), 401, "traffic token")
	wantSandboxError(t, "native, wrong token", e.port(native, service.TrafficTokenHeader, "tt_forged"), 403, "does not hold the traffic token")
	wantSandboxError(t, "native, other sandbox's token", e.port(native, service.TrafficTokenHeader, otherTok), 403, "traffic token")
	wantSandboxError(t, "native, an envd token as traffic token", e.port(native, service.TrafficTokenHeader, envd), 403, "traffic token")
	if r := e.port(native, service.TrafficTokenHeader, tok); r.status != 200 || string(r.body) != "forwarded" {
		t.Fatalf("native with its traffic token: %d %s; want 200", r.status, r.body)
	}
	// envd's own port keeps envd's rule (the access token), not the traffic token.
	wantSandboxError(t, "envd with a traffic token", e.do("POST", "/process.Process/List", "{}", HeaderSandboxID, native, service.TrafficTokenHeader, tok), 401, "access token")

	public := e.nativeSandbox(service.CreateParams{PublicTraffic: true})
	if r := e.port(public); r.status != 200 {
		t.Fatalf("native public_traffic: %d %s; want 200", r.status, r.body)
	}
	if pub, _ := e.st.GetSandbox(e.ctx, public); true {
		if tok, err := e.svc.SandboxTrafficToken(e.ctx, p, pub); tok != "" || err != nil {
			t.Fatalf("public sandbox traffic token %q, %v; want none", tok, err)
		}
	}
	if _, err := e.svc.SandboxTrafficToken(e.ctx, service.Principal{OrgID: "org-other"}, sb); err == nil {
		t.Fatal("another org got the traffic token")
	}

	// E2B: public by default, trafficAccessToken null.
	def := e.create(`{"templateID":"base"}`)
	if def.TrafficAccessToken != nil {
		t.Fatalf("default E2B sandbox trafficAccessToken %q; want null", *def.TrafficAccessToken)
	}
	if r := e.port(def.SandboxID); r.status != 200 {
		t.Fatalf("default E2B sandbox port: %d %s; want 200 (E2B's allowPublicTraffic default)", r.status, r.body)
	}
	priv := e.create(`{"templateID":"base","network":{"allowPublicTraffic":false}}`)
	if priv.TrafficAccessToken == nil || !strings.HasPrefix(*priv.TrafficAccessToken, "tt_") {
		t.Fatalf("allowPublicTraffic false: trafficAccessToken %v; want a token", priv.TrafficAccessToken)
	}
	wantSandboxError(t, "E2B private, no token", e.port(priv.SandboxID, "X-Access-Token", priv.EnvdAccessToken), 401, "does not accept public traffic")
	if r := e.port(priv.SandboxID, "e2b-traffic-access-token", *priv.TrafficAccessToken); r.status != 200 {
		t.Fatalf("E2B private with its token: %d %s; want 200", r.status, r.body)
	}
	var detail sandboxDetail
	e.do("GET", "/sandboxes/"+priv.SandboxID, "").json(t, &detail)
	if detail.TrafficAccessToken == nil || *detail.TrafficAccessToken != *priv.TrafficAccessToken || detail.Network.AllowPublicTraffic {
		t.Fatalf("GET /sandboxes/{id} trafficAccessToken %v network %+v; want the create's and allowPublicTraffic false", detail.TrafficAccessToken, detail.Network)
	}
	r := e.do("POST", "/sandboxes/"+priv.SandboxID+"/connect", `{"timeout":60}`)
	var conn sandboxJSON
	r.json(t, &conn)
	if conn.TrafficAccessToken == nil || *conn.TrafficAccessToken != *priv.TrafficAccessToken {
		t.Fatalf("connect trafficAccessToken %v; want the create's", conn.TrafficAccessToken)
	}
	wantError(t, e.do("POST", "/sandboxes", `{"templateID":"base","network":{"allowPublicTraffic":"no"}}`), 400, "allowPublicTraffic")
	wantError(t, e.do("POST", "/sandboxes", `{"templateID":"base","network":{"allowPublicTraffic":false,"rules":[{"x":1}]}}`), 501, "network.rules")
}

// TestRouterStripsCredentials checks what the router hands the worker: the
// client's API key, Authorization, envd and traffic tokens and X-Airlock-*
// headers are gone (only the router's own data-plane token is there); on
// envd's port a Basic Authorization keeps its user and loses its password.
func TestRouterStripsCredentials(t *testing.T) {
	e := newEnv(t)
	sb := e.create(`{"templateID":"base","network":{"allowPublicTraffic":false}}`)
	last := func() http.Header {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.dpSeen[len(e.dpSeen)-1].Header
	}
	forged := "v1.forged.token"
	r := e.port(sb.SandboxID, service.TrafficTokenHeader, *sb.TrafficAccessToken,
		"Authorization", "Bearer "+e.key, "X-API-KEY", e.key, "X-Access-Token", sb.EnvdAccessToken,
		"X-Airlock-Dataplane-Token", forged, "X-Airlock-Other", "x", "X-Custom", "kept")
	if r.status != 200 {
		t.Fatalf("port: %d %s", r.status, r.body)
	}
	h := last()
	for _, k := range []string{"Authorization", "X-API-KEY", "X-Access-Token", service.TrafficTokenHeader, "X-Airlock-Other"} {
		if v := h.Get(k); v != "" {
			t.Errorf("the worker got %s: %s from the client", k, v)
		}
	}
	if h.Get(HeaderDataPlaneToken) == forged || h.Get(HeaderDataPlaneToken) == "" || h.Get("X-Custom") != "kept" {
		t.Errorf("worker headers %v; want the router's data-plane token and the client's other headers", h)
	}

	r = e.do("POST", "/process.Process/List", "{}", HeaderSandboxID, sb.SandboxID, "X-Access-Token", sb.EnvdAccessToken,
		"Authorization", "Basic dXNlcjpzM2NyZXQ=") // user:s3cret
	if r.status != 200 {
		t.Fatalf("envd: %d %s", r.status, r.body)
	}
	if h := last(); h.Get("Authorization") != "Basic dXNlcjo=" || h.Get("X-API-KEY") != "" || h.Get("X-Access-Token") != "" {
		t.Errorf("envd headers at the worker: %v; want Authorization Basic user: and no keys", h)
	}
}

// TestRouterCapsInflight holds MaxInflightPerSandbox requests to one
// sandbox open at the stand-in worker; one more is answered 429 with a
// message (on uncapped code it would reach the worker, which answers it
// "uncapped"), another sandbox is unaffected, and once the held requests
// finish the sandbox is served again.
func TestRouterCapsInflight(t *testing.T) {
	e := newEnv(t)
	sb := e.create(`{"templateID":"base"}`)
	other := e.create(`{"templateID":"base"}`)
	release := make(chan struct{})
	arrived := make(chan struct{}, 2*MaxInflightPerSandbox)
	var (
		mu   sync.Mutex
		held int
	)
	e.mu.Lock()
	e.dpHook = func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.Contains(r.URL.Path, sb.SandboxID+"/8000/hold") {
			return false
		}
		mu.Lock()
		held++
		n := held
		mu.Unlock()
		if n > MaxInflightPerSandbox {
			io.WriteString(w, "uncapped")
			return true
		}
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		io.WriteString(w, "held")
		return true
	}
	e.mu.Unlock()

	var wg sync.WaitGroup
	errs := make(chan error, MaxInflightPerSandbox)
	for range MaxInflightPerSandbox {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(e.ctx, "GET", e.srv.URL+"/hold", nil)
			req.Header.Set(HeaderSandboxID, sb.SandboxID)
			req.Header.Set(HeaderSandboxPort, "8000")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				errs <- err
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(b) != "held" {
				errs <- fmt.Errorf("held request: %d %s", resp.StatusCode, b)
			}
		}()
	}
	for range MaxInflightPerSandbox {
		select {
		case <-arrived:
		case err := <-errs:
			t.Fatal(err)
		}
	}
	req, _ := http.NewRequestWithContext(e.ctx, "GET", e.srv.URL+"/hold", nil)
	req.Header.Set(HeaderSandboxID, sb.SandboxID)
	req.Header.Set(HeaderSandboxPort, "8000")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	wantSandboxError(t, "one request over the cap", reply{resp.StatusCode, resp.Header, b}, 429, fmt.Sprintf("has %d requests in flight", MaxInflightPerSandbox))
	if resp.Header.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	if r := e.port(other.SandboxID); r.status != 200 {
		t.Fatalf("another sandbox while the first is at its cap: %d %s", r.status, r.body)
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if r := e.port(sb.SandboxID); r.status != 200 {
		t.Fatalf("after the held requests finished: %d %s; want 200", r.status, r.body)
	}
	e.a.rt.mu.Lock()
	left := len(e.a.rt.inflight)
	e.a.rt.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d sandboxes still counted in flight after every request ended", left)
	}
}

// TestMetricsAnswerBounded plays a rogue envd (guest root can answer for
// the agent) whose /metrics answer is 64 MiB of JSON-looking bytes: the
// server must stop reading it after its bound instead of buffering it, and
// answer the metrics call without a sample.
func TestMetricsAnswerBounded(t *testing.T) {
	e := newEnv(t)
	sb := e.create(`{"templateID":"base"}`)
	const total = 64 << 20
	accepted := make(chan int, 1)
	e.mu.Lock()
	e.dpHook = func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasSuffix(r.URL.Path, "/49983/metrics") {
			return false
		}
		chunk := []byte(`{"ts":1,"cpu_count":1,` + strings.Repeat(" ", 64<<10-22))
		n := 0
		for n < total {
			m, err := w.Write(chunk)
			n += m
			if err != nil {
				break
			}
		}
		accepted <- n
		return true
	}
	e.mu.Unlock()
	r := e.do("GET", "/sandboxes/"+sb.SandboxID+"/metrics", "")
	if r.status != 200 || strings.TrimSpace(string(r.body)) != "[]" {
		t.Fatalf("metrics: %d %s; want 200 []", r.status, r.body)
	}
	n := <-accepted
	// What the stand-in could write is what the server read plus the
	// loopback socket buffers: far below the whole answer.
	if n >= total/2 {
		t.Fatalf("the server took %d bytes of a %d-byte metrics answer; want it to stop after %d", n, total, maxEnvdGetBody)
	}
	t.Logf("the server stopped a %d MiB metrics answer after %d KiB had been written", total>>20, n>>10)
}

// TestRPCBodyBounded sends an envd RPC body of more than maxRPCBody, with a
// Content-Length (refused before anything is forwarded) and chunked (cut
// while it streams): both are 413 with a message.
func TestRPCBodyBounded(t *testing.T) {
	e := newEnv(t)
	sb := e.create(`{"templateID":"base"}`)
	e.mu.Lock()
	e.dpHook = func(w http.ResponseWriter, r *http.Request) bool {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			return true // the router cut the body: its answer stands
		}
		io.WriteString(w, "read it all")
		return true
	}
	e.mu.Unlock()
	for _, chunked := range []bool{false, true} {
		var body io.Reader = strings.NewReader(strings.Repeat("x", maxRPCBody+1))
		if chunked {
			body = io.MultiReader(body) // hides the length: sent chunked
		}
		req, _ := http.NewRequestWithContext(context.Background(), "POST", e.srv.URL+"/process.Process/Start", body)
		req.Header.Set(HeaderSandboxID, sb.SandboxID)
		req.Header.Set("X-Access-Token", sb.EnvdAccessToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("chunked %v: %v", chunked, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		wantSandboxError(t, fmt.Sprintf("RPC body over the bound (chunked %v)", chunked), reply{resp.StatusCode, resp.Header, b}, 413, "at most")
	}
}
