package api_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/api"
	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/store/sqlite"
)

// FuzzRequestBodies sends arbitrary JSON bodies to every native route that
// takes one, through the real handler over a real SQLite store, with an
// admin key: no body may cause a 5xx or a panic, and every refusal is the
// documented error shape with a message.
func FuzzRequestBodies(f *testing.F) {
	ctx := f.Context()
	st, err := sqlite.Open(ctx, filepath.Join(f.TempDir(), "airlock.db"))
	if err != nil {
		f.Fatalf("open sqlite: %v", err)
	}
	f.Cleanup(func() { st.Close() })
	if err := st.PutTemplate(ctx, model.Template{Name: "base", Tag: "latest", Digest: baseDigest, SizeBytes: 1, CreatedAt: time.Now()}); err != nil {
		f.Fatal(err)
	}
	svc := service.New(service.Config{Store: st, Events: events.New(st), Kick: func() {}})
	key, _, err := svc.Bootstrap(ctx)
	if err != nil {
		f.Fatal(err)
	}
	h := api.New(svc, api.Options{KeepAlive: 50 * time.Millisecond})
	do := func(method, path string, body []byte) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, bytes.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+key)
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	// A sandbox and an org for the routes below their ids.
	w := do("POST", "/v1/sandboxes", []byte(`{"template":"base"}`))
	var created struct {
		Sandbox model.Sandbox `json:"sandbox"`
	}
	if w.Code != http.StatusAccepted && w.Code != http.StatusCreated {
		f.Fatalf("create: %d %s", w.Code, w.Body)
	}
	json.Unmarshal(w.Body.Bytes(), &created)
	w = do("POST", "/v1/orgs", []byte(`{"name":"fuzz"}`))
	var org model.Org
	json.Unmarshal(w.Body.Bytes(), &org)
	if org.ID == "" {
		f.Fatalf("create org: %d %s", w.Code, w.Body)
	}
	routes := []struct{ method, path string }{
		{"POST", "/v1/sandboxes"},
		{"POST", "/v1/sandboxes/" + created.Sandbox.ID + "/commands"},
		{"POST", "/v1/sandboxes/" + created.Sandbox.ID + "/checkpoints"},
		{"POST", "/v1/sandboxes/" + created.Sandbox.ID + "/rollback"},
		{"POST", "/v1/sandboxes/" + created.Sandbox.ID + "/pause"},
		{"POST", "/v1/sandboxes/" + created.Sandbox.ID + "/files/session"},
		{"POST", "/v1/orgs"},
		{"PATCH", "/v1/orgs/" + org.ID},
		{"POST", "/v1/orgs/" + org.ID + "/keys"},
		{"PUT", "/v1/pools/base"},
	}
	seeds := []string{
		`{"template":"base","env":{"A":"b"},"metadata":{"k":"v"},"resources":{"vcpus":1,"memory_mib":512}}`,
		`{"template":"base","runtime":"qemu","timeout_s":-1}`,
		`{"template":"../../etc","resources":{"vcpus":1e300}}`,
		`{"argv":["/bin/true"],"env":{"":""},"cwd":"/tmp","user":"root","timeout_s":1}`,
		`{"name":"cp-1"}`, `{"checkpoint":"cp-1"}`,
		`{"name":"` + string(bytes.Repeat([]byte("x"), 300)) + `"}`,
		`{"features":["snapshots"],"idle_suspend_after_s":0}`,
		`{"name":"k","admin":true,"e2b":true}`,
		`{"size":4,"vcpus":1,"memory_mib":512}`,
		`null`, `[]`, `"x"`, `{`, ``, `{"template":null}`, "{\"template\":\"base\u0000\"}",
	}
	for i, s := range seeds {
		f.Add(uint8(i), []byte(s))
	}
	f.Fuzz(func(t *testing.T, route uint8, body []byte) {
		rt := routes[int(route)%len(routes)]
		w := do(rt.method, rt.path, body)
		if w.Code >= 500 {
			t.Fatalf("%s %s with %q: %d %s", rt.method, rt.path, body, w.Code, w.Body)
		}
		if w.Code >= 400 {
			var e struct {
				Error struct {
					Code    string `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
				t.Fatalf("%s %s with %q: %d with a body that is not the error shape: %s", rt.method, rt.path, body, w.Code, w.Body)
			}
		}
	})
}
