package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
)

// TestWorkerCommandsAgainstRealAPI: worker ls, get, cordon and uncordon
// against the real API handler and service over a SQLite store.
func TestWorkerCommandsAgainstRealAPI(t *testing.T) {
	e := newAPIEnv(t)
	now := time.Now().UTC()
	if err := e.st.UpsertWorker(e.ctx, model.Worker{ID: "w-a", Runtimes: model.NamedRuntimes("gvisor", "qemu"), CapacityMiB: 4096, CapacityVCPUs: 2, LastHeartbeat: now, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	out := e.mustRun("worker", "ls")
	if !strings.Contains(out, "ID") || !strings.Contains(out, "w-a") || !strings.Contains(out, "ready") || !strings.Contains(out, "gvisor,qemu") || !strings.Contains(out, "0/4096 MiB") {
		t.Fatalf("worker ls:\n%s", out)
	}
	if out := e.mustRun("worker", "cordon", "w-a"); strings.TrimSpace(out) != "worker w-a is cordoned" {
		t.Fatalf("worker cordon: %q", out)
	}
	var got struct {
		State    string `json:"state"`
		Cordoned bool   `json:"cordoned"`
	}
	if err := json.Unmarshal([]byte(e.mustRun("worker", "get", "w-a")), &got); err != nil || got.State != "cordoned" || !got.Cordoned {
		t.Fatalf("worker get after cordon: %+v %v", got, err)
	}
	if out := e.mustRun("worker", "uncordon", "w-a"); strings.TrimSpace(out) != "worker w-a is ready" {
		t.Fatalf("worker uncordon: %q", out)
	}
	if code, _, errOut := e.run("worker", "cordon", "w-nope"); code != ExitError || !strings.Contains(errOut, "no worker") || !strings.Contains(errOut, "404") {
		t.Fatalf("cordon of an unknown worker: exit %d, stderr %q", code, errOut)
	}
	if code, _, errOut := e.run("worker", "cordon"); code == 0 || !strings.Contains(errOut, "worker id") {
		t.Fatalf("cordon without an id: exit %d, stderr %q", code, errOut)
	}

	// Drain: refused without a blob store (409, saying what to do); with
	// one, the worker is draining, and --wait returns once nothing runs
	// there (nothing does).
	if code, _, errOut := e.run("worker", "drain", "w-a"); code != ExitError || !strings.Contains(errOut, "409") || !strings.Contains(errOut, "--blob-store") {
		t.Fatalf("drain without a blob store: exit %d, stderr %q", code, errOut)
	}
	if err := e.st.UpsertWorker(e.ctx, model.Worker{ID: "w-a", Runtimes: model.NamedRuntimes("gvisor"), CapacityMiB: 4096, CapacityVCPUs: 2, LastHeartbeat: now, CreatedAt: now, BlobStore: "file:///shared"}); err != nil {
		t.Fatal(err)
	}
	out = e.mustRun("worker", "drain", "w-a", "--wait", "--timeout", "10s")
	if !strings.Contains(out, "worker w-a is draining") || !strings.Contains(out, "worker w-a is drained") {
		t.Fatalf("worker drain --wait:\n%s", out)
	}
	if out := e.mustRun("worker", "ls"); !strings.Contains(out, "draining") {
		t.Fatalf("worker ls after drain:\n%s", out)
	}
	if out := e.mustRun("worker", "uncordon", "w-a"); strings.TrimSpace(out) != "worker w-a is ready" {
		t.Fatalf("uncordon ends the drain: %q", out)
	}
}
