package controller

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/workerapi"
)

// The attack of a QEMU guest that writes a multi-MiB "Kernel panic - not
// syncing: AAAA…" line: its reason reaches the server in every Sync.

// TestSyncHugeReasonTruncated: a 9 MiB reason handed to Sync is stored
// truncated to workerapi.MaxReason, the heartbeat is recorded and the other
// sandbox of the same Sync is applied too.
func TestSyncHugeReasonTruncated(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	e.createSandbox("sb1", 512)
	e.createSandbox("sb2", 512)
	e.reconcile()
	e.clock.Advance(5 * e.c.HeartbeatTTL())

	huge := "guest kernel panic: " + strings.Repeat("A", 9<<20)
	_, err := e.c.Sync(e.ctx, "w1", workerapi.SyncRequest{Observed: []workerapi.Observed{
		{SandboxID: "sb1", State: model.StateFailed, Reason: huge},
		{SandboxID: "sb2", State: model.StateRunning},
	}}, workerapi.Poll{})
	if err != nil {
		t.Fatalf("Sync with a 9 MiB reason: %v", err)
	}
	sb := e.wantSandbox("sb1", model.StateFailed, "w1", "guest kernel panic: AAAA")
	if len(sb.Reason) > workerapi.MaxReason {
		t.Errorf("stored reason is %d bytes, want at most %d", len(sb.Reason), workerapi.MaxReason)
	}
	if !strings.Contains(sb.Reason, "bytes cut]") {
		t.Errorf("stored reason %q does not say it was cut", sb.Reason[max(0, len(sb.Reason)-60):])
	}
	e.wantSandbox("sb2", model.StateRunning, "w1", "")
	wk, err := e.st.GetWorker(e.ctx, "w1")
	if err != nil {
		t.Fatal(err)
	}
	if !wk.LastHeartbeat.Equal(e.clock.Now()) {
		t.Errorf("heartbeat %v, want %v", wk.LastHeartbeat, e.clock.Now())
	}
}

// TestSyncOversizedBodyKeepsWorker: a Sync body over the 8 MiB limit (a
// 9 MiB reason from a worker that does not bound it) is answered 413 with a
// message naming the limits, but the heartbeat is recorded: the worker and
// its sandboxes are not declared unreachable.
func TestSyncOversizedBodyKeepsWorker(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	e.runningSandbox(w, "sb1")

	for range 3 { // every sync of the runaway worker
		e.clock.Advance(2 * e.c.HeartbeatTTL())
		resp, body := w.post("/internal/v1/workers/w1/sync?wait=0s", workerapi.SyncRequest{Observed: []workerapi.Observed{
			{SandboxID: "sb1", State: model.StateFailed, Reason: "guest kernel panic: " + strings.Repeat("A", 9<<20)},
		}})
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("sync with a 9 MiB body: %s, want 413", resp.Status)
		}
		var msg struct {
			Error struct{ Code, Message string }
		}
		json.Unmarshal(body, &msg)
		if !strings.Contains(msg.Error.Message, "heartbeat was recorded") || !strings.Contains(msg.Error.Message, "1024 bytes") {
			t.Errorf("413 message %q does not explain the limits", msg.Error.Message)
		}
		e.reconcile()
		e.wantSandbox("sb1", model.StateRunning, "w1", "")
		if sb := e.sandbox("sb1"); strings.Contains(sb.Reason, "unreachable") {
			t.Fatalf("sandbox reason %q after an oversized sync: the worker was cut off", sb.Reason)
		}
	}
	if err := e.c.Ready(e.ctx); err != nil {
		t.Errorf("Ready after oversized syncs = %v", err)
	}
}

// TestTruncateReason: the bound holds for any input and cuts at a UTF-8
// boundary.
func TestTruncateReason(t *testing.T) {
	for _, s := range []string{"", "short", strings.Repeat("é", 2000), strings.Repeat("x", workerapi.MaxReason), strings.Repeat("x", workerapi.MaxReason+1), strings.Repeat("€", 9<<18)} {
		got := workerapi.TruncateReason(s)
		if len(got) > workerapi.MaxReason {
			t.Errorf("TruncateReason(%d bytes) = %d bytes", len(s), len(got))
		}
		if len(s) <= workerapi.MaxReason && got != s {
			t.Errorf("TruncateReason changed a %d-byte reason", len(s))
		}
		if !strings.HasPrefix(s, strings.SplitN(got, " …[", 2)[0]) {
			t.Errorf("TruncateReason(%d bytes) is not a prefix", len(s))
		}
		if !utf8.ValidString(got) {
			t.Errorf("TruncateReason(%d bytes) is not valid UTF-8", len(s))
		}
	}
}

// TestSyncOutOfOrderIgnored: a Sync that the worker cut short can reach
// the server after the one that replaced it; its older observations must
// not overwrite the newer ones. A new epoch (the worker restarted) starts
// the numbering over.
func TestSyncOutOfOrderIgnored(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	e.createSandbox("sb1", 512)
	e.reconcile()
	sync := func(epoch string, seq uint64, st model.SandboxState, reason string) {
		t.Helper()
		if _, err := e.c.Sync(e.ctx, "w1", workerapi.SyncRequest{Epoch: epoch, Seq: seq, Observed: []workerapi.Observed{
			{SandboxID: "sb1", State: st, Reason: reason},
		}}, workerapi.Poll{}); err != nil {
			t.Fatalf("Sync %s/%d: %v", epoch, seq, err)
		}
	}
	sync("epoch-a", 2, model.StateRunning, "")
	e.wantSandbox("sb1", model.StateRunning, "w1", "")
	sync("epoch-a", 1, model.StateFailed, "stale: must not land")
	e.wantSandbox("sb1", model.StateRunning, "w1", "")
	sync("epoch-a", 2, model.StateFailed, "a repeated seq is stale too")
	e.wantSandbox("sb1", model.StateRunning, "w1", "")
	sync("epoch-b", 1, model.StateFailed, "the restarted worker's view")
	e.wantSandbox("sb1", model.StateFailed, "w1", "the restarted worker's view")
}
