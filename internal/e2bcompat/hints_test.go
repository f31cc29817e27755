package e2bcompat

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestHintsWordedForE2B: E2B SDK users get the service's neutral message
// and the next step in this adapter's words, never a /v1 route.
func TestHintsWordedForE2B(t *testing.T) {
	e := newEnv(t)
	r := e.do("POST", "/sandboxes", `{"templateID":"nope"}`)
	var eb errorBody
	if err := json.Unmarshal(r.body, &eb); err != nil || r.status != 400 {
		t.Fatalf("create with unknown template: %d %s", r.status, r.body)
	}
	if !strings.Contains(eb.Message, `template "nope" not found (`+"`airlock template ls` lists them)") || strings.Contains(eb.Message, "/v1") {
		t.Errorf("message %q: want the neutral words, the E2B hint and no /v1 route", eb.Message)
	}
}
