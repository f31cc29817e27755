package agentclient_test

import (
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/agentapi"
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
