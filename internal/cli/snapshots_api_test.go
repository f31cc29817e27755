package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/model"
)

// TestSnapshotCommandsAgainstRealAPI runs the snapshot commands against the
// real API handler and service (no worker): the requests must be what the
// server parses, and its refusals must reach the user.
func TestSnapshotCommandsAgainstRealAPI(t *testing.T) {
	e := newAPIEnv(t)
	settled := e.settleSoon("")
	id := strings.TrimSpace(e.mustRun("sandbox", "create"))
	<-settled

	// Gate off: every command names the gate.
	for _, args := range [][]string{
		{"sandbox", "checkpoint", id, "c1"},
		{"sandbox", "checkpoints", id},
		{"sandbox", "checkpoint-rm", id, "c1"},
		{"sandbox", "rollback", id, "c1"},
		{"sandbox", "fork", id, "c1"},
		{"sandbox", "export", id, "c1", "-o", "-"},
	} {
		code, _, errOut := e.run(args...)
		if code != ExitError || !strings.Contains(errOut, "snapshots") || !strings.Contains(errOut, "403") {
			t.Errorf("%v with the gate off: exit %d, stderr %q", args, code, errOut)
		}
	}
	archive := filepath.Join(t.TempDir(), "x.tar")
	os.WriteFile(archive, []byte("not a tar"), 0o600)
	if code, _, errOut := e.run("sandbox", "import", archive); code != ExitError || !strings.Contains(errOut, "snapshots") {
		t.Errorf("import with the gate off: exit %d, stderr %q", code, errOut)
	}

	e.mustRun("org", "set", "org-default", "--features", "snapshots")

	// The server parses each request.
	if code, _, errOut := e.run("sandbox", "checkpoint", id, "Bad Name"); code != ExitError || !strings.Contains(errOut, "invalid") || !strings.Contains(errOut, "422") {
		t.Errorf("invalid name: exit %d, stderr %q", code, errOut)
	}
	if out := e.mustRun("sandbox", "checkpoints", id, "--json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("checkpoints before any completed: %q", out)
	}
	if code, _, errOut := e.run("sandbox", "rollback", id, "nope"); code != ExitError || !strings.Contains(errOut, `no checkpoint named "nope"`) {
		t.Errorf("rollback to an unknown checkpoint: exit %d, stderr %q", code, errOut)
	}
	if code, _, errOut := e.run("sandbox", "fork", id, "nope", "--count", "2"); code != ExitError || !strings.Contains(errOut, `no checkpoint named "nope"`) {
		t.Errorf("fork of an unknown checkpoint: exit %d, stderr %q", code, errOut)
	}
	if code, _, errOut := e.run("sandbox", "checkpoint-rm", id, "nope"); code != ExitError || !strings.Contains(errOut, `no checkpoint named "nope"`) {
		t.Errorf("checkpoint-rm of an unknown checkpoint: exit %d, stderr %q", code, errOut)
	}
	if code, _, errOut := e.run("sandbox", "export", id, "nope"); code != ExitError || !strings.Contains(errOut, `no checkpoint named "nope"`) {
		t.Errorf("export of an unknown checkpoint: exit %d, stderr %q", code, errOut)
	}
	code, _, errOut := e.run("sandbox", "import", archive, "--env", "A=1")
	if code != ExitError || !strings.Contains(errOut, "not a checkpoint archive") {
		t.Errorf("import of a non-archive: exit %d, stderr %q", code, errOut)
	}
	sb := decodeJSON[model.Sandbox](t, e.mustRun("sandbox", "get", id, "--json"))
	if sb.State != model.StateRunning {
		t.Errorf("sandbox %s after the refusals: %s", id, sb.State)
	}

	// A checkpoint in progress: accepted, and `op wait <sandbox>` does not
	// call the sandbox settled while it runs.
	if out := e.mustRun("sandbox", "checkpoint", id, "c1", "--no-wait"); !strings.HasPrefix(out, "op-") {
		t.Errorf("checkpoint --no-wait printed %q", out)
	}
	sb = decodeJSON[model.Sandbox](t, e.mustRun("sandbox", "get", id, "--json"))
	if sb.Task == nil || sb.Task.Kind != model.OpCheckpoint || sb.Task.Checkpoint != "c1" {
		t.Fatalf("sandbox task during the checkpoint: %+v", sb.Task)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 300*time.Millisecond)
	defer cancel()
	c := client.New(e.url, e.key)
	if _, err := waitSandboxSettled(ctx, c, id, 20*time.Millisecond); err == nil {
		t.Error("op wait: the sandbox counts as settled while its checkpoint runs")
	}
	if code, _, errOut := e.run("sandbox", "rollback", id, "c1"); code != ExitError || !strings.Contains(errOut, "in progress") {
		t.Errorf("rollback during a checkpoint: exit %d, stderr %q", code, errOut)
	}
}
