package worker

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/controller"
	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/image"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/snapshot"
	"github.com/airlock/airlock/internal/store/sqlite"
)

// addCatalogTemplate puts a small template into dir's catalog, as an
// import does, and returns it.
func addCatalogTemplate(t *testing.T, dir, name, fill string, created time.Time) model.Template {
	t.Helper()
	build, err := os.MkdirTemp(filepath.Join(dir, "templates"), ".import-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(build, "rootfs", "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(build, "rootfs", "etc", "hostname"), []byte(name+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tpl := model.Template{Name: name, Tag: "latest", Digest: "sha256:" + strings.Repeat(fill, 64), SizeBytes: 4096, CreatedAt: created.UTC()}
	if err := image.AddTemplate(dir, build, tpl); err != nil {
		t.Fatal(err)
	}
	return tpl
}

// waitUntil polls cond until it holds or ctx ends (then it fails with what).
func waitUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting until %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestDeletedTemplateLeavesTheWorker: the real controller and service over
// SQLite and a real worker on a real data directory. DELETE of a template
// (service.DeleteTemplate) makes the worker remove its catalog entry, its
// ext4 image and its template images, and report it gone; the other
// template stays. A later import of the same content is a new template:
// the worker keeps it and the server lists it again.
func TestDeletedTemplateLeavesTheWorker(t *testing.T) {
	ctx := testContext(t)
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ev := events.New(st)
	ctrl := controller.New(controller.Config{Store: st, Events: ev, WorkerToken: testJoinToken, Logger: testLogger()})
	srv := httptest.NewServer(ctrl.Handler())
	t.Cleanup(srv.Close)
	svc := service.New(service.Config{Store: st, Events: ev, Kick: ctrl.Kick})
	secret, _, err := svc.Bootstrap(ctx)
	if err != nil {
		t.Fatal(err)
	}
	op, err := svc.Authenticate(ctx, secret)
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "templates"), 0o755); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	keep := addCatalogTemplate(t, dir, "base", "a", old)
	gone := addCatalogTemplate(t, dir, "app", "b", old)
	goneHex := strings.TrimPrefix(gone.Digest, "sha256:")
	// Its QEMU image and a template image of it, as the worker makes them.
	ext4 := filepath.Join(dir, "images", goneHex+".ext4")
	if err := os.MkdirAll(filepath.Dir(ext4), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{ext4, ext4 + ".done", filepath.Join(dir, "images", strings.Repeat("a", 64)+".ext4")} {
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	snaps, err := snapshot.Open(filepath.Join(dir, "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	imgKey := templateSnapshotPrefix + goneHex[:24] + "-gvisor-1x512"
	keepKey := templateSnapshotPrefix + strings.Repeat("a", 24) + "-gvisor-1x512"
	for _, key := range []string{imgKey, keepKey} {
		p, err := snaps.Begin(key)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p.Dir(), "state"), []byte("s"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Commit(snapshot.Meta{Kind: snapshot.KindTemplate, Runtime: "gvisor", TemplateDigest: "sha256:" + key[4:28], VCPUs: 1, MemoryMiB: 512}); err != nil {
			t.Fatal(err)
		}
	}

	w, err := New(Config{
		ID: "w-tpl", ServerURL: srv.URL, WorkerToken: testJoinToken, SecretFile: filepath.Join(dir, "worker.secret"),
		DataPlaneAddr: "127.0.0.1:0", Driver: &hostDriver{dir: t.TempDir(), boxes: map[string]*hostBox{}},
		Snapshots: snaps,
		Templates: func() ([]model.Template, error) { return image.ListTemplates(dir) },
		RootFS:    func(d string) string { return image.TemplateRootFS(dir, d) },
		RemoveTemplate: func(d string, notAfter time.Time) (bool, error) {
			return image.RemoveTemplate(dir, d, notAfter)
		},
		Logger: testLogger(), CapacityMiB: 1024, CapacityVCPUs: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })

	holds := func(d string) bool {
		wk, err := st.GetWorker(ctx, "w-tpl")
		return err == nil && slices.Contains(wk.Templates, d)
	}
	waitUntil(t, ctx, "the worker reports both templates", func() bool { return holds(keep.Digest) && holds(gone.Digest) })

	got, err := svc.GetTemplate(ctx, op, "app")
	if err != nil || got.Digest != gone.Digest || !slices.Equal(got.Workers, []string{"w-tpl"}) {
		t.Fatalf("GET app = %+v, %v; want %s on w-tpl", got, err, gone.Digest)
	}
	if _, err := svc.DeleteTemplate(ctx, op, "base"); !errors.Is(err, model.ErrConflict) {
		t.Fatalf("delete base: %v, want a conflict", err)
	}
	del, err := svc.DeleteTemplate(ctx, op, "app:latest")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(del.Workers, []string{"w-tpl"}) {
		t.Errorf("delete answered workers %v, want [w-tpl]", del.Workers)
	}

	waitUntil(t, ctx, "the worker reports the deleted template gone", func() bool { return !holds(gone.Digest) })
	if _, err := os.Stat(filepath.Join(dir, "templates", goneHex)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the deleted template's directory: %v, want it gone", err)
	}
	for _, p := range []string{ext4, ext4 + ".done"} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v, want it gone", p, err)
		}
	}
	if ms, err := snaps.List(imgKey); err != nil || len(ms) != 0 {
		t.Errorf("template images of the deleted template: %v %v, want none", ms, err)
	}
	if ms, err := snaps.List(keepKey); err != nil || len(ms) != 1 {
		t.Errorf("template images of the kept template: %v %v, want one", ms, err)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "templates"))
	for _, e := range entries {
		if e.Name() != strings.TrimPrefix(keep.Digest, "sha256:") {
			t.Errorf("templates/ holds %s besides the kept template", e.Name())
		}
	}
	if _, err := os.Stat(image.TemplateRootFS(dir, keep.Digest)); err != nil {
		t.Errorf("the kept template: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "images", strings.Repeat("a", 64)+".ext4")); err != nil {
		t.Errorf("the kept template's image: %v", err)
	}
	if _, err := svc.GetTemplate(ctx, op, "app"); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("GET app after the delete: %v, want not found", err)
	}
	if _, err := svc.GetTemplate(ctx, op, gone.Digest); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("GET its digest after the delete: %v, want not found", err)
	}

	// The same content imported again, after the deletion: a new template.
	again := addCatalogTemplate(t, dir, "app", "b", time.Now().Add(time.Second))
	// The worker lists its catalog with the first Sync 10 s after the
	// last listing (up to a long poll later): hurry it.
	w.templatesGone.Store(true)
	w.kickSync()
	waitUntil(t, ctx, "the server lists the re-imported template", func() bool {
		got, err := svc.GetTemplate(ctx, op, "app")
		return err == nil && got.Digest == again.Digest && slices.Equal(got.Workers, []string{"w-tpl"})
	})
	if dels, err := st.ListTemplateDeletions(ctx); err != nil || len(dels) != 0 {
		t.Errorf("deletions after the re-import: %v %v, want none", dels, err)
	}
	if _, err := os.Stat(image.TemplateRootFS(dir, again.Digest)); err != nil {
		t.Errorf("the re-imported template: %v", err)
	}
}
