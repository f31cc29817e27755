package mcp

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// connect serves NewServer(cfg) over the SDK's in-memory transport and
// returns a client session of it.
func connect(t *testing.T, cfg Config) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := NewServer(cfg).Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func resultText(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

var allTools = []string{
	"create_sandbox", "list_sandboxes", "get_sandbox", "delete_sandbox",
	"run_command", "read_file", "write_file", "list_files",
	"pause_sandbox", "resume_sandbox", "suspend_sandbox", "wake_sandbox",
	"checkpoint_sandbox", "rollback_sandbox", "fork_sandbox",
}

// TestToolsAndSchemas: every tool is listed with a description, an input
// schema whose properties are all described, and an output schema.
func TestToolsAndSchemas(t *testing.T) {
	cs := connect(t, Config{URL: "http://127.0.0.1:1", APIKey: "k"})
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*mcp.Tool{}
	for _, tl := range res.Tools {
		byName[tl.Name] = tl
	}
	for _, name := range allTools {
		tl, ok := byName[name]
		if !ok {
			t.Errorf("tool %s missing", name)
			continue
		}
		if tl.Description == "" || tl.OutputSchema == nil {
			t.Errorf("%s: no description or output schema", name)
		}
		b, _ := json.Marshal(tl.InputSchema)
		var schema struct {
			Type       string `json:"type"`
			Required   []string
			Properties map[string]struct {
				Description string `json:"description"`
			} `json:"properties"`
		}
		if err := json.Unmarshal(b, &schema); err != nil || schema.Type != "object" {
			t.Errorf("%s: input schema %s", name, b)
			continue
		}
		for p, v := range schema.Properties {
			if v.Description == "" {
				t.Errorf("%s.%s has no description", name, p)
			}
		}
		if _, ok := schema.Properties["sandbox_id"]; ok && !contains(schema.Required, "sandbox_id") {
			t.Errorf("%s: sandbox_id is not required", name)
		}
	}
	if len(res.Tools) != len(allTools) {
		t.Errorf("%d tools, want %d", len(res.Tools), len(allTools))
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// fakeAPI answers like the Airlock API: a 404 with the API's error body for
// any sandbox but sb-1, and records the bearer keys it saw.
func fakeAPI(t *testing.T, keys *[]string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		*keys = append(*keys, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/sandboxes/sb-1" {
			w.Write([]byte(`{"id":"sb-1","state":"running","template":"base","resources":{"vcpus":1,"memory_mib":512},"created_at":"2026-01-01T00:00:00Z"}`))
			return
		}
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"error":{"code":"not_found","message":"sandbox sb-x not found"}}`))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestAPIErrorsAreToolErrors: an API error is a result with isError and the
// API's message, not a protocol error; bad arguments likewise.
func TestAPIErrorsAreToolErrors(t *testing.T) {
	var keys []string
	api := fakeAPI(t, &keys)
	cs := connect(t, Config{URL: api.URL, APIKey: "the-key"})
	ctx := context.Background()

	r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "get_sandbox", Arguments: map[string]any{"sandbox_id": "sb-x"}})
	if err != nil {
		t.Fatalf("protocol error: %v", err)
	}
	if !r.IsError || !strings.Contains(resultText(r), "sandbox sb-x not found") || !strings.Contains(resultText(r), "404") {
		t.Errorf("get_sandbox sb-x: isError %v %q", r.IsError, resultText(r))
	}

	r, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "get_sandbox", Arguments: map[string]any{"sandbox_id": "sb-1"}})
	if err != nil || r.IsError {
		t.Fatalf("get_sandbox sb-1: %v %q", err, resultText(r))
	}
	var sb Sandbox
	b, _ := json.Marshal(r.StructuredContent)
	if json.Unmarshal(b, &sb); sb.ID != "sb-1" || sb.State != "running" || sb.VCPUs != 1 || sb.MemoryMiB != 512 {
		t.Errorf("structured content %s", b)
	}
	if len(keys) == 0 || keys[len(keys)-1] != "the-key" {
		t.Errorf("API saw keys %q, want the configured one", keys)
	}

	for _, c := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"sandbox_id": "sb-1"}, "exactly one of cmd"},
		{map[string]any{"sandbox_id": "sb-1", "cmd": "true", "argv": []string{"true"}}, "exactly one of cmd"},
		{map[string]any{"sandbox_id": "", "cmd": "true"}, "sandbox_id is required"},
		{map[string]any{"cmd": "true"}, "sandbox_id"},
	} {
		r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_command", Arguments: c.args})
		if err != nil {
			t.Fatalf("run_command %v: protocol error %v", c.args, err)
		}
		if !r.IsError || !strings.Contains(resultText(r), c.want) {
			t.Errorf("run_command %v: isError %v %q, want %q", c.args, r.IsError, resultText(r), c.want)
		}
	}
}

// TestHTTPAuth: over HTTP a request's bearer key overrides the default;
// without a default key, requests without one get 401.
func TestHTTPAuth(t *testing.T) {
	var keys []string
	api := fakeAPI(t, &keys)
	ctx := context.Background()

	noKey := httptest.NewServer(Handler(Config{URL: api.URL}))
	defer noKey.Close()
	resp, err := http.Post(noKey.URL+Path, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
		t.Errorf("no key: %d, want 401 with WWW-Authenticate", resp.StatusCode)
	}

	for _, c := range []struct {
		name, def, bearer, want string
	}{
		{"request key", "", "req-key", "req-key"},
		{"overrides default", "default-key", "req-key", "req-key"},
		{"default", "default-key", "", "default-key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			hs := httptest.NewServer(Handler(Config{URL: api.URL, APIKey: c.def}))
			defer hs.Close()
			hc := &http.Client{Transport: headerRT{c.bearer}}
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, nil).
				Connect(ctx, &mcp.StreamableClientTransport{Endpoint: hs.URL + Path, HTTPClient: hc}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			keys = nil
			r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "get_sandbox", Arguments: map[string]any{"sandbox_id": "sb-1"}})
			if err != nil || r.IsError {
				t.Fatalf("%v %q", err, resultText(r))
			}
			if len(keys) != 1 || keys[0] != c.want {
				t.Errorf("API saw %q, want %q", keys, c.want)
			}
		})
	}
}

type headerRT struct{ bearer string }

func (h headerRT) RoundTrip(r *http.Request) (*http.Response, error) {
	if h.bearer != "" {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+h.bearer)
	}
	return http.DefaultTransport.RoundTrip(r)
}

func TestCapWriter(t *testing.T) {
	w := &capWriter{max: 4}
	w.Write([]byte("ab"))
	w.Write([]byte("cdef"))
	w.Write([]byte("gh"))
	s := w.String()
	if !strings.HasPrefix(s, "abcd\n") || !strings.Contains(s, "4 more bytes") || w.dropped != 4 {
		t.Errorf("%q dropped %d", s, w.dropped)
	}
	w = &capWriter{max: 10}
	w.Write([]byte("ok"))
	if w.String() != "ok" {
		t.Errorf("%q", w.String())
	}
}
