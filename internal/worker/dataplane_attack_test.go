package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
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

// TestDataPlaneListsPaged: the data plane answers a directory of 2500
// entries one page at a time (at most 1000 entries, with next_cursor), so
// the worker never holds more than a page of what the guest says; the
// client follows the pages and gets every entry once; commands page the
// same way. The old data plane answered each list in one piece.
func TestDataPlaneListsPaged(t *testing.T) {
	e := newHostEnv(t)
	ctx := testContext(t)
	fc := e.files(t)
	dir := t.TempDir()
	const nFiles = 2500
	for i := range nFiles {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	es, next, err := fc.ListPage(ctx, dir, 0, "")
	if err != nil || len(es) != agentapi.MaxPageEntries || next == "" {
		t.Fatalf("first page: %d entries, next %q, %v; want %d and a cursor", len(es), next, err, agentapi.MaxPageEntries)
	}
	all, err := fc.List(ctx, dir)
	if err != nil || len(all) != nFiles || all[0].Name != "f00000" || all[nFiles-1].Name != fmt.Sprintf("f%05d", nFiles-1) {
		t.Fatalf("List: %d entries, %v", len(all), err)
	}

	// Commands, in pages of 10 (the default page of 1000 is the agent's, as
	// for files above).
	ac := agentOf(t, e.tw.w, e.sid)
	const nCmds = 25
	var ids []string
	t.Cleanup(func() {
		for _, id := range ids {
			_ = ac.Signal(context.Background(), id, "KILL")
		}
	})
	for i := range nCmds {
		id := fmt.Sprintf("run-%04d", i)
		if _, err := ac.StartProcess(ctx, agentapi.ProcessSpec{ID: id, User: "root", Cwd: "/", Argv: []string{"sleep", "1000"}}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	seen := map[string]int{}
	pages := 0
	for cursor := ""; ; pages++ {
		ps, next, err := fc.ListCommandsPage(ctx, 10, cursor)
		if err != nil || len(ps) > 10 {
			t.Fatalf("page %d: %d commands, %v", pages, len(ps), err)
		}
		for _, c := range ps {
			seen[c.ID]++
		}
		if next == "" {
			break
		}
		cursor = next
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Fatalf("command %s listed %d times", id, seen[id])
		}
	}
	cmds, err := fc.ListCommands(ctx)
	if err != nil || len(cmds) < nCmds {
		t.Fatalf("ListCommands: %d, %v", len(cmds), err)
	}
}

// setTask gives sandbox id's assignment task t (nil: none).
func (f *fakeServer) setTask(id string, t *model.Task) {
	f.Update(id, func(a *workerapi.Assignment) { a.Sandbox.Task = t })
}

// waitTask waits for the worker's result of task op on sandbox id.
func (f *fakeServer) waitTask(ctx context.Context, id, op string) workerapi.TaskResult {
	f.t.Helper()
	o := f.waitFor(ctx, id, func(o workerapi.Observed, _ []model.SandboxState) bool {
		return o.Task != nil && o.Task.OperationID == op
	})
	if o.Task.Error != "" {
		f.t.Fatalf("task %s: %s", op, o.Task.Error)
	}
	return *o.Task
}

// TestLateAttachAfterRollbackGVisor: a command started after a checkpoint
// runs; the sandbox is rolled back to the checkpoint, which brings back an
// agent that never heard of the command. Attaching with the command's token
// again gets 410 Gone instead of running it a second time (the old worker
// ran it again, in the rolled-back sandbox). A real gVisor sandbox, a real
// checkpoint and rollback.
func TestLateAttachAfterRollbackGVisor(t *testing.T) {
	e := newGVisorEnv(t)
	ctx := testContext(t)
	e.srv.setTask(e.id, &model.Task{OperationID: "op-cp", Kind: model.OpCheckpoint, Checkpoint: "before"})
	cp := e.srv.waitTask(ctx, e.id, "op-cp")
	e.srv.setTask(e.id, nil)

	attach := sandboxURL(e.tw.w, e.id) + "/commands/c-after/attach"
	tok := e.srv.sign(t, token.Claims{SandboxID: e.id, Scope: token.ScopeCommand,
		Command: &model.CommandSpec{ID: "c-after", SandboxID: e.id, Argv: []string{"sh", "-c", "echo ran"}}})
	var out bytes.Buffer
	if exit, err := client.RunCommand(ctx, attach, tok, nil, &out, io.Discard); err != nil || exit.ExitCode != 0 || out.String() != "ran\n" {
		t.Fatalf("first run: %q %+v %v", out.String(), exit, err)
	}

	e.srv.setTask(e.id, &model.Task{OperationID: "op-rb", Kind: model.OpRollback, Checkpoint: "before", SnapshotID: cp.SnapshotID})
	e.srv.waitTask(ctx, e.id, "op-rb")
	e.srv.setTask(e.id, nil)
	e.srv.waitObserved(ctx, e.id, model.StateRunning)

	out.Reset()
	exit, err := client.RunCommand(ctx, attach, tok, nil, &out, io.Discard)
	if !errors.Is(err, client.ErrGone) || !strings.Contains(err.Error(), "rolled back") {
		t.Fatalf("attach after the rollback: output %q exit %+v err %v; want 410 Gone, not a second run", out.String(), exit, err)
	}
	// The sandbox itself works on: a new command runs.
	tok2 := e.srv.sign(t, token.Claims{SandboxID: e.id, Scope: token.ScopeCommand,
		Command: &model.CommandSpec{ID: "c-new", SandboxID: e.id, Argv: []string{"true"}}})
	if exit, err := client.RunCommand(ctx, sandboxURL(e.tw.w, e.id)+"/commands/c-new/attach", tok2, nil, io.Discard, io.Discard); err != nil || exit.ExitCode != 0 {
		t.Fatalf("new command after the rollback: %+v %v", exit, err)
	}
}
