package e2bcompat

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/controller"
	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/store"
	"github.com/airlock/airlock/internal/store/sqlite"
	"github.com/airlock/airlock/internal/token"
)

const baseDigest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"

// env is the adapter over a real service and SQLite store, served on a
// loopback httptest server. A stand-in for controller + worker completes
// operations (create → running on worker w1, delete → deleted) and a
// stand-in worker data plane records what the router forwards.
type env struct {
	t       *testing.T
	ctx     context.Context
	st      *sqlite.Store
	ev      *events.Log
	svc     *service.Service
	a       *Adapter
	srv     *httptest.Server
	key     string // e2b_ key of the default org
	dp      *httptest.Server
	mu      sync.Mutex
	dpSeen  []*http.Request
	dpHook  func(w http.ResponseWriter, r *http.Request) bool
	clockMu sync.Mutex
	clock   time.Time
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := t.Context()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatalf("open sqlite: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.PutTemplate(ctx, model.Template{Name: "base", Tag: "latest", Digest: baseDigest, SizeBytes: 1, CreatedAt: time.Now()}); err != nil {
		t.Fatalf("put template: %v", err)
	}
	e := &env{t: t, ctx: ctx, st: st, clock: time.Now().UTC()}
	e.ev = events.New(st)
	e.svc = service.New(service.Config{Store: st, Events: e.ev, Now: e.now})
	if _, _, err := e.svc.Bootstrap(ctx); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	_, e.key, err = e.svc.CreateKeyWith(ctx, service.Principal{OrgID: service.DefaultOrgID, Admin: true}, service.DefaultOrgID, service.KeyOptions{Name: "e2b", E2B: true})
	if err != nil {
		t.Fatalf("create e2b key: %v", err)
	}
	e.dp = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.dpSeen = append(e.dpSeen, r)
		hook := e.dpHook
		e.mu.Unlock()
		if hook != nil && hook(w, r) {
			return
		}
		w.Header().Set("X-Path", r.URL.RequestURI())
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "forwarded")
	}))
	t.Cleanup(e.dp.Close)
	now := time.Now().UTC()
	if err := st.UpsertWorker(ctx, model.Worker{ID: "w1", DataPlaneURL: e.dp.URL, InternalURL: e.dp.URL, Runtimes: model.NamedRuntimes("gvisor"),
		Templates: []string{baseDigest}, CapacityMiB: 8192, CapacityVCPUs: 8, LastHeartbeat: now, CreatedAt: now}); err != nil {
		t.Fatalf("upsert worker: %v", err)
	}
	e.a = New(e.svc, Options{CreateWait: 30 * time.Second})
	mux := http.NewServeMux()
	mux.Handle("/", e.a.API())
	e.srv = httptest.NewServer(e.a.Sandboxes(mux))
	t.Cleanup(e.srv.Close)
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	go e.complete(ctx)
	return e
}

func (e *env) now() time.Time {
	e.clockMu.Lock()
	defer e.clockMu.Unlock()
	return e.clock
}

func (e *env) advance(d time.Duration) {
	e.clockMu.Lock()
	e.clock = e.clock.Add(d)
	e.clockMu.Unlock()
}

// complete finishes open create and delete operations, as the controller
// and a worker would.
func (e *env) complete(ctx context.Context) {
	for ctx.Err() == nil {
		ops, err := e.st.ListOperations(ctx, store.OperationFilter{Open: true})
		if err == nil {
			for _, op := range ops {
				sb, err := e.st.GetSandbox(ctx, op.SandboxID)
				if err != nil {
					continue
				}
				switch op.Kind {
				case model.OpCreate:
					sb.State, sb.WorkerID = model.StateRunning, "w1"
				case model.OpDelete:
					sb.State = model.StateDeleted
				default:
					continue
				}
				op.State = model.OpSucceeded
				if err := e.st.InTx(ctx, func(tx store.Tx) error {
					if _, err := tx.UpdateSandbox(ctx, sb); err != nil {
						return err
					}
					_, err := tx.UpdateOperation(ctx, op)
					return err
				}); err == nil {
					e.ev.Sandbox(ctx, sb)
					e.ev.Operation(ctx, op)
				}
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

func (e *env) do(method, path, body string, hdr ...string) reply {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(e.ctx, method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("X-API-KEY", e.key)
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, b}
}

// wantError checks an E2B error body with code == status.
func wantError(t *testing.T, r reply, status int, msgPart string) {
	t.Helper()
	var eb errorBody
	if r.status != status || json.Unmarshal(r.body, &eb) != nil || eb.Code != status || !strings.Contains(eb.Message, msgPart) {
		t.Fatalf("got %d %s; want %d with code %d and a message containing %q", r.status, r.body, status, status, msgPart)
	}
}

func (e *env) create(body string) sandboxJSON {
	e.t.Helper()
	r := e.do("POST", "/v2/sandboxes", body)
	if r.status != http.StatusCreated {
		e.t.Fatalf("create: %d %s", r.status, r.body)
	}
	var sb sandboxJSON
	r.json(e.t, &sb)
	return sb
}

func TestKeyFormatAndAuth(t *testing.T) {
	e := newEnv(t)
	if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(e.key) {
		t.Fatalf("e2b key %q does not match e2b_<40 hex>", e.key)
	}
	_, native, err := e.svc.CreateKey(e.ctx, service.Principal{OrgID: service.DefaultOrgID, Admin: true}, service.DefaultOrgID, "n", false)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, key string
		status    int
	}{
		{"e2b key", e.key, 200},
		{"native key", native, 200},
		{"missing", "", 401},
		{"well-formed unknown", "e2b_" + strings.Repeat("0", 40), 401},
		{"malformed", "e2b_xyz", 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", e.srv.URL+"/v2/sandboxes", nil)
			if tc.key != "" {
				req.Header.Set("X-API-KEY", tc.key)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if tc.status != 200 {
				wantError(t, reply{resp.StatusCode, resp.Header, b}, tc.status, "")
			} else if resp.StatusCode != 200 {
				t.Fatalf("status %d %s", resp.StatusCode, b)
			}
		})
	}
}

func TestCreateGetListKill(t *testing.T) {
	e := newEnv(t)
	sb := e.create(`{"templateID":"base","timeout":120,"metadata":{"team":"a","n":"1"},"envVars":{"FOO":"bar"}}`)
	var raw map[string]any
	r := e.do("GET", "/sandboxes/"+sb.SandboxID, "")
	if r.status != 200 {
		t.Fatalf("get: %d %s", r.status, r.body)
	}
	r.json(t, &raw)
	for _, k := range []string{"templateID", "sandboxID", "clientID", "startedAt", "endAt", "envdVersion", "cpuCount", "memoryMB", "diskSizeMB", "state", "metadata"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("SandboxDetail lacks %q: %s", k, r.body)
		}
	}
	if raw["state"] != "running" || raw["envdVersion"] != EnvdVersion || raw["templateID"] != "base" {
		t.Errorf("detail = %s", r.body)
	}
	if md, _ := raw["metadata"].(map[string]any); md["team"] != "a" || len(md) != 2 {
		t.Errorf("metadata = %v; want the two pairs given", raw["metadata"])
	}
	if sb.EnvdAccessToken == "" || sb.EnvdVersion != EnvdVersion || sb.TrafficAccessToken != nil {
		t.Errorf("create answer = %+v", sb)
	}
	// The server is reached at 127.0.0.1:<port>: the domain is localhost:<port>.
	if _, port, _ := net.SplitHostPort(strings.TrimPrefix(e.srv.URL, "http://")); sb.Domain == nil || *sb.Domain != "localhost:"+port {
		t.Errorf("create answer domain = %v; want localhost:%s", sb.Domain, port)
	}
	if d, _ := raw["domain"].(string); sb.Domain != nil && d != *sb.Domain {
		t.Errorf("get answer domain = %q; want %q as create answered", d, *sb.Domain)
	}
	if got := e.do("POST", "/sandboxes/"+sb.SandboxID+"/connect", `{"timeout":10}`); got.status != 200 {
		t.Fatalf("connect running: %d %s", got.status, got.body)
	} else {
		var c sandboxJSON
		got.json(t, &c)
		if c.EnvdAccessToken != sb.EnvdAccessToken {
			t.Errorf("connect gave another envd token")
		}
	}
	stored, _ := e.st.GetSandbox(e.ctx, sb.SandboxID)
	if stored.Env["FOO"] != "bar" || stored.ExpiresAt == nil || stored.ExpiresAt.Sub(e.now()) < 110*time.Second {
		t.Errorf("stored sandbox env=%v expires=%v; want FOO and an expiry ~120 s out (connect must not shorten it)", stored.Env, stored.ExpiresAt)
	}

	other := e.create(`{"templateID":"base","metadata":{"team":"b"}}`)
	for _, tc := range []struct {
		query string
		want  []string
	}{
		{"", []string{sb.SandboxID, other.SandboxID}},
		{"?metadata=" + url.QueryEscape("team=a"), []string{sb.SandboxID}},
		{"?metadata=" + url.QueryEscape("team=a&n=2"), nil},
		{"?state=running", []string{sb.SandboxID, other.SandboxID}},
		{"?state=paused", nil},
	} {
		r := e.do("GET", "/v2/sandboxes"+tc.query, "")
		var got []listedSandbox
		r.json(t, &got)
		var ids []string
		for _, s := range got {
			ids = append(ids, s.SandboxID)
		}
		slices.Sort(ids)
		slices.Sort(tc.want)
		if fmt.Sprint(ids) != fmt.Sprint(tc.want) {
			t.Errorf("list%s = %v; want %v", tc.query, ids, tc.want)
		}
	}

	wantError(t, e.do("POST", "/sandboxes/"+sb.SandboxID+"/resume", "{}"), 409, "already running")
	if r := e.do("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", ""); r.status != 200 {
		t.Fatalf("v2 connect without a body: %d %s", r.status, r.body)
	}
	if r := e.do("DELETE", "/sandboxes/"+sb.SandboxID, ""); r.status != 204 {
		t.Fatalf("kill: %d %s", r.status, r.body)
	}
	wantError(t, e.do("GET", "/sandboxes/"+sb.SandboxID, ""), 404, "not found")
	wantError(t, e.do("DELETE", "/sandboxes/"+sb.SandboxID, ""), 404, "not found")
	wantError(t, e.do("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", "{}"), 404, "not found")
}

// TestListOrderAndFiltersBeforePaging: order (newest first by default),
// template and startedAfter narrow the list before it is paged, so a page
// of one is never empty while matches remain; metadata is decoded as the
// SDKs encode it (percent-encoded pairs, encoded again as the parameter).
func TestListOrderAndFiltersBeforePaging(t *testing.T) {
	e := newEnv(t)
	if err := e.st.PutTemplate(e.ctx, model.Template{Name: "other", Tag: "latest", Digest: baseDigest, SizeBytes: 1, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i, tpl := range []string{"other", "base", "other", "base", "other"} {
		md := fmt.Sprintf(`{"i":"%d"}`, i)
		if i == 3 {
			md = `{"a b&c=d":"x/y%z+1"}`
		}
		ids = append(ids, e.create(`{"templateID":"`+tpl+`","metadata":`+md+`}`).SandboxID)
		e.advance(time.Second)
	}
	t0 := e.now().Add(-3 * time.Second) // sandboxes 2, 3 and 4 start at or after it
	page := func(query string) []string {
		t.Helper()
		var all []string
		next := ""
		for range 10 {
			q := query
			if next != "" {
				q += "&nextToken=" + url.QueryEscape(next)
			}
			r := e.do("GET", "/v2/sandboxes?limit=1"+q, "")
			if r.status != 200 {
				t.Fatalf("list %s: %d %s", q, r.status, r.body)
			}
			var got []listedSandbox
			r.json(t, &got)
			if len(got) == 0 && r.header.Get("X-Next-Token") != "" {
				t.Fatalf("list %s: an empty page with a next token", q)
			}
			for _, s := range got {
				all = append(all, s.SandboxID)
			}
			if next = r.header.Get("X-Next-Token"); next == "" {
				return all
			}
		}
		t.Fatalf("list %s: more than 10 pages", query)
		return nil
	}
	rev := func(xs ...string) []string { out := slices.Clone(xs); slices.Reverse(out); return out }
	// What the JS SDK sends: encodeURIComponent on each key and value, then
	// URLSearchParams, then the query parameter's own encoding.
	sdkMeta := url.QueryEscape(url.Values{url.PathEscape("a b&c=d"): {url.QueryEscape("x/y%z+1")}}.Encode())
	for _, tc := range []struct {
		query string
		want  []string
	}{
		{"", rev(ids...)},
		{"&order=desc", rev(ids...)},
		{"&order=asc", ids},
		{"&template=other", []string{ids[4], ids[2], ids[0]}},
		{"&template=team%2Fbase&order=asc", []string{ids[1], ids[3]}},
		{"&startedAfter=" + url.QueryEscape(t0.Format(time.RFC3339Nano)) + "&order=asc", ids[2:]},
		{"&startedAfter=" + url.QueryEscape(t0.Format(time.RFC3339Nano)) + "&template=other", []string{ids[4], ids[2]}},
		{"&metadata=" + sdkMeta, []string{ids[3]}},
		{"&metadata=" + url.QueryEscape("i=1"), []string{ids[1]}},
	} {
		if got := page(tc.query); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("list%s = %v; want %v", tc.query, got, tc.want)
		}
	}
	wantError(t, e.do("GET", "/v2/sandboxes?order=sideways", ""), 400, "order")
	wantError(t, e.do("GET", "/v2/sandboxes?startedAfter=yesterday", ""), 400, "RFC 3339")
	// A cursor of one order is refused by the other.
	r := e.do("GET", "/v2/sandboxes?limit=1", "")
	if tok := r.header.Get("X-Next-Token"); tok == "" {
		t.Fatal("no next token on a page of one of five")
	} else if got := e.do("GET", "/v2/sandboxes?limit=1&order=asc&nextToken="+url.QueryEscape(tok), ""); got.status != 400 {
		t.Errorf("a newest-first cursor with order=asc: %d %s; want 400", got.status, got.body)
	}
}

func TestCreateRejects(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		body   string
		status int
		msg    string
	}{
		{`{"templateID":"nope"}`, 400, "not found"},
		{`{"templateID":"base","timeout":0}`, 400, "timeout"},
		{`{"templateID":"base","timeout":10000000000}`, 400, "timeout"}, // would overflow as a Duration
		{`{"templateID":"base","network":{"egressProxy":{"url":"http://p"}}}`, 501, "network.egressProxy"},
		{`{"templateID":"base","network":{"allowOut":"1.1.1.1"}}`, 400, "network.allowOut"},
		{`{"templateID":"base","network":{"denyOut":["evil.example.com"]}}`, 400, "network"},
		{`{"templateID":"base","volumeMounts":[{"name":"v","path":"/v"}]}`, 501, "volume"},
		{`{"templateID":"base","metadata":{"airlock.e2b.x":"1"}}`, 400, "reserved"},
		{`{"templateID":`, 400, "JSON"},
	} {
		wantError(t, e.do("POST", "/sandboxes", tc.body), tc.status, tc.msg)
	}
}

func TestPagination(t *testing.T) {
	e := newEnv(t)
	for range 3 {
		e.create(`{"templateID":"base"}`)
	}
	r := e.do("GET", "/v2/sandboxes?limit=2", "")
	var page []listedSandbox
	r.json(t, &page)
	next := r.header.Get("X-Next-Token")
	if len(page) != 2 || next == "" {
		t.Fatalf("first page: %d sandboxes, X-Next-Token %q", len(page), next)
	}
	r = e.do("GET", "/v2/sandboxes?limit=2&nextToken="+url.QueryEscape(next), "")
	r.json(t, &page)
	if len(page) != 1 || r.header.Get("X-Next-Token") != "" {
		t.Fatalf("last page: %d sandboxes, X-Next-Token %q", len(page), r.header.Get("X-Next-Token"))
	}
}

// expire runs one round of the controller, which acts on expired sandboxes
// (its expiry rule), on e's store and clock.
func (e *env) expire() {
	e.t.Helper()
	c := controller.New(controller.Config{Store: e.st, Events: e.ev, Now: e.now})
	if err := c.ReconcileAll(e.ctx); err != nil {
		e.t.Fatalf("controller round: %v", err)
	}
}

func TestTimeoutAndExpiry(t *testing.T) {
	e := newEnv(t)
	keep := e.create(`{"templateID":"base","timeout":600}`)
	sb := e.create(`{"templateID":"base","timeout":600}`)
	if r := e.do("POST", "/sandboxes/"+sb.SandboxID+"/timeout", `{"timeout":5}`); r.status != 204 {
		t.Fatalf("timeout: %d %s", r.status, r.body)
	}
	if got, _ := e.st.GetSandbox(e.ctx, sb.SandboxID); got.OnExpiry != model.ExpiryDelete {
		t.Fatalf("an E2B sandbox without autoPause has on_expiry %q; want %q", got.OnExpiry, model.ExpiryDelete)
	}
	e.expire()
	if got, _ := e.st.GetSandbox(e.ctx, sb.SandboxID); got.DesiredState == model.StateDeleted {
		t.Fatal("deleted before its expiry")
	}
	e.advance(10 * time.Second)
	e.expire()
	if got, _ := e.st.GetSandbox(e.ctx, sb.SandboxID); got.DesiredState != model.StateDeleted {
		t.Fatalf("expired sandbox has desired state %s; want deleted", got.DesiredState)
	}
	if got, _ := e.st.GetSandbox(e.ctx, keep.SandboxID); got.DesiredState == model.StateDeleted {
		t.Fatal("a sandbox that had not expired was deleted")
	}
	// refreshes extends, never shortens.
	if r := e.do("POST", "/sandboxes/"+keep.SandboxID+"/refreshes", `{"duration":1}`); r.status != 204 {
		t.Fatalf("refreshes: %d %s", r.status, r.body)
	}
	if got, _ := e.st.GetSandbox(e.ctx, keep.SandboxID); got.ExpiresAt.Sub(e.now()) < 500*time.Second {
		t.Fatalf("refreshes shortened the expiry to %v", got.ExpiresAt)
	}
}

func TestPauseConflict(t *testing.T) {
	e := newEnv(t)
	sb := e.create(`{"templateID":"base"}`)
	stored, _ := e.st.GetSandbox(e.ctx, sb.SandboxID)
	stored.State = model.StateSuspended
	if _, err := e.st.UpdateSandbox(e.ctx, stored); err != nil {
		t.Fatal(err)
	}
	wantError(t, e.do("POST", "/sandboxes/"+sb.SandboxID+"/pause", "{}"), 409, "already paused")
	var d sandboxDetail
	e.do("GET", "/sandboxes/"+sb.SandboxID, "").json(t, &d)
	if d.State != "paused" {
		t.Fatalf("state = %q; want paused", d.State)
	}
	wantError(t, e.do("POST", "/sandboxes/sb-missing/pause", "{}"), 404, "not found")
}

func TestUnsupportedAndUnknown(t *testing.T) {
	e := newEnv(t)
	sb := e.create(`{"templateID":"base"}`)
	for _, tc := range []struct{ method, path, msg string }{
		{"DELETE", "/templates/tags", "template"},
		{"DELETE", "/templates/base", "template"},
		{"GET", "/templates", "template"},
		{"GET", "/volumes", "volumes"},
		{"GET", "/volumecontent/vol-1/file", "volumes"},
		{"PUT", "/secrets/x/versions", "secrets call"},
	} {
		wantError(t, e.do(tc.method, tc.path, "{}"), 501, tc.msg)
	}
	// Snapshots and forks are checkpoints: the org's feature gate decides.
	wantError(t, e.do("POST", "/sandboxes/"+sb.SandboxID+"/snapshots", "{}"), 403, "feature gate")
	wantError(t, e.do("POST", "/sandboxes/"+sb.SandboxID+"/fork", "{}"), 403, "feature gate")
	wantError(t, e.do("POST", "/sandboxes/"+sb.SandboxID+"/snapshots", `{"name":"Bad Name!"}`), 400, "snapshot name")
	wantError(t, e.do("POST", "/sandboxes/"+sb.SandboxID+"/fork", `{"count":0}`), 400, "count")
	wantError(t, e.do("DELETE", "/templates/sb-missing:snap", ""), 404, "not found")
	wantError(t, e.do("POST", "/v2/sandboxes", `{"templateID":"sb-missing:snap"}`), 404, "not found")
	wantError(t, e.do("GET", "/nothing-here", ""), 404, "no such endpoint")
	if r := e.do("GET", "/sandboxes/"+sb.SandboxID+"/metrics", ""); r.status != 200 || strings.TrimSpace(string(r.body)) != "[]" {
		t.Fatalf("metrics without envd: %d %s; want 200 []", r.status, r.body)
	}
}

// TestSecrets: E2B's secrets API over the org's secrets; setting them
// takes an admin key, values never come back.
func TestSecrets(t *testing.T) {
	e := newEnv(t)
	wantError(t, e.do("POST", "/secrets", `{"name":"tok","value":"v"}`), 403, "admin key")
	_, admin, err := e.svc.CreateKeyWith(e.ctx, service.Principal{OrgID: service.DefaultOrgID, Admin: true}, service.DefaultOrgID, service.KeyOptions{Name: "e2b-admin", E2B: true, Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	e.key = admin
	r := e.do("POST", "/secrets", `{"name":"Api-Token","value":"s3cret"}`)
	if r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	var sec secretJSON
	r.json(t, &sec)
	if sec.SecretID != "sec_api-token" || sec.Name != "api-token" || sec.CurrentVersion != 1 || sec.Metadata == nil || strings.Contains(string(r.body), "s3cret") {
		t.Fatalf("create answer %s", r.body)
	}
	wantError(t, e.do("POST", "/secrets", `{"name":"api-token","value":"x"}`), 409, "already exists")
	wantError(t, e.do("POST", "/secrets", `{"name":"sec_x","value":"x"}`), 400, "reserved")
	wantError(t, e.do("POST", "/secrets", `{"name":"m","value":"x","metadata":{"a":"b"}}`), 501, "metadata")
	if r := e.do("GET", "/secrets/sec_api-token", ""); r.status != 200 || !strings.Contains(string(r.body), `"name":"api-token"`) {
		t.Fatalf("get: %d %s", r.status, r.body)
	}
	if r := e.do("POST", "/secrets/sec_api-token", `{"value":"new"}`); r.status != 200 {
		t.Fatalf("update: %d %s", r.status, r.body)
	}
	if v, err := e.st.SecretValues(e.ctx, service.DefaultOrgID, []string{"api-token"}); err != nil || v["api-token"] != "new" {
		t.Fatalf("stored value after update = %q, %v; want new", v["api-token"], err)
	}
	if r := e.do("GET", "/secrets", ""); r.status != 200 || !strings.Contains(string(r.body), "sec_api-token") || strings.Contains(string(r.body), "new") {
		t.Fatalf("list: %d %s", r.status, r.body)
	}
	if r := e.do("DELETE", "/secrets/sec_api-token", ""); r.status != 204 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	wantError(t, e.do("GET", "/secrets/sec_api-token", ""), 404, "not found")
	wantError(t, e.do("DELETE", "/secrets/sec_api-token", ""), 404, "not found")
}

func TestSandboxTarget(t *testing.T) {
	for _, tc := range []struct {
		name    string
		hdr     map[string]string
		host    string
		ok, bad bool
		id      string
		port    int
	}{
		{"header default port", map[string]string{HeaderSandboxID: "sb-x"}, "127.0.0.1:7070", true, false, "sb-x", EnvdPort},
		{"header port", map[string]string{HeaderSandboxID: "sb-x", HeaderSandboxPort: "8000"}, "", true, false, "sb-x", 8000},
		{"header bad port", map[string]string{HeaderSandboxID: "sb-x", HeaderSandboxPort: "http"}, "", true, true, "sb-x", 0},
		{"host", nil, "8000-sb-abc.airlock.test:7070", true, false, "sb-abc", 8000},
		{"host envd", nil, "49983-sb-abc.localhost", true, false, "sb-abc", EnvdPort},
		{"plain ip", nil, "127.0.0.1:7070", false, false, "", 0},
		{"localhost", nil, "localhost:7070", false, false, "", 0},
		{"api host", nil, "api.example.com", false, false, "", 0},
		{"hyphen name", nil, "my-host.example.com", false, false, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/health", nil)
			r.Host = tc.host
			for k, v := range tc.hdr {
				r.Header.Set(k, v)
			}
			got, ok, err := sandboxTarget(r)
			if ok != tc.ok || (err != nil) != tc.bad {
				t.Fatalf("ok=%v err=%v; want ok=%v bad=%v", ok, err, tc.ok, tc.bad)
			}
			if ok && !tc.bad && (got.sandboxID != tc.id || got.port != tc.port) {
				t.Fatalf("target = %+v; want %s:%d", got, tc.id, tc.port)
			}
		})
	}
}

func TestCheckSignature(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	sign := func(path, op, user, tok string, exp int64) string {
		raw := path + ":" + op + ":" + user + ":" + tok
		if exp != 0 {
			raw += fmt.Sprintf(":%d", exp)
		}
		sum := sha256.Sum256([]byte(raw))
		return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
	}
	for _, tc := range []struct {
		name, method, query string
		ok                  bool
	}{
		{"read", "GET", "path=/home/user/a&signature=" + url.QueryEscape(sign("/home/user/a", "read", "", "T", 0)), true},
		{"write with user", "POST", "path=a&username=user&signature=" + url.QueryEscape(sign("a", "write", "user", "T", 0)), true},
		{"read signature used to write", "POST", "path=a&signature=" + url.QueryEscape(sign("a", "read", "", "T", 0)), false},
		{"other token", "GET", "path=a&signature=" + url.QueryEscape(sign("a", "read", "", "U", 0)), false},
		{"unexpired", "GET", fmt.Sprintf("path=a&signature_expiration=%d&signature=%s", now.Unix()+60, url.QueryEscape(sign("a", "read", "", "T", now.Unix()+60))), true},
		{"expired", "GET", fmt.Sprintf("path=a&signature_expiration=%d&signature=%s", now.Unix()-1, url.QueryEscape(sign("a", "read", "", "T", now.Unix()-1))), false},
		{"none", "GET", "path=a", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, "/files?"+tc.query, nil)
			if err := checkSignature(r, "T", now); (err == nil) != tc.ok {
				t.Fatalf("err = %v; want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestRouterForwardsToWorker(t *testing.T) {
	e := newEnv(t)
	sb := e.create(`{"templateID":"base"}`)
	key, err := service.StoreSigningKey(e.st)(e.ctx)
	if err != nil {
		t.Fatal(err)
	}

	// Unknown sandbox, and envd without an access token.
	r := e.do("GET", "/health", "", HeaderSandboxID, "sb-unknown")
	var se sandboxError
	r.json(t, &se)
	if r.status != 502 || se.Code != 502 || se.SandboxID != "sb-unknown" {
		t.Fatalf("unknown sandbox: %d %s; want 502 with sandboxId", r.status, r.body)
	}
	if r := e.do("POST", "/process.Process/List", "{}", HeaderSandboxID, sb.SandboxID); r.status != 401 {
		t.Fatalf("envd RPC without token: %d %s; want 401", r.status, r.body)
	}
	if r := e.do("POST", "/process.Process/List", "{}", HeaderSandboxID, sb.SandboxID, "X-Access-Token", "v1.forged.sig"); r.status != 401 {
		t.Fatalf("envd RPC with a bad token: %d %s; want 401", r.status, r.body)
	}

	for _, tc := range []struct {
		name, method, path string
		hdr                []string
		wantPath           string
	}{
		{"envd rpc", "POST", "/process.Process/List", []string{HeaderSandboxID, sb.SandboxID, "X-Access-Token", sb.EnvdAccessToken}, "/e2b/" + sb.SandboxID + "/49983/process.Process/List"},
		{"health needs no token", "GET", "/health", []string{HeaderSandboxID, sb.SandboxID}, "/e2b/" + sb.SandboxID + "/49983/health"},
		{"user port by header", "GET", "/index.html?q=1", []string{HeaderSandboxID, sb.SandboxID, HeaderSandboxPort, "8000"}, "/e2b/" + sb.SandboxID + "/8000/index.html?q=1"},
		{"user port by host", "GET", "/x", []string{"Host", "8000-" + sb.SandboxID + ".airlock.test"}, "/e2b/" + sb.SandboxID + "/8000/x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(tc.method, tc.path, "", tc.hdr...)
			if r.status != 200 || r.header.Get("X-Path") != tc.wantPath {
				t.Fatalf("got %d path %q body %s; want 200 at %s", r.status, r.header.Get("X-Path"), r.body, tc.wantPath)
			}
			e.mu.Lock()
			last := e.dpSeen[len(e.dpSeen)-1]
			e.mu.Unlock()
			c, err := token.Verify(token.WorkerKey(key, "w1"), last.Header.Get(HeaderDataPlaneToken), time.Now()) // w1's own key
			if err != nil || c.SandboxID != sb.SandboxID || c.Scope != token.ScopeEnvd {
				t.Fatalf("worker got token claims %+v, err %v", c, err)
			}
		})
	}

	// A paused sandbox: envd /health answers 502 (isRunning() false).
	stored, _ := e.st.GetSandbox(e.ctx, sb.SandboxID)
	stored.State = model.StateSuspended
	if _, err := e.st.UpdateSandbox(e.ctx, stored); err != nil {
		t.Fatal(err)
	}
	if r := e.do("GET", "/health", "", HeaderSandboxID, sb.SandboxID); r.status != 502 {
		t.Fatalf("paused sandbox health: %d %s; want 502", r.status, r.body)
	}
}

// TestRouterStreams checks that a streamed answer reaches the client
// message by message: the stand-in worker writes the second message only
// after the client has read the first.
func TestRouterStreams(t *testing.T) {
	e := newEnv(t)
	sb := e.create(`{"templateID":"base"}`)
	gotFirst := make(chan struct{})
	e.mu.Lock()
	e.dpHook = func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/connect+json")
		w.WriteHeader(200)
		io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		select {
		case <-gotFirst:
		case <-r.Context().Done():
			return true
		}
		io.WriteString(w, "second\n")
		return true
	}
	e.mu.Unlock()
	req, _ := http.NewRequestWithContext(e.ctx, "POST", e.srv.URL+"/process.Process/Start", strings.NewReader("{}"))
	req.Header.Set(HeaderSandboxID, sb.SandboxID)
	req.Header.Set("X-Access-Token", sb.EnvdAccessToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "first\n" {
		t.Fatalf("first message: %q %v", line, err)
	}
	close(gotFirst)
	if line, err = br.ReadString('\n'); err != nil || line != "second\n" {
		t.Fatalf("second message: %q %v", line, err)
	}
}

func TestExpirySuspendsAutoPause(t *testing.T) {
	e := newEnv(t)
	sb := e.create(`{"templateID":"base","timeout":60,"autoPause":true}`)
	var d sandboxDetail
	e.do("GET", "/sandboxes/"+sb.SandboxID, "").json(t, &d)
	if d.Lifecycle.OnTimeout != "pause" || len(d.Metadata) != 0 {
		t.Fatalf("detail lifecycle %+v metadata %v; want onTimeout pause and no reserved keys", d.Lifecycle, d.Metadata)
	}
	if got, _ := e.st.GetSandbox(e.ctx, sb.SandboxID); got.OnExpiry != model.ExpirySuspend || len(got.Metadata) != 0 {
		t.Fatalf("autoPause stored as on_expiry %q, metadata %v; want %q and no metadata", got.OnExpiry, got.Metadata, model.ExpirySuspend)
	}
	e.advance(2 * time.Minute)
	e.expire()
	got, _ := e.st.GetSandbox(e.ctx, sb.SandboxID)
	if got.DesiredState == model.StateDeleted {
		t.Fatal("an autoPause sandbox was deleted at its timeout")
	}
	ops, err := e.st.ListOperations(e.ctx, store.OperationFilter{SandboxID: sb.SandboxID})
	if err != nil {
		t.Fatal(err)
	}
	var suspend bool
	for _, op := range ops {
		suspend = suspend || op.Kind == model.OpSuspend
	}
	if !suspend || got.ExpiresAt != nil {
		t.Fatalf("after expiry: suspend operation %v, expires_at %v; want a suspend and no expiry", suspend, got.ExpiresAt)
	}
}

// TestConfiguredDomain: an operator's sandbox domain is what create and
// get answer, whatever host the request came to.
func TestConfiguredDomain(t *testing.T) {
	e := newEnv(t)
	e.a.SetDomain("Sandboxes.Example.TEST.")
	sb := e.create(`{"templateID":"base"}`)
	if sb.Domain == nil || *sb.Domain != "sandboxes.example.test" {
		t.Fatalf("create domain = %v; want sandboxes.example.test", sb.Domain)
	}
	var d struct {
		Domain *string `json:"domain"`
	}
	e.do("GET", "/sandboxes/"+sb.SandboxID, "").json(t, &d)
	if d.Domain == nil || *d.Domain != "sandboxes.example.test" {
		t.Fatalf("get domain = %v; want sandboxes.example.test", d.Domain)
	}
}
