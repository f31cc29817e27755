package fake_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/fake"
)

// started starts a fake sandbox and returns a client of its agent.
func started(t *testing.T) (*fake.Driver, *agentclient.Client) {
	t.Helper()
	d := fake.New(nil)
	sb, err := d.Start(t.Context(), runtime.Spec{ID: "sb-1", RootFS: template(t), MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
	t.Cleanup(func() { c.Close(); sb.Close(); d.Delete(context.Background(), "sb-1") })
	if err := c.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	return d, c
}

// run starts argv and returns its output and exit.
func run(t *testing.T, c *agentclient.Client, id string, argv ...string) (string, agentapi.Exit) {
	t.Helper()
	if _, err := c.StartProcess(t.Context(), agentapi.ProcessSpec{ID: id, Argv: argv}); err != nil {
		t.Fatal(err)
	}
	return output(t, c, id, 0)
}

func output(t *testing.T, c *agentclient.Client, id string, offset int64) (string, agentapi.Exit) {
	t.Helper()
	out, err := c.Output(t.Context(), id, offset)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	var sb strings.Builder
	for {
		kind, payload, err := out.Next()
		if err != nil {
			t.Fatalf("output of %s: %v", id, err)
		}
		switch kind {
		case agentapi.FrameStdout, agentapi.FrameStderr:
			sb.Write(payload)
		case agentapi.FrameExit:
			var e agentapi.Exit
			if err := json.Unmarshal(payload, &e); err != nil {
				t.Fatal(err)
			}
			return sb.String(), e
		}
	}
}

// TestGuestPrograms: the fake's built-in programs and shell, the limits it
// states (no loops, no programs it lacks), offsets, signals, and the agent
// API's errors.
func TestGuestPrograms(t *testing.T) {
	_, c := started(t)
	if out, e := run(t, c, "seq", "sh", "-c", "mkdir -p d/e && echo one > d/e/f; cat d/e/f missing || echo rc=$?; test -d d && echo dir"); out != "one\ncat: missing: No such file or directory\nrc=1\ndir\n" || e.ExitCode != 0 {
		t.Errorf("script = %q, %+v", out, e)
	}
	if out, e := run(t, c, "loop", "bash", "-c", "while :; do echo x; done"); e.ExitCode != 2 || !strings.Contains(out, "no loops") {
		t.Errorf("a loop = %q, %+v; want exit 2 saying the shell has no loops", out, e)
	}
	if _, e := run(t, c, "py", "python3", "-c", "print(1)"); e.Error == "" || e.ExitCode != -1 {
		t.Errorf("python3 = %+v; want it not started, saying so", e)
	}
	if out, _ := output(t, c, "seq", 4); !strings.HasPrefix(out, "cat: missing") {
		t.Errorf("output from offset 4 = %q", out)
	}
	if _, err := c.StartProcess(t.Context(), agentapi.ProcessSpec{ID: "nap", Argv: []string{"sleep", "600"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartProcess(t.Context(), agentapi.ProcessSpec{ID: "nap", Argv: []string{"true"}}); !errors.Is(err, model.ErrConflict) {
		t.Errorf("a second process nap = %v, want a conflict", err)
	}
	if err := c.Signal(t.Context(), "nap", "KILL"); err != nil {
		t.Fatal(err)
	}
	if _, e := output(t, c, "nap", 0); e.Signal != "KILL" || e.ExitCode != -1 {
		t.Errorf("killed sleep exit = %+v", e)
	}
	if _, _, err := c.ReadFile(t.Context(), "/nope"); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("ReadFile of a missing file = %v, want not found", err)
	}
	if out, _ := run(t, c, "home", "pwd"); out != agentapi.DefaultHome+"\n" {
		t.Errorf("pwd of the default user = %q", out)
	}
}

// TestCheckpointKeepsFinishedProcesses: a restore has the processes that
// had finished (output and exit) and reports one that was running as
// killed; the restored guest's files are its own.
func TestCheckpointKeepsFinishedProcesses(t *testing.T) {
	d, c := started(t)
	run(t, c, "done", "echo", "kept")
	if _, err := c.StartProcess(t.Context(), agentapi.ProcessSpec{ID: "long", Argv: []string{"sleep", "600"}}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := d.Checkpoint(t.Context(), "sb-1", dir, true); err != nil {
		t.Fatal(err)
	}
	sb, err := d.Restore(t.Context(), runtime.Spec{ID: "sb-2", RootFS: template(t), MemoryMiB: 256}, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Delete(context.Background(), "sb-2")
	c2 := agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
	defer c2.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := c2.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if out, e := output(t, c2, "done", 0); out != "kept\n" || e.ExitCode != 0 {
		t.Errorf("restored finished process = %q, %+v", out, e)
	}
	if _, e := output(t, c2, "long", 0); e.Signal != "KILL" {
		t.Errorf("restored running process = %+v, want killed", e)
	}
	if err := c.Signal(t.Context(), "long", "KILL"); err != nil {
		t.Errorf("the original's process is its own: %v", err)
	}
}
