package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/token"
)

// raw sends a request with an optional bearer key and returns the status,
// headers and decoded error body (if any).
func raw(t *testing.T, method, url, key, body string) (int, http.Header, apitypes.ErrorBody) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e apitypes.ErrorResponse
	if resp.StatusCode >= 400 && resp.StatusCode != http.StatusServiceUnavailable || strings.Contains(string(b), `"error"`) {
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatalf("%s %s: status %d body is not a JSON error: %q", method, url, resp.StatusCode, b)
		}
	}
	return resp.StatusCode, resp.Header, e.Error
}

func apiStatus(t *testing.T, err error) (int, string) {
	t.Helper()
	var ae *client.APIError
	if !errors.As(err, &ae) {
		t.Fatalf("want *client.APIError, got %T %v", err, err)
	}
	return ae.Status, ae.Code
}

func TestAuthentication(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct{ name, key string }{
		{"no key", ""},
		{"malformed key", "hello"},
		{"unknown key", "al_0123456789abcdef0123456789abcdef01234567"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.client(tc.key).ListSandboxes(e.ctx, client.SandboxFilter{})
			if st, code := apiStatus(t, err); st != 401 || code != "unauthorized" {
				t.Fatalf("got %d %s, want 401 unauthorized", st, code)
			}
			if !errors.Is(err, model.ErrUnauthorized) {
				t.Fatalf("errors.Is(err, ErrUnauthorized) = false for %v", err)
			}
		})
	}
	if _, err := e.admin.ListSandboxes(e.ctx, client.SandboxFilter{}); err != nil {
		t.Fatalf("admin key rejected: %v", err)
	}
}

func TestOtherOrgSandboxIsNotFound(t *testing.T) {
	e := newEnv(t)
	other, _ := e.orgClient("other", false)
	sb, op := e.create(other)
	dp := e.dataPlane()
	e.markRunning(sb.ID, dp.URL)

	calls := map[string]func() error{
		"get":    func() error { _, err := e.admin.GetSandbox(e.ctx, sb.ID); return err },
		"delete": func() error { _, err := e.admin.DeleteSandbox(e.ctx, sb.ID); return err },
		"create command": func() error {
			_, err := e.admin.CreateCommand(e.ctx, sb.ID, client.CreateCommandRequest{Cmd: "id"})
			return err
		},
		"list commands": func() error { _, err := e.admin.ListCommands(e.ctx, sb.ID); return err },
		"files session": func() error { _, err := e.admin.FilesSession(e.ctx, sb.ID); return err },
		"operation":     func() error { _, err := e.admin.GetOperation(e.ctx, op.ID); return err },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			if st, code := apiStatus(t, call()); st != 404 || code != "not_found" {
				t.Fatalf("got %d %s, want 404 not_found", st, code)
			}
		})
	}
	// The owner still sees it, running and undeleted.
	got, err := other.GetSandbox(e.ctx, sb.ID)
	if err != nil || got.State != model.StateRunning || got.DesiredState != model.StateRunning {
		t.Fatalf("owner get: %+v %v", got, err)
	}
	page, err := e.admin.ListSandboxes(e.ctx, client.SandboxFilter{})
	if err != nil || len(page.Sandboxes) != 0 {
		t.Fatalf("admin list shows other org's sandboxes: %+v %v", page, err)
	}
}

func TestErrorStatuses(t *testing.T) {
	e := newEnv(t)
	pending, _ := e.create(e.admin)
	member, _ := e.orgClient("member-org", false)
	memberKey := member.APIKey
	u := e.srv.URL
	k := e.adminKey

	tests := []struct {
		name               string
		method, path, body string
		key                string
		status             int
		code               string
		msg                string // substring of the message
	}{
		{"malformed json", "POST", "/v1/sandboxes", "{", k, 400, "bad_request", "not valid JSON"},
		{"unknown field", "POST", "/v1/sandboxes", `{"bogus":1}`, k, 400, "bad_request", "bogus"},
		{"trailing data", "POST", "/v1/sandboxes", `{} {}`, k, 400, "bad_request", "after the JSON"},
		{"bad limit", "GET", "/v1/sandboxes?limit=abc", "", k, 400, "bad_request", "limit"},
		{"bad wait", "GET", "/v1/operations/op-x?wait=soon", "", k, 400, "bad_request", "wait"},
		{"bad last-event-id", "GET", "/v1/events?after=x", "", k, 400, "bad_request", "after"},
		{"no key", "GET", "/v1/sandboxes", "", "", 401, "unauthorized", "API key"},
		{"non-admin creates org", "POST", "/v1/orgs", `{"name":"x"}`, memberKey, 403, "forbidden", "admin"},
		{"non-admin lists orgs", "GET", "/v1/orgs", "", memberKey, 403, "forbidden", "admin"},
		{"non-admin creates key", "POST", "/v1/orgs/org-default/keys", `{}`, memberKey, 403, "forbidden", "admin"},
		{"missing sandbox", "GET", "/v1/sandboxes/sb-nope", "", k, 404, "not_found", "sandbox sb-nope not found"},
		{"missing operation", "GET", "/v1/operations/op-nope", "", k, 404, "not_found", "operation op-nope not found"},
		{"key in missing org", "POST", "/v1/orgs/org-nope/keys", `{}`, k, 404, "not_found", "org-nope"},
		{"unknown route", "GET", "/v1/nothing", "", k, 404, "not_found", "no such endpoint"},
		{"wrong method", "PUT", "/v1/templates", "", k, 405, "method_not_allowed", "GET"},
		{"command on pending sandbox", "POST", "/v1/sandboxes/" + pending.ID + "/commands", `{"cmd":"id"}`, k, 409, "conflict",
			"sandbox " + pending.ID + " is pending; commands need a running sandbox"},
		{"files on pending sandbox", "POST", "/v1/sandboxes/" + pending.ID + "/files/session", ``, k, 409, "conflict", "is pending"},
		{"huge body", "POST", "/v1/sandboxes", `{"env":{"A":"` + strings.Repeat("x", 2<<20) + `"}}`, k, 413, "too_large", "larger than"},
		{"too many vcpus", "POST", "/v1/sandboxes", `{"resources":{"vcpus":9}}`, k, 422, "unprocessable", "between 1 and 8"},
		{"too little memory", "POST", "/v1/sandboxes", `{"resources":{"memory_mib":64}}`, k, 422, "unprocessable", "between 128 and 16384"},
		{"unknown template", "POST", "/v1/sandboxes", `{"template":"nope"}`, k, 422, "unprocessable", `template "nope" not found; GET /v1/templates lists them`},
		{"bad digest", "POST", "/v1/sandboxes", `{"template":"sha256:abc"}`, k, 422, "unprocessable", "digest"},
		{"unknown runtime", "POST", "/v1/sandboxes", `{"runtime":"qemu"}`, k, 422, "unprocessable", "runtime"},
		{"negative timeout", "POST", "/v1/sandboxes", `{"timeout_s":-1}`, k, 422, "unprocessable", "timeout_s"},
		{"empty env key", "POST", "/v1/sandboxes", `{"env":{"":"x"}}`, k, 422, "unprocessable", "env key"},
		{"long metadata value", "POST", "/v1/sandboxes", `{"metadata":{"k":"` + strings.Repeat("v", 1025) + `"}}`, k, 422, "unprocessable", "1024"},
		{"cmd and argv", "POST", "/v1/sandboxes/" + pending.ID + "/commands", `{"cmd":"id","argv":["id"]}`, k, 422, "unprocessable", "not both"},
		{"no cmd", "POST", "/v1/sandboxes/" + pending.ID + "/commands", `{}`, k, 409, "conflict", "running sandbox"}, // neither cmd nor argv is the template's own command: checked on a running sandbox
		{"limit too big", "GET", "/v1/sandboxes?limit=1001", "", k, 422, "unprocessable", "1000"},
		{"unknown state", "GET", "/v1/sandboxes?state=sleeping", "", k, 422, "unprocessable", "sleeping"},
		{"bad cursor", "GET", "/v1/sandboxes?cursor=!!!", "", k, 422, "unprocessable", "cursor"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, _, eb := raw(t, tc.method, u+tc.path, tc.key, tc.body)
			if st != tc.status || eb.Code != tc.code || !strings.Contains(eb.Message, tc.msg) {
				t.Fatalf("got %d %q %q; want %d %q containing %q", st, eb.Code, eb.Message, tc.status, tc.code, tc.msg)
			}
		})
	}

	t.Run("too much metadata", func(t *testing.T) {
		md := map[string]string{}
		for i := range 65 {
			md[fmt.Sprint("k", i)] = "v"
		}
		_, _, err := e.admin.CreateSandbox(e.ctx, client.CreateSandboxRequest{Metadata: md}, "")
		if st, _ := apiStatus(t, err); st != 422 || !strings.Contains(err.Error(), "at most 64") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("healthz without worker", func(t *testing.T) {
		h, err := e.admin.Health(e.ctx)
		if st, code := apiStatus(t, err); st != 503 || code != "unavailable" || h.Status != "unavailable" || !strings.Contains(h.Reason, "worker") {
			t.Fatalf("got %+v %v", h, err)
		}
		e.markRunning(pending.ID, "http://127.0.0.1:1") // registers a worker with a fresh heartbeat
		h, err = e.client("").Health(e.ctx)
		if err != nil || h.Status != "ok" {
			t.Fatalf("with a worker: %+v %v", h, err)
		}
	})
	t.Run("unreachable worker", func(t *testing.T) {
		// pending is now "running" on a worker whose data plane is closed.
		_, err := e.admin.ListCommands(e.ctx, pending.ID)
		if st, code := apiStatus(t, err); st != 503 || code != "unavailable" {
			t.Fatalf("got %v", err)
		}
	})
}

func TestRateLimit(t *testing.T) {
	e := newEnv(t, func(s *service.Config) { s.RateLimit, s.RateBurst = 0.01, 3 })
	for i := range 3 {
		if _, err := e.admin.ListTemplates(e.ctx); err != nil {
			t.Fatalf("request %d within burst: %v", i, err)
		}
	}
	st, hdr, eb := raw(t, "GET", e.srv.URL+"/v1/templates", e.adminKey, "")
	if st != 429 || eb.Code != "rate_limited" {
		t.Fatalf("got %d %+v, want 429 rate_limited", st, eb)
	}
	if n, err := strconv.Atoi(hdr.Get("Retry-After")); err != nil || n < 1 {
		t.Fatalf("Retry-After = %q", hdr.Get("Retry-After"))
	}
	// Another key has its own bucket.
	_, secret, err := e.svc.CreateKey(e.ctx, service.Principal{OrgID: service.DefaultOrgID, Admin: true}, service.DefaultOrgID, "second", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.client(secret).ListTemplates(e.ctx); err != nil {
		t.Fatalf("a fresh key is limited by another key's use: %v", err)
	}
	if _, err := e.admin.ListTemplates(e.ctx); !errors.Is(err, model.ErrRateLimited) {
		t.Fatalf("client error for 429: %v", err)
	}
}

func TestIdempotentCreate(t *testing.T) {
	e := newEnv(t)
	req := client.CreateSandboxRequest{Template: "base:latest", Metadata: map[string]string{"a": "b"}}
	sb1, op1, err := e.admin.CreateSandbox(e.ctx, req, "key-1")
	if err != nil {
		t.Fatal(err)
	}
	kicks := e.kicks.Load()
	sb2, op2, err := e.admin.CreateSandbox(e.ctx, req, "key-1")
	if err != nil {
		t.Fatal(err)
	}
	if sb1.ID != sb2.ID || op1.ID != op2.ID {
		t.Fatalf("same key gave (%s,%s) then (%s,%s)", sb1.ID, op1.ID, sb2.ID, op2.ID)
	}
	if e.kicks.Load() != kicks {
		t.Fatalf("a repeated create kicked the controllers")
	}
	sb3, op3, err := e.admin.CreateSandbox(e.ctx, req, "key-2")
	if err != nil || sb3.ID == sb1.ID || op3.ID == op1.ID {
		t.Fatalf("new key reused ids: %s %s %v", sb3.ID, op3.ID, err)
	}
	page, err := e.admin.ListSandboxes(e.ctx, client.SandboxFilter{})
	if err != nil || len(page.Sandboxes) != 2 {
		t.Fatalf("want 2 sandboxes, got %d (%v)", len(page.Sandboxes), err)
	}
	// The same key in another org is independent.
	other, _ := e.orgClient("other", false)
	sb4, _, err := other.CreateSandbox(e.ctx, req, "key-1")
	if err != nil || sb4.ID == sb1.ID {
		t.Fatalf("other org's key-1 returned %s (%v)", sb4.ID, err)
	}
}

func TestCreateDefaultsAndIDs(t *testing.T) {
	e := newEnv(t)
	sb, op, err := e.admin.CreateSandbox(e.ctx, client.CreateSandboxRequest{
		Template: baseDigest, Env: map[string]string{"A": "1"}, TimeoutS: 60,
	}, "")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^sb-[a-z2-7]{26}$`).MatchString(sb.ID) || !regexp.MustCompile(`^op-[a-z2-7]{26}$`).MatchString(op.ID) {
		t.Fatalf("ids %q %q do not have the fixed form", sb.ID, op.ID)
	}
	want := model.Resources{VCPUs: 1, MemoryMiB: 512, DiskMiB: 4096}
	if sb.Resources != want || sb.Runtime != "gvisor" || sb.State != model.StatePending || sb.DesiredState != model.StateRunning ||
		sb.TemplateDigest != baseDigest || sb.OrgID != service.DefaultOrgID || sb.ExpiresAt == nil || sb.Env["A"] != "1" {
		t.Fatalf("sandbox %+v", sb)
	}
	if op.Kind != model.OpCreate || op.State != model.OpPending || op.Target != model.StateRunning || op.SandboxID != sb.ID ||
		op.Deadline.Sub(op.CreatedAt) != model.DefaultOperationDeadline {
		t.Fatalf("operation %+v", op)
	}
	if e.kicks.Load() == 0 {
		t.Fatal("create did not kick the controllers")
	}
	for _, ref := range []string{"base", "base:latest"} {
		sb, _, err := e.admin.CreateSandbox(e.ctx, client.CreateSandboxRequest{Template: ref}, "")
		if err != nil || sb.Template != ref || sb.TemplateDigest != baseDigest {
			t.Fatalf("template %q: %+v %v", ref, sb, err)
		}
	}
	if _, _, err := e.admin.CreateSandbox(e.ctx, client.CreateSandboxRequest{Template: "base:v2"}, ""); err == nil {
		t.Fatal("unknown tag accepted")
	}
}

func TestListFiltersAndPagination(t *testing.T) {
	e := newEnv(t)
	var all []string
	for i := range 7 {
		team := "a"
		if i%2 == 1 {
			team = "b"
		}
		sb, _, err := e.admin.CreateSandbox(e.ctx, client.CreateSandboxRequest{Metadata: map[string]string{"team": team, "n": fmt.Sprint(i)}}, "")
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, sb.ID)
	}
	var got []string
	cursor := ""
	pages := 0
	for {
		page, err := e.admin.ListSandboxes(e.ctx, client.SandboxFilter{Limit: 3, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Sandboxes) > 3 {
			t.Fatalf("page of %d with limit 3", len(page.Sandboxes))
		}
		for _, sb := range page.Sandboxes {
			got = append(got, sb.ID)
		}
		pages++
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	if !slices.Equal(got, all) || pages < 3 {
		t.Fatalf("paged %v in %d pages, want %v", got, pages, all)
	}

	page, err := e.admin.ListSandboxes(e.ctx, client.SandboxFilter{Metadata: map[string]string{"team": "b"}})
	if err != nil || len(page.Sandboxes) != 3 {
		t.Fatalf("team=b: %d sandboxes (%v)", len(page.Sandboxes), err)
	}
	for _, sb := range page.Sandboxes {
		if sb.Metadata["team"] != "b" {
			t.Fatalf("team=b listed %+v", sb.Metadata)
		}
	}
	page, err = e.admin.ListSandboxes(e.ctx, client.SandboxFilter{Metadata: map[string]string{"team": "a", "n": "4"}})
	if err != nil || len(page.Sandboxes) != 1 || page.Sandboxes[0].ID != all[4] {
		t.Fatalf("team=a,n=4: %+v (%v)", page.Sandboxes, err)
	}

	e.markRunning(all[2], "http://127.0.0.1:1")
	page, err = e.admin.ListSandboxes(e.ctx, client.SandboxFilter{States: []model.SandboxState{model.StateRunning}})
	if err != nil || len(page.Sandboxes) != 1 || page.Sandboxes[0].ID != all[2] {
		t.Fatalf("state=running: %+v (%v)", page.Sandboxes, err)
	}
	page, err = e.admin.ListSandboxes(e.ctx, client.SandboxFilter{States: []model.SandboxState{model.StatePending, model.StateRunning}})
	if err != nil || len(page.Sandboxes) != 7 {
		t.Fatalf("state=pending,running: %d (%v)", len(page.Sandboxes), err)
	}
	// Comma-separated states work too.
	st, _, _ := raw(t, "GET", e.srv.URL+"/v1/sandboxes?state=pending,running", e.adminKey, "")
	if st != 200 {
		t.Fatalf("comma-separated states: %d", st)
	}
}

func TestDelete(t *testing.T) {
	e := newEnv(t)
	sb, _ := e.create(e.admin)
	kicks := e.kicks.Load()
	op1, err := e.admin.DeleteSandbox(e.ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if op1.Kind != model.OpDelete || op1.Target != model.StateDeleted || op1.SandboxID != sb.ID || e.kicks.Load() == kicks {
		t.Fatalf("delete op %+v (kicked %v)", op1, e.kicks.Load() != kicks)
	}
	got, err := e.admin.GetSandbox(e.ctx, sb.ID)
	if err != nil || got.DesiredState != model.StateDeleted {
		t.Fatalf("after delete: %+v %v", got, err)
	}
	op2, err := e.admin.DeleteSandbox(e.ctx, sb.ID)
	if err != nil || op2.ID != op1.ID {
		t.Fatalf("second delete: %s %v, want %s", op2.ID, err, op1.ID)
	}
	// The controller finishes the delete.
	cur, _ := e.st.GetSandbox(e.ctx, sb.ID)
	cur.State = model.StateDeleted
	if _, err := e.st.UpdateSandbox(e.ctx, cur); err != nil {
		t.Fatal(err)
	}
	e.completeOp(op1.ID, model.OpSucceeded, "")
	_, err = e.admin.DeleteSandbox(e.ctx, sb.ID)
	if st, _ := apiStatus(t, err); st != 404 {
		t.Fatalf("delete of deleted sandbox: %v", err)
	}
	page, err := e.admin.ListSandboxes(e.ctx, client.SandboxFilter{})
	if err != nil || len(page.Sandboxes) != 0 {
		t.Fatalf("deleted sandbox listed: %+v", page)
	}
	page, err = e.admin.ListSandboxes(e.ctx, client.SandboxFilter{States: []model.SandboxState{model.StateDeleted}})
	if err != nil || len(page.Sandboxes) != 1 {
		t.Fatalf("state=deleted lists %d", len(page.Sandboxes))
	}
}

func TestWaitOperation(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name   string
		state  model.OperationState
		reason string
	}{
		{"succeeds", model.OpSucceeded, ""},
		{"fails", model.OpFailed, "template missing on every worker"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, op := e.create(e.admin)
			waiting := make(chan struct{}, 1)
			f := func(r *http.Request) {
				if r.URL.Path == "/v1/operations/"+op.ID && r.URL.Query().Get("wait") != "" {
					select {
					case waiting <- struct{}{}:
					default:
					}
				}
			}
			e.hook.Store(&f)
			defer e.hook.Store(nil)
			go func() {
				<-waiting // the client is in a long poll
				e.completeOp(op.ID, tc.state, tc.reason)
			}()
			got, err := e.admin.WaitOperation(e.ctx, op.ID)
			if got.State != tc.state {
				t.Fatalf("state %s, want %s", got.State, tc.state)
			}
			if tc.state == model.OpSucceeded {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var oe *client.OperationError
			if !errors.As(err, &oe) || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("err %v, want an OperationError naming %q", err, tc.reason)
			}
		})
	}
	t.Run("wait times out with the open operation", func(t *testing.T) {
		_, op := e.create(e.admin)
		var got model.Operation
		st, _, _ := raw(t, "GET", e.srv.URL+"/v1/operations/"+op.ID+"?wait=10ms", e.adminKey, "")
		if st != 200 {
			t.Fatalf("status %d", st)
		}
		got, err := e.admin.GetOperation(e.ctx, op.ID)
		if err != nil || got.State != model.OpPending {
			t.Fatalf("%+v %v", got, err)
		}
	})
}

func TestCommandsAndFiles(t *testing.T) {
	e := newEnv(t)
	sb, _ := e.create(e.admin)
	dp := e.dataPlane()
	e.markRunning(sb.ID, dp.URL)
	key, err := service.StoreSigningKey(e.st)(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := e.st.GetSandbox(e.ctx, sb.ID)

	for _, tc := range []struct {
		name string
		req  client.CreateCommandRequest
		argv []string
	}{
		{"cmd", client.CreateCommandRequest{Cmd: "echo hi", Env: map[string]string{"X": "1"}, Cwd: "/tmp", Stdin: true, TimeoutS: 5}, []string{"/bin/bash", "-lc", "echo hi"}},
		{"argv", client.CreateCommandRequest{Argv: []string{"id", "-u"}}, []string{"id", "-u"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs, err := e.admin.CreateCommand(e.ctx, sb.ID, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if !regexp.MustCompile(`^cmd-[a-z2-7]{26}$`).MatchString(cs.ID) {
				t.Fatalf("command id %q", cs.ID)
			}
			wantURL := "ws" + strings.TrimPrefix(dp.URL, "http") + "/v1/sandboxes/" + sb.ID + "/commands/" + cs.ID + "/attach"
			if cs.AttachURL != wantURL {
				t.Fatalf("attach_url %q, want %q", cs.AttachURL, wantURL)
			}
			c, err := token.Verify(token.WorkerKey(key, "w1"), cs.Token, time.Now())
			if err != nil {
				t.Fatalf("token does not verify with the store's key: %v", err)
			}
			if c.Scope != token.ScopeCommand || c.SandboxID != sb.ID || c.OrgID != sb.OrgID || c.Command == nil ||
				c.Command.ID != cs.ID || !slices.Equal(c.Command.Argv, tc.argv) || c.Command.Cwd != tc.req.Cwd ||
				c.Command.Stdin != tc.req.Stdin || c.Command.TimeoutS != tc.req.TimeoutS || c.Expires != cs.ExpiresAt.Unix() {
				t.Fatalf("claims %+v cmd %+v", c, c.Command)
			}
		})
	}
	after, _ := e.st.GetSandbox(e.ctx, sb.ID)
	if !after.LastActivityAt.After(before.LastActivityAt) {
		t.Fatalf("command did not touch the sandbox: %v -> %v", before.LastActivityAt, after.LastActivityAt)
	}

	// The worker pages the list; the client follows every page.
	cmds, err := e.admin.ListCommands(e.ctx, sb.ID)
	if err != nil || len(cmds) != 3 || cmds[0].ID != "cmd-fixed" || cmds[0].PID != 42 || cmds[2].ID != "cmd-3" {
		t.Fatalf("list commands: %+v %v", cmds, err)
	}
	page, err := e.admin.ListCommandsPage(e.ctx, sb.ID, 1, "")
	if err != nil || len(page.Commands) != 1 || page.NextCursor == "" {
		t.Fatalf("first page of 1: %+v %v", page, err)
	}
	page, err = e.admin.ListCommandsPage(e.ctx, sb.ID, 5, page.NextCursor)
	if err != nil || len(page.Commands) != 2 || page.Commands[0].ID != "cmd-2" || page.NextCursor != "" {
		t.Fatalf("last page: %+v %v", page, err)
	}
	if _, err := e.admin.ListCommandsPage(e.ctx, sb.ID, 0, "nope"); !errors.Is(err, model.ErrUnprocessable) || !strings.Contains(err.Error(), "next_cursor") {
		t.Fatalf("a cursor the sandbox did not hand out: %v, want 422 naming next_cursor", err)
	}
	if _, err := e.admin.ListCommandsPage(e.ctx, sb.ID, 5000, ""); !errors.Is(err, model.ErrUnprocessable) || !strings.Contains(err.Error(), "1 to 1000") {
		t.Fatalf("limit 5000: %v, want 422 naming the range", err)
	}

	fs, err := e.admin.FilesSession(e.ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if fs.URL != dp.URL+"/v1/sandboxes/"+sb.ID+"/files" {
		t.Fatalf("files url %q", fs.URL)
	}
	c, err := token.Verify(token.WorkerKey(key, "w1"), fs.Token, time.Now())
	if err != nil || c.Scope != token.ScopeFiles || c.SandboxID != sb.ID || c.Command != nil {
		t.Fatalf("files claims %+v %v", c, err)
	}
	// A sandbox being deleted takes no new commands.
	if _, err := e.admin.DeleteSandbox(e.ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	_, err = e.admin.CreateCommand(e.ctx, sb.ID, client.CreateCommandRequest{Cmd: "id"})
	if st, _ := apiStatus(t, err); st != 409 {
		t.Fatalf("command on deleting sandbox: %v", err)
	}
}

func TestOrgsAndKeys(t *testing.T) {
	e := newEnv(t)
	orgs, err := e.admin.ListOrgs(e.ctx)
	if err != nil || len(orgs) != 1 || orgs[0].ID != service.DefaultOrgID {
		t.Fatalf("orgs %+v %v", orgs, err)
	}
	org, err := e.admin.CreateOrg(e.ctx, "acme")
	if err != nil || org.Name != "acme" || !strings.HasPrefix(org.ID, "org-") {
		t.Fatalf("create org %+v %v", org, err)
	}
	k, err := e.admin.CreateKey(e.ctx, org.ID, client.CreateKeyRequest{Name: "ci", Admin: true})
	if err != nil || !regexp.MustCompile(`^al_[0-9a-f]{40}$`).MatchString(k.Secret) || k.Key.OrgID != org.ID ||
		!k.Key.Admin || !strings.HasPrefix(k.Secret, k.Key.Prefix) {
		t.Fatalf("create key %+v %v", k, err)
	}
	acme := e.client(k.Secret)
	// An org admin sees only its org and may mint keys only in it.
	orgs, err = acme.ListOrgs(e.ctx)
	if err != nil || len(orgs) != 1 || orgs[0].ID != org.ID {
		t.Fatalf("acme orgs %+v %v", orgs, err)
	}
	if _, err := acme.CreateKey(e.ctx, org.ID, client.CreateKeyRequest{Name: "dev"}); err != nil {
		t.Fatalf("org admin creating own key: %v", err)
	}
	if _, err := acme.CreateKey(e.ctx, service.DefaultOrgID, client.CreateKeyRequest{}); !errors.Is(err, model.ErrForbidden) {
		t.Fatalf("org admin creating a default-org key: %v", err)
	}
	if _, err := acme.CreateOrg(e.ctx, "evil"); !errors.Is(err, model.ErrForbidden) {
		t.Fatalf("org admin creating an org: %v", err)
	}
	// Bootstrap a second time mints nothing.
	if secret, created, err := e.svc.Bootstrap(e.ctx); err != nil || created || secret != "" {
		t.Fatalf("second bootstrap: %q %v %v", secret, created, err)
	}
	if _, err := e.admin.CreateOrg(e.ctx, ""); !errors.Is(err, model.ErrUnprocessable) {
		t.Fatalf("empty org name: %v", err)
	}
}

func TestTemplates(t *testing.T) {
	e := newEnv(t)
	ts, err := e.admin.ListTemplates(e.ctx)
	if err != nil || len(ts) != 1 || ts[0].Name != "base" || ts[0].Digest != baseDigest {
		t.Fatalf("templates %+v %v", ts, err)
	}
}

// readSSE reads n events from an SSE body, checking the framing.
func readSSE(t *testing.T, r *bufio.Reader, n int) []model.Event {
	t.Helper()
	var out []model.Event
	var id, typ string
	for len(out) < n {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("read stream: %v (after %d events)", err, len(out))
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case strings.HasPrefix(line, "id: "):
			id = line[4:]
		case strings.HasPrefix(line, "event: "):
			typ = line[7:]
		case strings.HasPrefix(line, "data: "):
			var ev model.Event
			if err := json.Unmarshal([]byte(line[6:]), &ev); err != nil {
				t.Fatalf("data is not an event: %v", err)
			}
			if id != strconv.FormatInt(ev.Seq, 10) || typ != ev.Type {
				t.Fatalf("id %q / event %q do not match %+v", id, typ, ev)
			}
			out = append(out, ev)
		}
	}
	return out
}

func TestEventStream(t *testing.T) {
	e := newEnv(t)
	sb, op := e.create(e.admin)
	other, _ := e.orgClient("other", false)
	e.create(other) // events of another org must not show up

	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	next, stop := iterPull(e.admin.Events(ctx, sb.ID, 0))
	defer stop()
	first := []model.Event{next.ev(t), next.ev(t)}
	if first[0].Type != "sandbox.state" || first[1].Type != "operation.state" || first[1].OperationID != op.ID || first[0].SandboxID != sb.ID {
		t.Fatalf("first events %+v", first)
	}
	// Live events arrive in order.
	e.markRunning(sb.ID, "http://127.0.0.1:1")
	e.completeOp(op.ID, model.OpSucceeded, "")
	live := []model.Event{next.ev(t), next.ev(t)}
	var st model.Sandbox
	if err := json.Unmarshal(live[0].Data, &st); err != nil || st.State != model.StateRunning {
		t.Fatalf("live event 0 %s (%v)", live[0].Data, err)
	}
	var o model.Operation
	if err := json.Unmarshal(live[1].Data, &o); err != nil || o.State != model.OpSucceeded {
		t.Fatalf("live event 1 %s (%v)", live[1].Data, err)
	}
	all := append(first, live...)
	for i := 1; i < len(all); i++ {
		if all[i].Seq <= all[i-1].Seq {
			t.Fatalf("out of order: %d then %d", all[i-1].Seq, all[i].Seq)
		}
	}

	// Resume with Last-Event-ID: the stream starts right after it.
	req, _ := http.NewRequestWithContext(ctx, "GET", e.srv.URL+"/v1/sandboxes/"+sb.ID+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+e.adminKey)
	req.Header.Set("Last-Event-ID", strconv.FormatInt(all[1].Seq, 10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream answer %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	br := bufio.NewReader(resp.Body)
	resumed := readSSE(t, br, 2)
	if resumed[0].Seq != all[2].Seq || resumed[1].Seq != all[3].Seq {
		t.Fatalf("resumed at %d,%d, want %d,%d", resumed[0].Seq, resumed[1].Seq, all[2].Seq, all[3].Seq)
	}
	// Keep-alive comments flow while idle.
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, ": keep-alive") {
			break
		}
	}

	// The org stream carries only the caller's org.
	orgNext, orgStop := iterPull(e.admin.Events(ctx, "", 0))
	defer orgStop()
	for range len(all) {
		if ev := orgNext.ev(t); ev.OrgID != service.DefaultOrgID {
			t.Fatalf("org stream leaked %+v", ev)
		}
	}
	// Another org's sandbox stream is not found.
	otherNext, otherStop := iterPull(other.Events(ctx, sb.ID, 0))
	defer otherStop()
	if _, err := otherNext.err(); !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("other org's sandbox stream: %v", err)
	}
}

// pull reads an event sequence one item at a time.
type pull struct {
	next func() (model.Event, error, bool)
}

func iterPull(seq iter.Seq2[model.Event, error]) (pull, func()) {
	next, stop := iter.Pull2(seq)
	return pull{next: next}, stop
}

// ev returns the next event, failing the test on an error or the end.
func (p pull) ev(t *testing.T) model.Event {
	t.Helper()
	ev, err, ok := p.next()
	if !ok || err != nil {
		t.Fatalf("event stream ended: ok=%v err=%v", ok, err)
	}
	return ev
}

// err returns the next item, which should be an error.
func (p pull) err() (model.Event, error) {
	ev, err, ok := p.next()
	if !ok {
		return ev, errors.New("stream ended without an error")
	}
	return ev, err
}

// TestEventStreamReconnects drops the client's connection mid-stream: the
// client re-opens it from the last event, so nothing is skipped or repeated.
func TestEventStreamReconnects(t *testing.T) {
	e := newEnv(t)
	sb, op := e.create(e.admin)
	var opened atomic.Int64
	f := func(r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/events") {
			opened.Add(1)
		}
	}
	e.hook.Store(&f)
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	next, stop := iterPull(e.admin.Events(ctx, sb.ID, 0))
	defer stop()
	got := []model.Event{next.ev(t), next.ev(t)}
	e.srv.CloseClientConnections()
	e.markRunning(sb.ID, "http://127.0.0.1:1")
	e.completeOp(op.ID, model.OpSucceeded, "")
	got = append(got, next.ev(t), next.ev(t))
	want, err := e.st.ListEvents(e.ctx, "", sb.ID, 0, 100)
	if err != nil || len(want) != 4 {
		t.Fatalf("stored events %d %v", len(want), err)
	}
	for i := range want {
		if got[i].Seq != want[i].Seq {
			t.Fatalf("event %d: seq %d, want %d", i, got[i].Seq, want[i].Seq)
		}
	}
	if n := opened.Load(); n < 2 {
		t.Fatalf("the stream was opened %d times; the drop did not happen", n)
	}
}
