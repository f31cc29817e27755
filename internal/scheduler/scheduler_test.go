package scheduler

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
)

func TestPick(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	ttl := 15 * time.Second
	fresh := now.Add(-time.Second)
	stale := now.Add(-time.Minute)
	w := func(id string, hb time.Time, mem, cpu int, templates ...string) model.Worker {
		return model.Worker{ID: id, LastHeartbeat: hb, Runtimes: []model.RuntimeInfo{{Name: "gvisor", Caps: snapCaps}}, Templates: templates, CapacityMiB: mem, CapacityVCPUs: cpu}
	}
	free := func(wk model.Worker, mib int) model.Worker { wk.FreeMiB = &mib; return wk }
	cordon := func(wk model.Worker) model.Worker { wk.Cordoned = true; return wk }
	req := Request{Runtime: "gvisor", TemplateDigest: "sha256:a", Resources: model.Resources{VCPUs: 1, MemoryMiB: 512}}
	// vm offers a runtime "vm" that pauses but cannot snapshot, beside gvisor.
	vm := func(id string, mem int) model.Worker {
		wk := w(id, fresh, mem, 4, "sha256:a")
		wk.Runtimes = append(wk.Runtimes, model.RuntimeInfo{Name: "vm", Caps: model.RuntimeCaps{Pause: true}})
		return wk
	}
	snapReq := req
	snapReq.Needs = model.RuntimeCaps{Snapshot: true, Fork: true}
	vmSnapReq := snapReq
	vmSnapReq.Runtime = "vm"
	tests := []struct {
		name    string
		workers []model.Worker
		load    map[string]Load
		req     Request
		want    string
		wantErr string // substring; empty means success
	}{
		{name: "no workers", req: req, wantErr: "no live worker: none has sent a heartbeat"},
		{name: "only stale", workers: []model.Worker{w("w1", stale, 4096, 4, "sha256:a")}, req: req, wantErr: "no live worker: none has sent a heartbeat"},
		{name: "never heartbeat", workers: []model.Worker{w("w1", time.Time{}, 4096, 4, "sha256:a")}, req: req, wantErr: "no live worker"},
		{name: "runtime missing", workers: []model.Worker{w("w1", fresh, 4096, 4, "sha256:a")},
			req: Request{Runtime: "qemu", TemplateDigest: "sha256:a"}, wantErr: `no live worker supports runtime "qemu"`},
		{name: "template missing", workers: []model.Worker{w("w1", fresh, 4096, 4, "sha256:b")}, req: req, wantErr: "has template sha256:a"},
		{name: "template only on stale worker", workers: []model.Worker{w("w1", fresh, 4096, 4, "sha256:b"), w("w2", stale, 4096, 4, "sha256:a")}, req: req, wantErr: "has template sha256:a"},
		{name: "no memory", workers: []model.Worker{w("w1", fresh, 1024, 4, "sha256:a")}, load: map[string]Load{"w1": {MemoryMiB: 768}}, req: req,
			wantErr: "no worker has capacity for 512 MiB and 1 vCPUs (most free: 256 MiB, 4 vCPUs on worker w1)"},
		{name: "no vcpus", workers: []model.Worker{w("w1", fresh, 4096, 2, "sha256:a")}, load: map[string]Load{"w1": {VCPUs: 2}}, req: req, wantErr: "no worker has capacity"},
		{name: "exact fit", workers: []model.Worker{w("w1", fresh, 1024, 2, "sha256:a")}, load: map[string]Load{"w1": {MemoryMiB: 512, VCPUs: 1}}, req: req, want: "w1"},
		{name: "measured free memory too low", workers: []model.Worker{free(w("w1", fresh, 4096, 4, "sha256:a"), 63)}, req: req,
			wantErr: "no worker has the memory free to start a sandbox (64 MiB needed at start; most free: 63 MiB on worker w1"},
		{name: "starting sandboxes take measured memory", workers: []model.Worker{free(w("w1", fresh, 4096, 4, "sha256:a"), 100)},
			load: map[string]Load{"w1": {StartingMiB: 64}}, req: req, wantErr: "most free: 36 MiB on worker w1, after the sandboxes starting there"},
		{name: "measured free memory enough", workers: []model.Worker{free(w("w1", fresh, 4096, 4, "sha256:a"), 64)}, req: req, want: "w1"},
		{name: "small sandbox needs only its limit", workers: []model.Worker{free(w("w1", fresh, 4096, 4, "sha256:a"), 32)},
			req: Request{Runtime: "gvisor", TemplateDigest: "sha256:a", Resources: model.Resources{VCPUs: 1, MemoryMiB: 32}}, want: "w1"},
		{name: "measured memory skips a worker", workers: []model.Worker{
			free(w("w1", fresh, 8192, 4, "sha256:a"), 10), free(w("w2", fresh, 4096, 4, "sha256:a"), 2048),
		}, req: req, want: "w2"},
		{name: "capacity is checked before measured memory", workers: []model.Worker{free(w("w1", fresh, 256, 4, "sha256:a"), 10)}, req: req,
			wantErr: "no worker has capacity for 512 MiB"},
		{name: "cordoned worker skipped", workers: []model.Worker{
			cordon(w("w1", fresh, 16384, 4, "sha256:a")), w("w2", fresh, 4096, 4, "sha256:a"),
		}, req: req, want: "w2"},
		{name: "all cordoned", workers: []model.Worker{cordon(w("w1", fresh, 16384, 4, "sha256:a")), w("w2", stale, 4096, 4, "sha256:a")}, req: req,
			wantErr: "no live worker takes new sandboxes: all 1 are cordoned"},
		{name: "heartbeat exactly ttl old is fresh", workers: []model.Worker{w("w1", now.Add(-ttl), 1024, 2, "sha256:a")}, req: req, want: "w1"},
		{name: "most free memory wins", workers: []model.Worker{
			w("w1", fresh, 4096, 4, "sha256:a"), w("w2", fresh, 8192, 4, "sha256:a"), w("w3", fresh, 16384, 4, "sha256:b"),
		}, req: req, want: "w2"},
		{name: "load counts", workers: []model.Worker{
			w("w1", fresh, 4096, 4, "sha256:a"), w("w2", fresh, 8192, 4, "sha256:a"),
		}, load: map[string]Load{"w2": {MemoryMiB: 6000}}, req: req, want: "w1"},
		{name: "tie broken by vcpus then id", workers: []model.Worker{
			w("w3", fresh, 4096, 4, "sha256:a"), w("w2", fresh, 4096, 8, "sha256:a"), w("w1", fresh, 4096, 8, "sha256:a"),
		}, req: req, want: "w1"},
		{name: "stale worker skipped even if bigger", workers: []model.Worker{
			w("w1", fresh, 1024, 4, "sha256:a"), w("w2", stale, 65536, 64, "sha256:a"),
		}, req: req, want: "w1"},
		{name: "runtime without the power", workers: []model.Worker{vm("w1", 4096)}, req: vmSnapReq,
			wantErr: `no live worker's runtime "vm" can snapshot sandboxes and start sandboxes from a snapshot`},
		{name: "runtime with the power", workers: []model.Worker{vm("w1", 4096)}, req: snapReq, want: "w1"},
		{name: "capable worker wins over a bigger incapable one", workers: []model.Worker{
			vm("w1", 65536), {ID: "w2", LastHeartbeat: fresh, Runtimes: []model.RuntimeInfo{{Name: "vm", Caps: snapCaps}}, Templates: []string{"sha256:a"}, CapacityMiB: 1024, CapacityVCPUs: 1},
		}, req: vmSnapReq, want: "w2"},
		{name: "no needs: any runtime of the name", workers: []model.Worker{vm("w1", 4096)}, req: Request{Runtime: "vm", TemplateDigest: "sha256:a"}, want: "w1"},
		{name: "legacy worker (names only) keeps its powers", workers: []model.Worker{
			{ID: "w1", LastHeartbeat: fresh, Runtimes: model.NamedRuntimes("gvisor", "qemu"), Templates: []string{"sha256:a"}, CapacityMiB: 4096, CapacityVCPUs: 4},
		}, req: snapReq, want: "w1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Pick(tt.workers, tt.load, tt.req, now, ttl)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("Pick = %q, want error containing %q", got, tt.wantErr)
				}
				if !errors.Is(err, model.ErrUnavailable) {
					t.Errorf("error %v does not wrap model.ErrUnavailable", err)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("error %q does not contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Pick: %v", err)
			}
			if got != tt.want {
				t.Errorf("Pick = %q, want %q", got, tt.want)
			}
		})
	}
}

// snapCaps can do everything but give a network device.
var snapCaps = model.RuntimeCaps{Pause: true, Snapshot: true, LeaveRunning: true, Fork: true}

// TestRequestFor: a sandbox that starts from a snapshot (fork, import)
// needs a runtime that restores snapshots under new ids; others need
// nothing beyond the runtime's name.
func TestRequestFor(t *testing.T) {
	sb := model.Sandbox{Runtime: "gvisor", TemplateDigest: "sha256:a", Resources: model.Resources{VCPUs: 1, MemoryMiB: 256}}
	if got := RequestFor(sb); got.Needs != (model.RuntimeCaps{}) || got.Runtime != "gvisor" || got.TemplateDigest != "sha256:a" || got.Resources != sb.Resources {
		t.Errorf("RequestFor(create) = %+v", got)
	}
	sb.Source = &model.Source{WorkerID: "w1", SandboxID: "sb-1", Checkpoint: "c"}
	if got := RequestFor(sb); got.Needs != (model.RuntimeCaps{Snapshot: true, Fork: true}) {
		t.Errorf("RequestFor(fork) needs %+v, want snapshot and fork", got.Needs)
	}
}

func TestLoadOf(t *testing.T) {
	r := model.Resources{VCPUs: 1, MemoryMiB: 256}
	sbs := []model.Sandbox{
		{ID: "a", WorkerID: "w1", State: model.StateRunning, Resources: r},
		{ID: "b", WorkerID: "w1", State: model.StateStarting, Resources: r},
		{ID: "c", WorkerID: "w1", State: model.StateDeleting, Resources: r},
		{ID: "d", WorkerID: "w1", State: model.StateFailed, Resources: r},  // freed
		{ID: "e", WorkerID: "w1", State: model.StateDeleted, Resources: r}, // freed
		{ID: "f", WorkerID: "w2", State: model.StateRunning, Resources: r},
		{ID: "g", State: model.StatePending, Resources: r},                   // not placed
		{ID: "h", WorkerID: "w2", State: model.StatePaused, Resources: r},    // memory, no CPU
		{ID: "i", WorkerID: "w2", State: model.StateSuspended, Resources: r}, // released
		{ID: "j", WorkerID: "w2", State: model.StateWaking, Resources: model.Resources{VCPUs: 2, MemoryMiB: 32}},
	}
	got := LoadOf(sbs)
	want := map[string]Load{
		"w1": {MemoryMiB: 768, VCPUs: 3, StartingMiB: StartFootprintMiB}, // b is starting
		"w2": {MemoryMiB: 256 + 256 + 32, VCPUs: 1 + 2, StartingMiB: 32}, // j's whole 32 MiB
	}
	if len(got) != len(want) {
		t.Fatalf("LoadOf = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("LoadOf[%s] = %v, want %v", k, got[k], v)
		}
	}
}

// TestDefaultPlacer: Default places as Pick does, with its own heartbeat
// window (0: DefaultHeartbeatTTL).
func TestDefaultPlacer(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	req := Request{Runtime: "gvisor", TemplateDigest: "sha256:a", Resources: model.Resources{VCPUs: 1, MemoryMiB: 512}}
	w := func(id string, age time.Duration, mem int) model.Worker {
		return model.Worker{ID: id, LastHeartbeat: now.Add(-age), Runtimes: []model.RuntimeInfo{{Name: "gvisor", Caps: snapCaps}}, Templates: []string{"sha256:a"}, CapacityMiB: mem, CapacityVCPUs: 4}
	}
	// w2 is bigger but 20 s silent: live for a 30 s window, not for the default 15 s.
	c := Cluster{Workers: []model.Worker{w("w1", time.Second, 2048), w("w2", 20*time.Second, 8192)}, Now: now}
	for _, tt := range []struct {
		ttl  time.Duration
		want string
	}{{0, "w1"}, {DefaultHeartbeatTTL, "w1"}, {30 * time.Second, "w2"}} {
		got, err := Default{HeartbeatTTL: tt.ttl}.Place(c, req)
		if err != nil || got != tt.want {
			t.Errorf("Default{%s}.Place = %q, %v; want %q", tt.ttl, got, err, tt.want)
		}
	}
	c.Load = map[string]Load{"w1": {MemoryMiB: 2048}}
	if _, err := (Default{}).Place(c, req); !errors.Is(err, model.ErrUnavailable) || !strings.Contains(err.Error(), "no worker has capacity") {
		t.Errorf("Place on a full worker = %v, want a capacity error", err)
	}
}

func TestReady(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	ttl := 15 * time.Second
	w := func(age time.Duration, templates ...string) model.Worker {
		return model.Worker{ID: "w", LastHeartbeat: now.Add(-age), Templates: templates}
	}
	for _, tt := range []struct {
		name    string
		workers []model.Worker
		wantErr string // empty: ready
	}{
		{"none", nil, "no worker has registered"},
		{"silent", []model.Worker{w(time.Minute, "sha256:a")}, "no worker has sent a heartbeat in the last 15s (1 registered)"},
		{"never", []model.Worker{{ID: "w", Templates: []string{"sha256:a"}}}, "no worker has sent a heartbeat"},
		{"no template", []model.Worker{w(time.Second)}, "no live worker has a template yet (1 live)"},
		{"ready", []model.Worker{w(time.Minute, "sha256:a"), w(ttl, "sha256:a")}, ""},
	} {
		err := Ready(tt.workers, now, ttl)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%s: Ready = %v, want nil", tt.name, err)
		case tt.wantErr != "" && (!errors.Is(err, model.ErrUnavailable) || err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%s: Ready = %v, want ErrUnavailable with %q", tt.name, err, tt.wantErr)
		}
	}
}

// TestPlacementPolicies: spread picks the worker with the most free
// capacity, pack the one with the least that still fits; both skip a
// worker without room.
func TestPlacementPolicies(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	req := Request{Runtime: "gvisor", TemplateDigest: "sha256:a", Resources: model.Resources{VCPUs: 1, MemoryMiB: 512}}
	w := func(id string, mem int) model.Worker {
		return model.Worker{ID: id, LastHeartbeat: now, Runtimes: []model.RuntimeInfo{{Name: "gvisor", Caps: snapCaps}}, Templates: []string{"sha256:a"}, CapacityMiB: mem, CapacityVCPUs: 4}
	}
	c := Cluster{Workers: []model.Worker{w("big", 8192), w("mid", 4096), w("small", 2048), w("full", 1024)}, Now: now,
		Load: map[string]Load{"mid": {MemoryMiB: 1024}, "full": {MemoryMiB: 1024}}}
	for _, tt := range []struct {
		policy Policy
		want   string
	}{{"", "big"}, {Spread, "big"}, {Pack, "small"}} {
		if got, err := (Default{Policy: tt.policy}).Place(c, req); err != nil || got != tt.want {
			t.Errorf("policy %q: %q %v, want %q", tt.policy, got, err, tt.want)
		}
	}
	for _, name := range []string{"", "spread", "pack"} {
		if _, err := ParsePolicy(name); err != nil {
			t.Errorf("ParsePolicy(%q): %v", name, err)
		}
	}
	if _, err := ParsePolicy("random"); !errors.Is(err, model.ErrInvalid) {
		t.Errorf("ParsePolicy(random): %v, want ErrInvalid", err)
	}
}
