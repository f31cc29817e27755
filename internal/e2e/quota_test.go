package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
)

// TestQuotasEndToEnd runs the quota attacks through a real server, worker
// and gVisor sandbox: a tenant with a 64 MiB disk writes 200 MiB (ENOSPC in
// the guest); its 255 KiB sandbox env reaches its commands although the
// command token stays small (the env travels with the assignment); no event
// keeps the env; and with a quota of one sandbox the second create is 429
// quota_exceeded while GET /v1/orgs/{id} shows the usage.
func TestQuotasEndToEnd(t *testing.T) {
	s := need(t)
	ctx := ctxT(t, 10*time.Minute)
	admin := s.client()
	org, err := admin.CreateOrg(ctx, "quota-e2e")
	if err != nil {
		t.Fatal(err)
	}
	k, err := admin.CreateKey(ctx, org.ID, client.CreateKeyRequest{Name: "tenant"})
	if err != nil {
		t.Fatal(err)
	}
	c := client.New(s.url(), k.Secret)
	one := 1
	if _, err := admin.UpdateOrg(ctx, org.ID, client.UpdateOrgRequest{Quotas: &apitypes.QuotasPatch{Sandboxes: &one}}); err != nil {
		t.Fatal(err)
	}

	env := map[string]string{}
	for i := 0; len(env) < 250; i++ {
		env[fmt.Sprintf("V%04d", i)] = fmt.Sprintf("s3cret-e2e-%04d-", i) + strings.Repeat("x", 1000)
	}
	sb := newSandbox(t, c, client.CreateSandboxRequest{Env: env, Resources: model.Resources{DiskMiB: 64}})
	if sb.Resources.DiskMiB != 64 {
		t.Fatalf("disk_mib = %d, want 64", sb.Resources.DiskMiB)
	}

	// The env reaches the command from the worker, not from the token.
	cmd, err := c.CreateCommand(ctx, sb.ID, client.CreateCommandRequest{Argv: []string{"/bin/sh", "-c", `printf '%.15s|%.15s|%s\n' "$V0007" "$V0249" "$OWN"`}, Env: map[string]string{"OWN": "mine"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("command token: %d bytes for a sandbox env of %d pairs (~255 KiB)", len(cmd.Token), len(env))
	if len(cmd.Token) > 2048 || strings.Contains(cmd.Token, "s3cret") {
		t.Fatalf("the command token is %d bytes: it carries the sandbox env", len(cmd.Token))
	}
	var out, errb strings.Builder
	exit, err := client.RunCommand(ctx, cmd.AttachURL, cmd.Token, nil, &out, &errb)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if want := "s3cret-e2e-0007|s3cret-e2e-0249|mine\n"; out.String() != want || exit.ExitCode != 0 {
		t.Fatalf("env in the command: %q (exit %d, stderr %q), want %q", out.String(), exit.ExitCode, errb.String(), want)
	}

	// The disk: 200 MiB into 64 MiB is ENOSPC inside; the space returns.
	r := sh(t, c, sb.ID, "dd if=/dev/zero of=$HOME/fill bs=1M count=200 2>&1; echo rc=$?")
	t.Logf("dd: %s", r.stdout)
	if !strings.Contains(r.stdout, "No space left on device") || strings.Contains(r.stdout, "rc=0") {
		t.Fatalf("200 MiB into a 64 MiB disk: %s", r.stdout)
	}
	if r := sh(t, c, sb.ID, "rm $HOME/fill && dd if=/dev/zero of=$HOME/again bs=1M count=16 2>&1"); r.exit.ExitCode != 0 {
		t.Fatalf("after rm: %+v", r)
	}

	// Quota: a second sandbox is refused, naming the quota; usage shows.
	_, _, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{}, "")
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != 429 || ae.Code != "quota_exceeded" || !strings.Contains(ae.Message, "sandboxes quota") {
		t.Fatalf("second sandbox with a quota of 1: %v, want 429 quota_exceeded naming sandboxes", err)
	}
	t.Logf("refused: %s", ae.Message)
	got, err := c.GetOrg(ctx, org.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Usage.Sandboxes != 1 || got.Usage.DiskMiB != 64 || got.Quotas.Sandboxes != 1 {
		t.Fatalf("org usage %+v quotas %+v, want 1 sandbox of 64 MiB against a quota of 1", got.Usage, got.Quotas)
	}

	// No event of the sandbox keeps an env value. The log holds the
	// sandbox's running state by now; read up to it.
	for ev, err := range c.Events(ctxT(t, time.Minute), sb.ID, 0) {
		if err != nil {
			t.Fatalf("events: %v", err)
		}
		if strings.Contains(string(ev.Data), "s3cret") {
			t.Fatalf("event %d (%s) keeps env values", ev.Seq, ev.Type)
		}
		var cur model.Sandbox
		if ev.Type == "sandbox.state" && json.Unmarshal(ev.Data, &cur) == nil && cur.State == model.StateRunning {
			break
		}
	}
}
