package agentclient_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/model"
)

// TestLogLineBounded: a command with 256 KiB of arguments leaves a short line
// in the agent's log (a file on the host), even at debug level.
func TestLogLineBounded(t *testing.T) {
	h := startAgent(t) // -v: debug level, the most the agent logs
	ctx := testCtx(t)
	before := len(h.agentLog())
	big := strings.Repeat("A", 64<<10) // Linux takes at most 128 KiB per argument
	r := h.run(ctx, agentapi.ProcessSpec{Argv: []string{"true", big, big, big, big}})
	if r.exit.ExitCode != 0 {
		t.Fatalf("exit %+v", r.exit)
	}
	grown := h.agentLog()[before:]
	if !strings.Contains(grown, "process started") {
		t.Fatalf("no log line for the command: %q", grown)
	}
	if len(grown) > 2048 {
		t.Fatalf("the agent logged %d bytes for one command with 256 KiB of argv, want at most 2048", len(grown))
	}
}

// TestForgottenProcessNotRerun: once the agent has forgotten a finished
// process (after 300 newer ones; it keeps fewer than 256), starting the
// same id again is 410 Gone, and the command's side effect happened once.
// On the old agent the second start ran the command again.
func TestForgottenProcessNotRerun(t *testing.T) {
	h := startAgent(t)
	ctx := testCtx(t)
	marker := filepath.Join(h.dir, "ran")
	spec := agentapi.ProcessSpec{ID: "late-" + newID(), User: "root",
		Argv: []string{"sh", "-c", `echo once >> "$0"`, marker}}
	if r := h.run(ctx, spec); r.exit.ExitCode != 0 {
		t.Fatalf("first run: %+v", r.exit)
	}
	for range 300 {
		if r := h.run(ctx, agentapi.ProcessSpec{Argv: []string{"true"}}); r.exit.ExitCode != 0 {
			t.Fatalf("filler: %+v", r.exit)
		}
	}
	_, err := h.client.StartProcess(ctx, spec)
	if !errors.Is(err, agentclient.ErrGone) || !errors.Is(err, model.ErrNotFound) || !strings.Contains(err.Error(), "not run again") {
		t.Fatalf("second start of %s: %v, want ErrGone saying it is not run again", spec.ID, err)
	}
	if _, err = h.client.GetProcess(ctx, spec.ID); !errors.Is(err, agentclient.ErrGone) {
		t.Fatalf("get of the forgotten process: %v, want ErrGone", err)
	}
	b, err := os.ReadFile(marker)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != "once\n" {
		t.Fatalf("the command ran %d times, want once", strings.Count(string(b), "once"))
	}
}
