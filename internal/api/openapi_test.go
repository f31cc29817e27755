package api

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	apidoc "github.com/airlock/airlock/api"
	"github.com/airlock/airlock/internal/service"
)

// TestOpenAPICoversRoutes checks that api/openapi.json describes exactly the
// routes the server registers: every route has a path+method in the
// document and every path+method in the document is a route.
func TestOpenAPICoversRoutes(t *testing.T) {
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(apidoc.OpenAPI, &doc); err != nil {
		t.Fatalf("api/openapi.json is not JSON: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.1.") {
		t.Fatalf("openapi version %q, want 3.1.x", doc.OpenAPI)
	}
	served := map[string]bool{}
	for _, rt := range routes {
		key := rt.method + " " + rt.path
		served[key] = true
		ops, ok := doc.Paths[rt.path]
		if !ok || ops[strings.ToLower(rt.method)] == nil {
			t.Errorf("route %s is not in api/openapi.json", key)
		}
	}
	methods := []string{"get", "put", "post", "delete", "patch", "head", "options", "trace"}
	for path, ops := range doc.Paths {
		for m := range ops {
			if !slices.Contains(methods, m) {
				continue // "parameters", "summary", …
			}
			if key := strings.ToUpper(m) + " " + path; !served[key] {
				t.Errorf("api/openapi.json describes %s, which the server does not serve", key)
			}
		}
	}
}

// TestOpenAPIRefsResolve checks that every $ref in the document points at a
// component that exists.
func TestOpenAPIRefsResolve(t *testing.T) {
	var doc map[string]any
	if err := json.Unmarshal(apidoc.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	var walk func(v any)
	n := 0
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && k == "$ref" {
					n++
					var cur any = doc
					for _, part := range strings.Split(strings.TrimPrefix(s, "#/"), "/") {
						m, _ := cur.(map[string]any)
						cur = m[part]
					}
					if cur == nil {
						t.Errorf("$ref %s does not resolve", s)
					}
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(doc)
	if n == 0 {
		t.Fatal("no $ref found; the walk is broken")
	}
}

// TestServedOpenAPIIsCommittedFile checks that GET /v1/openapi.json serves
// the committed document byte for byte, without authentication.
func TestServedOpenAPIIsCommittedFile(t *testing.T) {
	srv := httptest.NewServer(New(service.New(service.Config{}), Options{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !bytes.Equal(b, apidoc.OpenAPI) {
		t.Fatalf("status %d, %d bytes served vs %d committed", resp.StatusCode, len(b), len(apidoc.OpenAPI))
	}
}
