package service_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/scheduler"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/snapshot"
)

// namedPlacer places on worker id whatever the others offer.
type namedPlacer struct {
	id      string
	mu      sync.Mutex
	offered []string
	called  bool
}

func (p *namedPlacer) Place(c scheduler.Cluster, _ scheduler.Request) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.called = true
	for _, w := range c.Workers {
		p.offered = append(p.offered, w.ID)
	}
	return p.id, nil
}

// TestImportPlacesThroughPlacer: an import sends its archive to the worker
// Service.Placer picks (the server injects the controller's placer), not
// to the one the default placement would take.
func TestImportPlacesThroughPlacer(t *testing.T) {
	s := signedService(t, model.FeatureSnapshots)
	var mu sync.Mutex
	var hit []string
	worker := func(id string) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			hit = append(hit, id)
			mu.Unlock()
			w.WriteHeader(http.StatusCreated)
			json.NewEncoder(w).Encode(snapshot.Manifest{ID: "snap-" + id, Name: "c1", Bytes: 1})
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	now := time.Now().UTC()
	for _, w := range []struct {
		id  string
		mem int
	}{{"w-big", 65536}, {"w-small", 1024}} {
		if err := s.TestStore().UpsertWorker(t.Context(), model.Worker{
			ID: w.id, DataPlaneURL: worker(w.id).URL, Runtimes: model.NamedRuntimes("gvisor"), Templates: []string{tplDigest},
			CapacityMiB: w.mem, CapacityVCPUs: 4, LastHeartbeat: now, CreatedAt: now,
		}); err != nil {
			t.Fatal(err)
		}
	}
	archive := func() *bytes.Reader { return bytes.NewReader(checkpointArchive(t, goodMeta, nil, exportKey)) }

	// The default placement takes the worker with the most free memory.
	sb, _, err := s.ImportSandbox(t.Context(), operator, service.CreateParams{}, archive(), "")
	if err != nil || sb.Source == nil || sb.Source.WorkerID != "w-big" {
		t.Fatalf("import with the default placer: %+v, %v; want it on w-big", sb.Source, err)
	}
	p := &namedPlacer{id: "w-small"}
	s = s.TestWith(func(c *service.Config) { c.Placer = p })
	sb, _, err = s.ImportSandbox(t.Context(), operator, service.CreateParams{}, archive(), "")
	if err != nil {
		t.Fatalf("import with a custom placer: %v", err)
	}
	if sb.Source == nil || sb.Source.WorkerID != "w-small" || sb.Source.SnapshotID != "snap-w-small" {
		t.Fatalf("imported sandbox's source = %+v, want the snapshot on w-small", sb.Source)
	}
	slices.Sort(p.offered)
	if !p.called || strings.Join(p.offered, ",") != "w-big,w-small" {
		t.Fatalf("placer offered %v, want both workers", p.offered)
	}
	if got := strings.Join(hit, ","); got != "w-big,w-small" {
		t.Fatalf("archives went to %s, want w-big then w-small", got)
	}
}
