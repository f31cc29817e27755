package api_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/model"
)

// getJSON GETs url with key and decodes a 200 answer into out.
func getJSON(t *testing.T, url, key string, out any) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("GET %s: %v: %s", url, err, b)
	}
}

// TestSandboxNetworkAPI: a sandbox gets its org's default profile, or the
// profile or inline policy it asks for if its org may use it; bad policies
// are 422 naming the field; PUT replaces the policy; operators manage
// profiles and orgs' network settings.
func TestSandboxNetworkAPI(t *testing.T) {
	e := newEnv(t)
	base := e.srv.URL
	admin := e.adminKey

	// The default: the public profile.
	sb, _ := e.create(e.admin)
	var n model.SandboxNetwork
	getJSON(t, base+"/v1/sandboxes/"+sb.ID+"/network", admin, &n)
	if n.Profile != "public" || !strings.Contains(string(n.Policy), `"default":"allow"`) {
		t.Fatalf("default network = %s %s", n.Profile, n.Policy)
	}

	// Operators send inline policies; a bad one names its field.
	st, _, eb := raw(t, "POST", base+"/v1/sandboxes", admin, `{"network":{"policy":{"version":1,"default":"deny","rules":[{"action":"allow","ports":[70000],"domains":["x.example.com"]}]}}}`)
	if st != 422 || !strings.Contains(eb.Message, "rules[0].ports[0]") {
		t.Errorf("bad port: %d %q", st, eb.Message)
	}
	st, _, eb = raw(t, "POST", base+"/v1/sandboxes", admin, `{"network":{"policy":{"version":1,"default":"deny","rules":[{"action":"allow","cidrs":["10.0.0.0/8"]}]}}}`)
	if st != 422 || !strings.Contains(eb.Message, "rules[0].cidrs[0]") {
		t.Errorf("private CIDR: %d %q", st, eb.Message)
	}
	st, _, eb = raw(t, "POST", base+"/v1/sandboxes", admin, `{"network":{"profile":"none","policy":{"version":1,"default":"deny"}}}`)
	if st != 422 || !strings.Contains(eb.Message, "not both") {
		t.Errorf("profile and policy: %d %q", st, eb.Message)
	}
	st, _, eb = raw(t, "POST", base+"/v1/sandboxes", admin, `{"network":{"profile":"nope"}}`)
	if st != 403 && st != 422 {
		t.Errorf("unknown profile: %d %q", st, eb.Message)
	}

	// PUT replaces it.
	st, _, eb = raw(t, "PUT", base+"/v1/sandboxes/"+sb.ID+"/network", admin, `{"policy":{"version":1,"default":"deny","rules":[{"action":"allow","domains":["*.example.com"],"ports":[443]}]}}`)
	if st != 200 {
		t.Fatalf("PUT network: %d %q", st, eb.Message)
	}
	n = model.SandboxNetwork{}
	getJSON(t, base+"/v1/sandboxes/"+sb.ID+"/network", admin, &n)
	if n.Profile != "" || !strings.Contains(string(n.Policy), "*.example.com") {
		t.Errorf("after PUT: %s %s", n.Profile, n.Policy)
	}
	if st, _, _ := raw(t, "PUT", base+"/v1/sandboxes/"+sb.ID+"/network", admin, `{}`); st != 422 {
		t.Errorf("PUT {}: %d", st)
	}

	// Profiles: operators only; built-ins are fixed.
	oc, org := e.orgClient("team", true)
	key := oc.APIKey
	prof := `{"description":"CI","policy":{"version":1,"default":"deny","rules":[{"action":"allow","domains":["pypi.example.org"]}]}}`
	if st, _, _ := raw(t, "PUT", base+"/v1/network-profiles/ci", key, prof); st != 403 {
		t.Errorf("org admin puts a profile: %d, want 403", st)
	}
	if st, _, eb := raw(t, "PUT", base+"/v1/network-profiles/ci", admin, prof); st != 200 {
		t.Fatalf("put profile: %d %q", st, eb.Message)
	}
	if st, _, _ := raw(t, "PUT", base+"/v1/network-profiles/public", admin, prof); st != 409 {
		t.Errorf("overwrite a built-in: %d, want 409", st)
	}
	if st, _, _ := raw(t, "PUT", base+"/v1/network-profiles/Bad!", admin, prof); st != 422 {
		t.Errorf("bad name: %d, want 422", st)
	}
	var list struct{ Profiles []model.NetworkProfile }
	getJSON(t, base+"/v1/network-profiles", key, &list)
	if len(list.Profiles) != 3 || list.Profiles[0].Name != "none" || list.Profiles[1].Name != "public" || list.Profiles[2].Name != "ci" {
		t.Errorf("profiles = %+v", list.Profiles)
	}

	// The org may use none and its default only, and no inline policy.
	if st, _, _ := raw(t, "POST", base+"/v1/sandboxes", key, `{"network":{"profile":"ci"}}`); st != 403 {
		t.Errorf("org uses a profile it may not: %d, want 403", st)
	}
	if st, _, _ := raw(t, "POST", base+"/v1/sandboxes", key, `{"network":{"policy":{"version":1,"default":"allow"}}}`); st != 403 {
		t.Errorf("org sends an inline policy: %d, want 403", st)
	}
	if st, _, eb := raw(t, "POST", base+"/v1/sandboxes", key, `{"network":{"profile":"none"}}`); st != 202 && st != 201 {
		t.Errorf("org chooses none: %d %q", st, eb.Message)
	}
	// The operator lets it use ci, by default.
	if st, _, _ := raw(t, "PATCH", base+"/v1/orgs/"+org.ID, key, `{"network":{"profiles":["ci"]}}`); st != 403 {
		t.Errorf("org admin sets its own network settings: %d, want 403", st)
	}
	if st, _, _ := raw(t, "PATCH", base+"/v1/orgs/"+org.ID, admin, `{"network":{"profiles":["missing"]}}`); st != 422 {
		t.Errorf("settings naming a missing profile: %d, want 422", st)
	}
	if st, _, eb := raw(t, "PATCH", base+"/v1/orgs/"+org.ID, admin, `{"network":{"profiles":["ci"],"default_profile":"ci"}}`); st != 200 {
		t.Fatalf("set org network: %d %q", st, eb.Message)
	}
	sb2, _ := e.create(oc)
	n = model.SandboxNetwork{}
	getJSON(t, base+"/v1/sandboxes/"+sb2.ID+"/network", key, &n)
	if n.Profile != "ci" || !strings.Contains(string(n.Policy), "pypi.example.org") {
		t.Errorf("org default network = %s %s", n.Profile, n.Policy)
	}
	if st, _, _ := raw(t, "DELETE", base+"/v1/network-profiles/ci", admin, ""); st != 409 {
		t.Errorf("delete a profile an org defaults to: %d, want 409", st)
	}
	// Another org's sandbox is not found.
	if st, _, _ := raw(t, "GET", base+"/v1/sandboxes/"+sb.ID+"/network", key, ""); st != 404 {
		t.Errorf("another org's sandbox network: %d, want 404", st)
	}
}
