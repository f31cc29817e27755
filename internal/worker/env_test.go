package worker

import (
	"bytes"
	"testing"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

// TestAttachWaitsForClaimedEnv: command tokens carry only the digest of
// the sandbox env (the env comes with the assignment). A token signed right
// after a warm-pool claim names an env this worker has not synced yet; the
// attach waits for the assignment that brings it, and the command sees it.
func TestAttachWaitsForClaimedEnv(t *testing.T) {
	e := newHostEnv(t)
	ctx := testContext(t)
	claimed := map[string]string{"CLAIMED": "by-org-a", "SHARED": "sandbox"}
	tok := e.srv.sign(t, token.Claims{SandboxID: e.sid, Scope: token.ScopeCommand, Command: &model.CommandSpec{
		ID: "c-claimed", SandboxID: e.sid, Argv: []string{"sh", "-c", `echo "$CLAIMED $SHARED"`}, User: "root", Cwd: "/",
		Env: map[string]string{"SHARED": "command"}, SandboxEnv: model.EnvDigest(claimed),
	}})
	u := sandboxURL(e.tw.w, e.sid)
	u = "ws" + u[len("http"):] + "/commands/c-claimed/attach"

	type result struct {
		out  string
		code int
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var out bytes.Buffer
		exit, err := client.RunCommand(ctx, u, tok, nil, &out, &out)
		done <- result{out.String(), exit.ExitCode, err}
	}()
	// The claim reaches the worker with its next sync.
	e.srv.Update(e.sid, func(a *workerapi.Assignment) { a.Sandbox.Env = claimed })

	r := <-done
	if r.err != nil || r.code != 0 || r.out != "by-org-a command\n" {
		t.Fatalf("command after a claim: %q exit %d err %v; want the claimed env under the command's", r.out, r.code, r.err)
	}
}
