package api_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
)

func ptr[T any](v T) *T { return &v }

func TestLifecycleEndpoints(t *testing.T) {
	e := newEnv(t)
	sb, create := e.create(e.admin)
	url := e.srv.URL + "/v1/sandboxes/" + sb.ID

	// While the create is open every lifecycle request is a 409 naming it.
	for _, verb := range []string{"pause", "resume", "suspend", "wake"} {
		st, _, body := raw(t, "POST", url+"/"+verb, e.adminKey, "")
		if st != http.StatusConflict || body.Code != "conflict" || !strings.Contains(body.Message, "has a create operation "+create.ID+" in progress") {
			t.Fatalf("%s while starting: %d %+v", verb, st, body)
		}
	}
	e.markRunning(sb.ID, "http://127.0.0.1:1")
	e.completeOp(create.ID, model.OpSucceeded, "")

	kicks := e.kicks.Load()
	pause, err := e.admin.PauseSandbox(e.ctx, sb.ID)
	if err != nil || pause.Kind != model.OpPause || pause.State != model.OpPending || pause.Target != model.StatePaused {
		t.Fatalf("pause: %+v %v", pause, err)
	}
	if e.kicks.Load() == kicks {
		t.Fatal("pause did not kick the controllers")
	}
	again, err := e.admin.PauseSandbox(e.ctx, sb.ID)
	if err != nil || again.ID != pause.ID {
		t.Fatalf("repeated pause: %+v %v, want %s", again, err, pause.ID)
	}
	_, err = e.admin.SuspendSandbox(e.ctx, sb.ID)
	if st, code := apiStatus(t, err); st != 409 || code != "conflict" || !strings.Contains(err.Error(), "has a pause operation "+pause.ID+" in progress") {
		t.Fatalf("suspend during pause: %d %s %v", st, code, err)
	}
	got, err := e.admin.GetSandbox(e.ctx, sb.ID)
	if err != nil || got.DesiredState != model.StatePaused {
		t.Fatalf("sandbox after pause request: %+v %v", got, err)
	}
	// The request shows on the event log behind the SSE streams.
	evs, err := e.st.ListEvents(e.ctx, "", sb.ID, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(evs, func(ev model.Event) bool { return ev.Type == events.TypeOperation && ev.OperationID == pause.ID }) {
		t.Fatalf("no operation event for %s in %+v", pause.ID, evs)
	}

	// A body other than {} is refused; another org sees nothing.
	if st, _, _ := raw(t, "POST", url+"/resume", e.adminKey, `{"x":1}`); st != http.StatusBadRequest {
		t.Fatalf("resume with unknown field: %d", st)
	}
	other, _ := e.orgClient("other", true)
	if _, err := other.WakeSandbox(e.ctx, sb.ID); !isStatus(t, err, 404) {
		t.Fatalf("wake by another org: %v", err)
	}
	if st, _, _ := raw(t, "POST", url+"/pause", "", ""); st != http.StatusUnauthorized {
		t.Fatalf("pause without a key: %d", st)
	}
	if st, _, _ := raw(t, "GET", url+"/pause", e.adminKey, ""); st != http.StatusMethodNotAllowed {
		t.Fatalf("GET pause: %d", st)
	}

	// Paused (as the controller would record it): resume is accepted,
	// pause is a 409 that says why.
	e.setState(sb.ID, model.StatePaused)
	e.completeOp(pause.ID, model.OpSucceeded, "")
	if _, err := e.admin.PauseSandbox(e.ctx, sb.ID); !isStatus(t, err, 409) || !strings.Contains(err.Error(), "already paused") {
		t.Fatalf("pause a paused sandbox: %v", err)
	}
	st, hdr, _ := raw(t, "POST", url+"/suspend", e.adminKey, "{}")
	if st != http.StatusAccepted || !strings.HasPrefix(hdr.Get("Location"), "/v1/operations/op-") {
		t.Fatalf("suspend a paused sandbox: %d %v", st, hdr)
	}
}

func isStatus(t *testing.T, err error, status int) bool {
	t.Helper()
	if err == nil {
		return false
	}
	st, _ := apiStatus(t, err)
	return st == status
}

// setState records a sandbox state as the controller would (desired too).
func (e *env) setState(id string, state model.SandboxState) {
	e.t.Helper()
	sb, err := e.st.GetSandbox(e.ctx, id)
	if err != nil {
		e.t.Fatal(err)
	}
	sb.State, sb.DesiredState = state, state
	if _, err := e.st.UpdateSandbox(e.ctx, sb); err != nil {
		e.t.Fatal(err)
	}
}

func TestCreateLifecycleFields(t *testing.T) {
	e := newEnv(t)
	sb, _, err := e.admin.CreateSandbox(e.ctx, client.CreateSandboxRequest{}, "")
	if err != nil || sb.IdleSuspendS != int64(model.DefaultIdleSuspend.Seconds()) || sb.NoAutoWake {
		t.Fatalf("defaults: idle %d no_auto_wake %v err %v; want 21600 false", sb.IdleSuspendS, sb.NoAutoWake, err)
	}
	sb, _, err = e.admin.CreateSandbox(e.ctx, client.CreateSandboxRequest{IdleSuspendAfterS: ptr(int64(0)), AutoWake: ptr(false)}, "")
	if err != nil || sb.IdleSuspendS != 0 || !sb.NoAutoWake {
		t.Fatalf("idle 0, auto_wake false: idle %d no_auto_wake %v err %v", sb.IdleSuspendS, sb.NoAutoWake, err)
	}
	if _, _, err := e.admin.CreateSandbox(e.ctx, client.CreateSandboxRequest{IdleSuspendAfterS: ptr(int64(-5))}, ""); !isStatus(t, err, 422) {
		t.Fatalf("negative idle: %v", err)
	}
	// The org's setting is the default of its new sandboxes; 0 disables.
	oc, org := e.orgClient("idle", true)
	if _, err := e.admin.UpdateOrg(e.ctx, org.ID, client.UpdateOrgRequest{IdleSuspendAfterS: ptr(int64(0))}); err != nil {
		t.Fatal(err)
	}
	if sb, _, err := oc.CreateSandbox(e.ctx, client.CreateSandboxRequest{}, ""); err != nil || sb.IdleSuspendS != 0 {
		t.Fatalf("org idle 0: sandbox idle %d err %v", sb.IdleSuspendS, err)
	}
	if _, err := oc.UpdateOrg(e.ctx, org.ID, client.UpdateOrgRequest{IdleSuspendAfterS: ptr(int64(60))}); err != nil {
		t.Fatalf("org admin sets idle: %v", err)
	}
	if sb, _, err := oc.CreateSandbox(e.ctx, client.CreateSandboxRequest{}, ""); err != nil || sb.IdleSuspendS != 60 {
		t.Fatalf("org idle 60: sandbox idle %d err %v", sb.IdleSuspendS, err)
	}
	if sb, _, err := oc.CreateSandbox(e.ctx, client.CreateSandboxRequest{IdleSuspendAfterS: ptr(int64(5))}, ""); err != nil || sb.IdleSuspendS != 5 {
		t.Fatalf("request overrides org: sandbox idle %d err %v", sb.IdleSuspendS, err)
	}
	if _, err := oc.UpdateOrg(e.ctx, org.ID, client.UpdateOrgRequest{IdleSuspendAfterS: ptr(int64(-1))}); err != nil {
		t.Fatal(err)
	}
	if sb, _, err := oc.CreateSandbox(e.ctx, client.CreateSandboxRequest{}, ""); err != nil || sb.IdleSuspendS != 21600 {
		t.Fatalf("org idle reset: sandbox idle %d err %v", sb.IdleSuspendS, err)
	}
}

func TestOrgSettingsEndpoints(t *testing.T) {
	e := newEnv(t)
	member, org := e.orgClient("acme", false)
	orgAdmin := e.clientWithKey(org.ID, true)

	got, err := member.GetOrg(e.ctx, org.ID)
	if err != nil || got.ID != org.ID || len(got.Features) != 0 || got.IdleSuspendS != nil {
		t.Fatalf("member get: %+v %v", got, err)
	}
	if _, err := member.GetOrg(e.ctx, "org-default"); !isStatus(t, err, 404) {
		t.Fatalf("member gets another org: %v", err)
	}
	for _, tc := range []struct {
		name   string
		c      *client.Client
		req    client.UpdateOrgRequest
		status int
		msg    string
	}{
		{"member", member, client.UpdateOrgRequest{IdleSuspendAfterS: ptr(int64(1))}, 403, "needs an admin key"},
		{"org admin sets features", orgAdmin, client.UpdateOrgRequest{Features: &[]string{"snapshots"}}, 403, "feature gates are set by admins of the \"default\" org"},
		{"unknown feature", e.admin, client.UpdateOrgRequest{Features: &[]string{"snapshots", "time-travel"}}, 422, "unknown feature \"time-travel\"; known features: snapshots"},
		{"bad idle", e.admin, client.UpdateOrgRequest{IdleSuspendAfterS: ptr(int64(-2))}, 422, "idle_suspend_after_s is -2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.c.UpdateOrg(e.ctx, org.ID, tc.req)
			if !isStatus(t, err, tc.status) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("got %v, want %d containing %q", err, tc.status, tc.msg)
			}
		})
	}
	upd, err := e.admin.UpdateOrg(e.ctx, org.ID, client.UpdateOrgRequest{Features: &[]string{"snapshots", "snapshots"}, IdleSuspendAfterS: ptr(int64(3600))})
	if err != nil || !slices.Equal(upd.Features, []string{"snapshots"}) || upd.IdleSuspendS == nil || *upd.IdleSuspendS != 3600 {
		t.Fatalf("operator update: %+v %v", upd, err)
	}
	// Absent fields are kept.
	upd, err = orgAdmin.UpdateOrg(e.ctx, org.ID, client.UpdateOrgRequest{IdleSuspendAfterS: ptr(int64(0))})
	if err != nil || !slices.Equal(upd.Features, []string{"snapshots"}) || *upd.IdleSuspendS != 0 {
		t.Fatalf("org admin update: %+v %v", upd, err)
	}
	got, err = member.GetOrg(e.ctx, org.ID)
	if err != nil || !slices.Equal(got.Features, []string{"snapshots"}) || got.IdleSuspendS == nil || *got.IdleSuspendS != 0 {
		t.Fatalf("get after updates: %+v %v", got, err)
	}
	if st, _, _ := raw(t, "PATCH", e.srv.URL+"/v1/orgs/"+org.ID, e.adminKey, ""); st != http.StatusBadRequest {
		t.Fatalf("PATCH without a body: %d", st)
	}
	if _, err := e.admin.UpdateOrg(e.ctx, "org-nope", client.UpdateOrgRequest{}); !isStatus(t, err, 404) {
		t.Fatalf("update unknown org: %v", err)
	}
}

// clientWithKey mints a key in orgID and returns its client.
func (e *env) clientWithKey(orgID string, admin bool) *client.Client {
	e.t.Helper()
	k, err := e.admin.CreateKey(e.ctx, orgID, client.CreateKeyRequest{Name: "k2", Admin: admin})
	if err != nil {
		e.t.Fatal(err)
	}
	return e.client(k.Secret)
}
