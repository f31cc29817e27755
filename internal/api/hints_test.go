package api_test

import (
	"net/http"
	"strings"
	"testing"
)

// TestHintsWordedForV1: the service's errors carry their next step as a
// typed hint; /v1 words it with its own route and the airlock command
// (E2B words the same errors its own way, see e2bcompat).
func TestHintsWordedForV1(t *testing.T) {
	e := newEnv(t)
	sb, create := e.create(e.admin)
	url := e.srv.URL + "/v1/sandboxes/" + sb.ID
	for _, tc := range []struct {
		name, method, url, body string
		status                  int
		want                    string
	}{
		{"operation in progress", "POST", url + "/pause", "", http.StatusConflict,
			"has a create operation " + create.ID + " in progress; wait for it and retry (`airlock op wait " + sb.ID + "`)"},
		{"feature gate", "POST", url + "/checkpoints", `{"name":"c1"}`, http.StatusForbidden,
			`(PATCH /v1/orgs/org-default {"features":["snapshots"]} or ` + "`airlock org set org-default --features snapshots`)"},
		{"unknown template", "POST", e.srv.URL + "/v1/sandboxes", `{"template":"nope"}`, http.StatusUnprocessableEntity,
			`template "nope" not found; GET /v1/templates lists them`},
	} {
		st, _, body := raw(t, tc.method, tc.url, e.adminKey, tc.body)
		if st != tc.status || !strings.Contains(body.Message, tc.want) {
			t.Errorf("%s: %d %q, want %d with %q", tc.name, st, body.Message, tc.status, tc.want)
		}
	}
}
