package controller

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/workerapi"
)

// TestWakeRequestFromWorkerRespectsQuotas is the quota bypass through the
// data plane: an org suspends a sandbox (freeing its share of the quota),
// fills the quota with a new one, then sends traffic to the suspended one,
// whose worker asks the server to wake it. The wake is refused (409 with
// the quota's message) and the sandbox stays suspended; once the quota has
// room, the same request wakes it.
func TestWakeRequestFromWorkerRespectsQuotas(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	e.runningSandbox(w, "sb1")
	e.mustLifecycle(model.OpSuspend, "sb1")
	e.reconcile()
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateSuspended, SnapshotID: "s1"})
	e.wantSandbox("sb1", model.StateSuspended, "w1", "")
	e.runningSandbox(w, "sb2")

	org, err := e.st.GetOrg(e.ctx, testOrg)
	if err != nil {
		t.Fatal(err)
	}
	org.Quotas.Sandboxes = 1
	if err := e.st.UpdateOrg(e.ctx, org); err != nil {
		t.Fatal(err)
	}
	wake := func() (int, string) {
		resp, body := w.post("/internal/v1/workers/"+w.id+"/wake", workerapi.WakeRequest{SandboxID: "sb1"})
		return resp.StatusCode, string(body)
	}
	code, body := wake()
	var eb struct {
		Error struct{ Message string } `json:"error"`
	}
	json.Unmarshal([]byte(body), &eb)
	if code != http.StatusConflict || !strings.Contains(eb.Error.Message, "sandboxes quota") {
		t.Fatalf("data-plane wake past the quota: %d %s; want 409 naming the sandboxes quota", code, body)
	}
	if sb := e.sandbox("sb1"); sb.DesiredState != model.StateSuspended {
		t.Fatalf("a refused wake changed the sandbox: desired %s", sb.DesiredState)
	}

	org.Quotas.Sandboxes = 2
	if err := e.st.UpdateOrg(e.ctx, org); err != nil {
		t.Fatal(err)
	}
	if code, body := wake(); code != http.StatusAccepted {
		t.Fatalf("wake with room in the quota: %d %s", code, body)
	}
}
