package api_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/store"
	"github.com/airlock/airlock/internal/token"
)

func intp(n int) *int { return &n }

// TestOrgQuotas is the capacity attack: an org creates sandboxes until it
// holds more than the operator allows. Past each quota the create is a 429
// quota_exceeded that names the quota; GET /v1/orgs/{id} shows usage
// against quota; only operators set quotas.
func TestOrgQuotas(t *testing.T) {
	e := newEnv(t)
	secret, org := e.orgKey("tenant", true)
	c := e.client(secret)

	// Default: unlimited.
	got, err := c.GetOrg(e.ctx, org.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Quotas != (model.Quotas{}) || got.Usage != (apitypes.OrgUsage{}) {
		t.Fatalf("new org: quotas %+v usage %+v, want none and zero", got.Quotas, got.Usage)
	}
	// The org's own admin cannot raise (or set) its quotas.
	_, err = c.UpdateOrg(e.ctx, org.ID, client.UpdateOrgRequest{Quotas: &apitypes.QuotasPatch{Sandboxes: intp(100)}})
	if st, code := apiStatus(t, err); st != 403 || code != apitypes.CodeForbidden {
		t.Fatalf("org admin sets its quota: %d %s (%v), want 403", st, code, err)
	}
	_, err = e.admin.UpdateOrg(e.ctx, org.ID, client.UpdateOrgRequest{Quotas: &apitypes.QuotasPatch{VCPUs: intp(-1)}})
	if st, _ := apiStatus(t, err); st != 422 || !strings.Contains(err.Error(), "quotas.vcpus") {
		t.Fatalf("negative quota: %v, want 422 naming quotas.vcpus", err)
	}
	set, err := e.admin.UpdateOrg(e.ctx, org.ID, client.UpdateOrgRequest{Quotas: &apitypes.QuotasPatch{
		Sandboxes: intp(3), VCPUs: intp(4), MemoryMiB: intp(4096), DiskMiB: intp(10240),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if want := (model.Quotas{Sandboxes: 3, VCPUs: 4, MemoryMiB: 4096, DiskMiB: 10240}); set.Quotas != want {
		t.Fatalf("quotas after PATCH = %+v, want %+v", set.Quotas, want)
	}

	create := func(res model.Resources) (model.Sandbox, error) {
		sb, _, err := c.CreateSandbox(e.ctx, client.CreateSandboxRequest{Resources: res}, "")
		return sb, err
	}
	refused := func(what string, err error, quota string) {
		t.Helper()
		st, code := apiStatus(t, err)
		if st != 429 || code != apitypes.CodeQuotaExceeded || !strings.Contains(err.Error(), quota+" quota") {
			t.Fatalf("%s: %d %s %v; want 429 quota_exceeded naming %s", what, st, code, err, quota)
		}
		t.Logf("%s: %v", what, err)
	}

	a, err := create(model.Resources{VCPUs: 2, MemoryMiB: 1024, DiskMiB: 4096})
	if err != nil {
		t.Fatal(err)
	}
	// vCPUs: 2 in use + 3 > 4.
	_, err = create(model.Resources{VCPUs: 3, MemoryMiB: 512})
	refused("3 more vCPUs", err, "vcpus")
	// Memory: 1024 + 3584 > 4096.
	_, err = create(model.Resources{VCPUs: 1, MemoryMiB: 3584})
	refused("3.5 GiB more memory", err, "memory_mib")
	// Disk: 4096 + 8192 > 10240.
	_, err = create(model.Resources{VCPUs: 1, MemoryMiB: 512, DiskMiB: 8192})
	refused("8 GiB more disk", err, "disk_mib")
	b, err := create(model.Resources{VCPUs: 1, MemoryMiB: 512, DiskMiB: 1024})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := create(model.Resources{VCPUs: 1, MemoryMiB: 512, DiskMiB: 1024}); err != nil {
		t.Fatal(err)
	}
	// Sandboxes: 3 of 3.
	_, err = create(model.Resources{VCPUs: 1, MemoryMiB: 128, DiskMiB: 64})
	refused("a fourth sandbox", err, "sandboxes")
	// The raw response: status, code, no Retry-After (waiting does not help).
	st, hdr, eb := raw(t, "POST", e.srv.URL+"/v1/sandboxes", secret, `{"resources":{"vcpus":1,"memory_mib":128,"disk_mib":64}}`)
	if st != 429 || eb.Code != "quota_exceeded" || hdr.Get("Retry-After") != "" || !strings.Contains(eb.Message, "airlock org set") {
		t.Fatalf("raw create over quota: %d %+v Retry-After %q", st, eb, hdr.Get("Retry-After"))
	}

	got, err = c.GetOrg(e.ctx, org.ID)
	if err != nil {
		t.Fatal(err)
	}
	if want := (apitypes.OrgUsage{Sandboxes: 3, VCPUs: 4, MemoryMiB: 2048, DiskMiB: 6144}); got.Usage != want {
		t.Fatalf("usage = %+v, want %+v", got.Usage, want)
	}

	// Another org is not affected by this org's quota.
	other, _ := e.orgClient("other", false)
	if _, _, err := other.CreateSandbox(e.ctx, client.CreateSandboxRequest{}, ""); err != nil {
		t.Fatalf("another org: %v", err)
	}

	// Deleting frees the units at once (a sandbox being deleted holds no
	// quota); and so does suspending, except for disk.
	if _, err := c.DeleteSandbox(e.ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	sb, err := create(model.Resources{VCPUs: 1, MemoryMiB: 128, DiskMiB: 64})
	if err != nil {
		t.Fatalf("create after a delete: %v", err)
	}
	open, err := e.st.ListOperations(e.ctx, store.OperationFilter{SandboxID: a.ID, Open: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range open {
		e.completeOp(op.ID, model.OpSucceeded, "")
	}
	susp, err := e.st.GetSandbox(e.ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	susp.State, susp.DesiredState = model.StateSuspended, model.StateSuspended
	if _, err := e.st.UpdateSandbox(e.ctx, susp); err != nil {
		t.Fatal(err)
	}
	got, _ = c.GetOrg(e.ctx, org.ID)
	if want := (apitypes.OrgUsage{Sandboxes: 2, VCPUs: 2, MemoryMiB: 640, DiskMiB: 4096 + 1024 + 64}); got.Usage != want {
		t.Fatalf("usage with %s suspended = %+v, want %+v", a.ID, got.Usage, want)
	}
	// Waking the suspended one would take 2 vCPUs more: 2 + 2 > 4 is fine,
	// but first fill the sandboxes quota so that the wake is refused.
	if _, err := create(model.Resources{VCPUs: 1, MemoryMiB: 128, DiskMiB: 64}); err != nil {
		t.Fatal(err)
	}
	_, err = c.WakeSandbox(e.ctx, a.ID)
	refused("wake with 3 of 3 sandboxes running", err, "sandboxes")
	if cur, _ := e.st.GetSandbox(e.ctx, a.ID); cur.DesiredState != model.StateSuspended {
		t.Fatalf("a refused wake changed the sandbox: desired %s", cur.DesiredState)
	}
	_ = sb

	// 0 is unlimited again.
	if _, err := e.admin.UpdateOrg(e.ctx, org.ID, client.UpdateOrgRequest{Quotas: &apitypes.QuotasPatch{Sandboxes: intp(0)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := create(model.Resources{VCPUs: 1, MemoryMiB: 128, DiskMiB: 64}); err != nil {
		t.Fatalf("a fourth sandbox with sandboxes unlimited (vCPUs 4 of 4): %v", err)
	}
	_, err = create(model.Resources{VCPUs: 1, MemoryMiB: 128, DiskMiB: 64})
	refused("a fifth vCPU with sandboxes unlimited", err, "vcpus")
}

// orgKey creates an org and a key of it, and returns the key's secret.
func (e *env) orgKey(name string, admin bool) (string, model.Org) {
	e.t.Helper()
	org, err := e.admin.CreateOrg(e.ctx, name)
	if err != nil {
		e.t.Fatalf("create org: %v", err)
	}
	k, err := e.admin.CreateKey(e.ctx, org.ID, client.CreateKeyRequest{Name: "k", Admin: admin})
	if err != nil {
		e.t.Fatalf("create key: %v", err)
	}
	return k.Secret, org
}

// TestCreateRateLimit is the create-flood attack: an org sends creates as
// fast as it can. Past the per-org burst a create is 429 rate_limited
// with Retry-After; other requests of the org and other orgs' creates are
// not limited by it.
func TestCreateRateLimit(t *testing.T) {
	e := newEnv(t, func(s *service.Config) { s.CreateRate, s.CreateBurst = 0.01, 3 })
	secret, _ := e.orgKey("flood", false)
	c := e.client(secret)
	for i := range 3 {
		if _, _, err := c.CreateSandbox(e.ctx, client.CreateSandboxRequest{}, ""); err != nil {
			t.Fatalf("create %d within the burst: %v", i, err)
		}
	}
	st, hdr, eb := raw(t, "POST", e.srv.URL+"/v1/sandboxes", secret, `{}`)
	if st != 429 || eb.Code != apitypes.CodeRateLimited || !strings.Contains(eb.Message, "creates sandboxes faster than") {
		t.Fatalf("create past the burst: %d %+v, want 429 rate_limited", st, eb)
	}
	if n, err := strconv.Atoi(hdr.Get("Retry-After")); err != nil || n < 1 {
		t.Fatalf("Retry-After = %q", hdr.Get("Retry-After"))
	}
	t.Logf("refused: %s (Retry-After %s)", eb.Message, hdr.Get("Retry-After"))
	if _, err := c.ListSandboxes(e.ctx, client.SandboxFilter{}); err != nil {
		t.Fatalf("a list is limited by the create rate: %v", err)
	}
	if _, _, err := e.admin.CreateSandbox(e.ctx, client.CreateSandboxRequest{}, ""); err != nil {
		t.Fatalf("another org's create is limited by this org's: %v", err)
	}
}

// TestDiskMiB: every sandbox gets a disk limit (default 4096 MiB), and one
// above the operator's maximum is refused naming the field and the flag.
func TestDiskMiB(t *testing.T) {
	e := newEnv(t, func(s *service.Config) { s.MaxDiskMiB = 8192 })
	sb, _ := e.create(e.admin)
	if sb.Resources.DiskMiB != service.DefaultDiskMiB {
		t.Fatalf("default disk_mib = %d, want %d", sb.Resources.DiskMiB, service.DefaultDiskMiB)
	}
	for _, n := range []int{8193, 1 << 30, 10, -1} {
		st, _, eb := raw(t, "POST", e.srv.URL+"/v1/sandboxes", e.adminKey, fmt.Sprintf(`{"resources":{"disk_mib":%d}}`, n))
		if st != 422 || !strings.Contains(eb.Message, "resources.disk_mib") || !strings.Contains(eb.Message, "8192") {
			t.Fatalf("disk_mib %d: %d %+v, want 422 naming resources.disk_mib and the maximum", n, st, eb)
		}
	}
	sb, _, err := e.admin.CreateSandbox(e.ctx, client.CreateSandboxRequest{Resources: model.Resources{DiskMiB: 8192}}, "")
	if err != nil || sb.Resources.DiskMiB != 8192 {
		t.Fatalf("disk_mib at the maximum: %+v %v", sb.Resources, err)
	}
}

// TestEnvOutOfTokensAndEvents is the env attack: a sandbox env big enough
// to push every command token past the worker's 1 MiB header limit (800
// KB) is refused at create; one at the 256 KiB bound leaves command tokens
// as small as for an empty env, since the env travels with the assignment;
// a command over its own bound is refused; and no event keeps an env value.
func TestEnvOutOfTokensAndEvents(t *testing.T) {
	e := newEnv(t)
	big := func(n int, mark string) map[string]string {
		env := map[string]string{}
		for i := 0; envBytes(env) < n; i++ {
			env[fmt.Sprintf("V%04d", i)] = mark + strings.Repeat("x", 1000)
		}
		return env
	}
	_, _, err := e.admin.CreateSandbox(e.ctx, client.CreateSandboxRequest{Env: big(800_000, "s3cret")}, "")
	if st, _ := apiStatus(t, err); st != 422 || !strings.Contains(err.Error(), strconv.Itoa(service.MaxEnvBytes)) {
		t.Fatalf("800 KB env: %v, want 422 naming the %d-byte limit", err, service.MaxEnvBytes)
	}
	t.Logf("800 KB env: %v", err)

	env := big(service.MaxEnvBytes-2000, "s3cret")
	full, _, err := e.admin.CreateSandbox(e.ctx, client.CreateSandboxRequest{Env: env}, "")
	if err != nil {
		t.Fatalf("env of %d bytes: %v", envBytes(env), err)
	}
	empty, _ := e.create(e.admin)
	dp := e.dataPlane()
	e.markRunning(full.ID, dp.URL)
	e.markRunning(empty.ID, dp.URL)
	req := client.CreateCommandRequest{Cmd: "echo $V0001", Env: map[string]string{"OWN": "1"}}
	withEnv, err := e.admin.CreateCommand(e.ctx, full.ID, req)
	if err != nil {
		t.Fatal(err)
	}
	noEnv, err := e.admin.CreateCommand(e.ctx, empty.ID, req)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("command token: %d bytes for a %d-byte sandbox env, %d for none", len(withEnv.Token), envBytes(env), len(noEnv.Token))
	if len(withEnv.Token) > len(noEnv.Token)+128 || strings.Contains(withEnv.Token, "s3cret") {
		t.Fatalf("the token grows with the sandbox env: %d bytes vs %d", len(withEnv.Token), len(noEnv.Token))
	}
	cl := claimsOf(t, withEnv.Token)
	if len(cl.Command.Env) != 1 || cl.Command.Env["OWN"] != "1" || cl.Command.SandboxEnv != model.EnvDigest(env) {
		t.Fatalf("claims carry env %v (want the command's own) and sandbox env digest %q (want %q)", cl.Command.Env, cl.Command.SandboxEnv, model.EnvDigest(env))
	}

	// A command's own env and argv are bounded too.
	long := make([]string, 4000)
	for i := range long {
		long[i] = strings.Repeat("a", 100)
	}
	_, err = e.admin.CreateCommand(e.ctx, full.ID, client.CreateCommandRequest{Argv: long})
	if st, _ := apiStatus(t, err); st != 422 || !strings.Contains(err.Error(), "encoded") {
		t.Fatalf("a 400 KB argv: %v, want 422 naming the bound", err)
	}
	ctl := client.CreateCommandRequest{Cmd: strings.Repeat("\x01", 150_000)}
	_, err = e.admin.CreateCommand(e.ctx, full.ID, ctl)
	if st, _ := apiStatus(t, err); st != 422 {
		t.Fatalf("a 150 KB cmd that JSON-escapes to 900 KB: %v, want 422", err)
	}

	evs, err := e.svc.ListEvents(e.ctx, service.Principal{OrgID: service.DefaultOrgID, Admin: true}, full.ID, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) == 0 {
		t.Fatal("no events for the sandbox")
	}
	for _, ev := range evs {
		if strings.Contains(string(ev.Data), "s3cret") {
			t.Fatalf("event %d (%s) keeps env values: %.200s", ev.Seq, ev.Type, ev.Data)
		}
		if ev.Type == "sandbox.state" {
			var sb model.Sandbox
			if err := json.Unmarshal(ev.Data, &sb); err != nil || sb.ID != full.ID {
				t.Fatalf("event %d: %v %+v", ev.Seq, err, sb)
			}
		}
	}
	// The sandbox itself still has its env.
	if got, err := e.admin.GetSandbox(e.ctx, full.ID); err != nil || len(got.Env) != len(env) {
		t.Fatalf("GET sandbox: %d env pairs, %v; want %d", len(got.Env), err, len(env))
	}
}

// claimsOf decodes a token's claims (what the worker will read) without
// checking its signature.
func claimsOf(t *testing.T, tok string) token.Claims {
	t.Helper()
	parts := strings.Split(tok, ".")
	if len(parts) < 3 {
		t.Fatalf("token %.40q… has %d parts", tok, len(parts))
	}
	body, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatalf("token payload: %v", err)
	}
	var c token.Claims
	if err := json.Unmarshal(body, &c); err != nil || c.Command == nil {
		t.Fatalf("token claims %s: %v", body, err)
	}
	return c
}

func envBytes(env map[string]string) int {
	n := 0
	for k, v := range env {
		n += len(k) + len(v)
	}
	return n
}

// TestCheckpointAndTransferQuotas: an org at its checkpoints quota cannot
// write another checkpoint, and one with an import streaming cannot start a
// second past its transfers quota; both are 429 quota_exceeded naming the
// quota, and the transfer is counted only while it streams.
func TestCheckpointAndTransferQuotas(t *testing.T) {
	e := newEnv(t)
	secret, org := e.orgKey("snapper", false)
	c := e.client(secret)
	features := []string{model.FeatureSnapshots}
	if _, err := e.admin.UpdateOrg(e.ctx, org.ID, client.UpdateOrgRequest{Features: &features,
		Quotas: &apitypes.QuotasPatch{Checkpoints: intp(1), Transfers: intp(1)}}); err != nil {
		t.Fatal(err)
	}
	sb, _ := e.create(c)
	run := e.markRunning(sb.ID, "http://127.0.0.1:1")
	ops, err := e.st.ListOperations(e.ctx, store.OperationFilter{SandboxID: sb.ID, Open: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		e.completeOp(op.ID, model.OpSucceeded, "")
	}
	run, _ = e.st.GetSandbox(e.ctx, run.ID)
	run.Checkpoints = []model.Checkpoint{{Name: "one", SnapshotID: "snap-1", Bytes: 1, CreatedAt: time.Now()}}
	if _, err := e.st.UpdateSandbox(e.ctx, run); err != nil {
		t.Fatal(err)
	}
	_, err = c.CreateCheckpoint(e.ctx, sb.ID, "two")
	if st, code := apiStatus(t, err); st != 429 || code != apitypes.CodeQuotaExceeded || !strings.Contains(err.Error(), "checkpoints quota") {
		t.Fatalf("a second checkpoint with a quota of 1: %v, want 429 quota_exceeded naming checkpoints", err)
	}
	if got, _ := c.GetOrg(e.ctx, org.ID); got.Usage.Checkpoints != 1 {
		t.Fatalf("usage %+v, want 1 checkpoint", got.Usage)
	}

	// An import whose archive never ends holds the org's one transfer.
	pr, pw := io.Pipe()
	defer pw.Close()
	mw := multipart.NewWriter(pw)
	first := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(e.ctx, "POST", e.srv.URL+"/v1/sandboxes", pr)
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Content-Type", mw.FormDataContentType())
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		first <- err
	}()
	rp, _ := mw.CreateFormField("request")
	rp.Write([]byte(`{"import":"archive"}`))
	ap, _ := mw.CreateFormFile("archive", "a.tar")
	ap.Write([]byte("x")) // the archive has begun; the rest never comes
	for {
		got, err := c.GetOrg(e.ctx, org.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Usage.Transfers == 1 {
			break
		}
		select {
		case err := <-first:
			t.Fatalf("the first import ended before it was counted: %v", err)
		case <-e.ctx.Done():
			t.Fatal(e.ctx.Err())
		default:
		}
	}
	_, _, err = c.ImportSandbox(e.ctx, client.CreateSandboxRequest{Import: "archive"}, strings.NewReader("not a tar"))
	if st, code := apiStatus(t, err); st != 429 || code != apitypes.CodeQuotaExceeded || !strings.Contains(err.Error(), "transfers quota") {
		t.Fatalf("a second import with a transfers quota of 1: %v, want 429 quota_exceeded naming transfers", err)
	}
	pw.CloseWithError(io.ErrUnexpectedEOF)
	<-first
	for {
		if got, _ := c.GetOrg(e.ctx, org.ID); got.Usage.Transfers == 0 {
			break
		}
		if e.ctx.Err() != nil {
			t.Fatal("the ended import is still counted")
		}
	}
}
