package worker

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/workerapi"
)

// TestObservedBoundsReasons: a sandbox whose reason (or task error) quotes
// megabytes of guest output, as a QEMU guest's panic line can, is reported
// with at most workerapi.MaxReason bytes of it, so one sandbox cannot make
// the worker's Sync body too large for the server.
func TestObservedBoundsReasons(t *testing.T) {
	huge := "sandbox runtime exited: guest kernel panic: " + strings.Repeat("A", 9<<20)
	w := &Worker{sandboxes: map[string]*sandbox{
		"sb1": {id: "sb1", state: model.StateFailed, reason: huge},
		"sb2": {id: "sb2", state: model.StateRunning, taskResult: &workerapi.TaskResult{OperationID: "op1", Error: huge}},
	}}
	req, _ := w.observed()
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 4*workerapi.MaxReason {
		t.Errorf("Sync body with two huge reasons is %d bytes", len(b))
	}
	for _, o := range req.Observed {
		if len(o.Reason) > workerapi.MaxReason || o.Task != nil && len(o.Task.Error) > workerapi.MaxReason {
			t.Errorf("%s: reason %d bytes, task error %v", o.SandboxID, len(o.Reason), o.Task)
		}
		if o.SandboxID == "sb1" && !strings.HasPrefix(o.Reason, "sandbox runtime exited: guest kernel panic: AAA") {
			t.Errorf("sb1 reason %.80q lost its beginning", o.Reason)
		}
	}
	// The worker's own record keeps the task result it will report again.
	if got := w.sandboxes["sb2"].taskResult.Error; got != huge {
		t.Errorf("observed() modified the sandbox's task result (%d bytes)", len(got))
	}
}
