package worker

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/client"
	"github.com/airlock/airlock/internal/model"
)

// agentOf returns the worker's agent client of sandbox sid.
func agentOf(t testing.TB, w *Worker, sid string) *agentclient.Client {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	sb := w.sandboxes[sid]
	if sb == nil || sb.agent == nil {
		t.Fatalf("sandbox %s has no agent", sid)
	}
	return sb.agent
}

// TestLateAttachIsGone: a command's token attached again after the agent
// forgot the finished command (300 newer ones; it keeps fewer than 256)
// gets 410 Gone through the data plane, RunCommand returns that error
// without retrying, and the command's side effect happened once. On the old
// worker and agent the late attach ran the command a second time.
func TestLateAttachIsGone(t *testing.T) {
	e := newHostEnv(t)
	ctx := testContext(t)
	marker := filepath.Join(t.TempDir(), "ran")
	u, tok := e.command(t, "c-late", false, "sh", "-c", `echo once >> "$0"`, marker)
	if exit, err := client.RunCommand(ctx, u, tok, nil, io.Discard, io.Discard); err != nil || exit.ExitCode != 0 {
		t.Fatalf("first run: %+v %v", exit, err)
	}
	ac := agentOf(t, e.tw.w, e.sid)
	for i := range 300 {
		id := fmt.Sprintf("filler-%d", i)
		if _, err := ac.StartProcess(ctx, agentapi.ProcessSpec{ID: id, User: "root", Cwd: "/", Argv: []string{"true"}}); err != nil {
			t.Fatal(err)
		}
		s, err := ac.Output(ctx, id, 0)
		if err != nil {
			t.Fatal(err)
		}
		for {
			kind, _, err := s.Next()
			if err != nil {
				t.Fatal(err)
			}
			if kind == agentapi.FrameExit || kind == agentapi.FrameError {
				break
			}
		}
		s.Close()
	}
	_, err := client.RunCommand(ctx, u, tok, nil, io.Discard, io.Discard)
	if !errors.Is(err, client.ErrGone) || !errors.Is(err, model.ErrNotFound) || !strings.Contains(err.Error(), "not run again") {
		t.Fatalf("late attach: %v, want 410 Gone saying it is not run again", err)
	}
	b, err := os.ReadFile(marker)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(b), "once"); got != 1 {
		t.Fatalf("the command ran %d times, want once", got)
	}
}
