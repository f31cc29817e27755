package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/api/apitypes"
)

// TestTrafficToken checks the native create option public_traffic and the
// traffic_token of GET /v1/sandboxes/{id}: a sandbox is private unless it
// asks, its token is shown to its org only, and a public one has none.
func TestTrafficToken(t *testing.T) {
	e := newEnv(t)
	get := func(key, id string) (int, apitypes.SandboxResponse) {
		t.Helper()
		req, _ := http.NewRequestWithContext(e.ctx, "GET", e.srv.URL+"/v1/sandboxes/"+id, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out apitypes.SandboxResponse
		json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	create := func(body string) string {
		t.Helper()
		req, _ := http.NewRequestWithContext(e.ctx, "POST", e.srv.URL+"/v1/sandboxes", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+e.adminKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out apitypes.CreateSandboxResponse
		if resp.StatusCode != http.StatusAccepted || json.NewDecoder(resp.Body).Decode(&out) != nil {
			t.Fatalf("create %s: %d", body, resp.StatusCode)
		}
		return out.Sandbox.ID
	}
	priv := create(`{"template":"` + baseDigest + `"}`)
	pub := create(`{"template":"` + baseDigest + `","public_traffic":true}`)
	status, sb := get(e.adminKey, priv)
	if status != 200 || sb.PublicTraffic || !strings.HasPrefix(sb.TrafficToken, "tt_") {
		t.Fatalf("private sandbox: %d public=%v token %q; want a tt_ token", status, sb.PublicTraffic, sb.TrafficToken)
	}
	status, sb = get(e.adminKey, pub)
	if status != 200 || !sb.PublicTraffic || sb.TrafficToken != "" {
		t.Fatalf("public sandbox: %d public=%v token %q; want public and no token", status, sb.PublicTraffic, sb.TrafficToken)
	}
	other, _ := e.orgClient("traffic-other", false)
	if status, sb := get(other.APIKey, priv); status != http.StatusNotFound || sb.TrafficToken != "" {
		t.Fatalf("another org's GET: %d token %q; want 404 and no token", status, sb.TrafficToken)
	}
}
