package controller

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/workerapi"
)

// TestTemplateDeletionReachesWorkers: a recorded template deletion is in
// the sync answer of each worker that reported the digest (and changes the
// assignment version), not of others; a worker registering again with a
// copy made before the deletion does not bring the template back; once
// the worker reports its catalog without it, the removal is no longer
// asked; a copy made after the deletion is a new import that clears it.
func TestTemplateDeletionReachesWorkers(t *testing.T) {
	e := newEnv(t)
	now := e.clock.Now()
	app := model.Template{Name: "app", Tag: "1", Digest: "sha256:" + strings.Repeat("a", 64), SizeBytes: 5, CreatedAt: now.Add(-time.Hour)}
	w1, w2 := e.worker("w1"), e.worker("w2")
	w1.register(baseTemplate, app)
	w2.register(baseTemplate)
	before := w1.sync(-1, 0)
	if len(before.RemoveTemplates) != 0 {
		t.Fatalf("removals before any deletion: %+v", before.RemoveTemplates)
	}

	at := now.Add(-time.Minute)
	if err := e.st.DeleteTemplate(e.ctx, app.Digest, at); err != nil {
		t.Fatal(err)
	}
	resp := w1.sync(-1, 0)
	if len(resp.RemoveTemplates) != 1 || resp.RemoveTemplates[0].Digest != app.Digest || !resp.RemoveTemplates[0].DeletedAt.Equal(at) {
		t.Fatalf("w1 removals = %+v, want %s deleted at %s", resp.RemoveTemplates, app.Digest, at)
	}
	if resp.Version == before.Version {
		t.Error("the assignment version did not change with the removal")
	}
	if r := w2.sync(-1, 0); len(r.RemoveTemplates) != 0 {
		t.Errorf("w2 (without the template) removals = %+v", r.RemoveTemplates)
	}

	// A restart before the removal reports the old copy again: still deleted.
	w1.register(baseTemplate, app)
	if _, err := e.st.GetTemplateByDigest(e.ctx, app.Digest); !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("the deleted template is back after a re-registration: %v", err)
	}

	// The worker removed it and reports its catalog without it.
	ctx := e.ctx
	if _, err := w1.client().Sync(ctx, "w1", workerapi.SyncRequest{Observed: []workerapi.Observed{}, Templates: []model.Template{baseTemplate}}, 0, -1); err != nil {
		t.Fatal(err)
	}
	if r := w1.sync(-1, 0); len(r.RemoveTemplates) != 0 {
		t.Errorf("removals after the worker reported it gone: %+v", r.RemoveTemplates)
	}

	// Imported again after the deletion: a new template.
	again := app
	again.CreatedAt = now
	if _, err := w1.client().Sync(ctx, "w1", workerapi.SyncRequest{Observed: []workerapi.Observed{}, Templates: []model.Template{baseTemplate, again}}, 0, -1); err != nil {
		t.Fatal(err)
	}
	got, err := e.st.GetTemplate(ctx, "app", "1")
	if err != nil || got.Digest != app.Digest {
		t.Fatalf("the re-imported template: %+v %v", got, err)
	}
	if dels, err := e.st.ListTemplateDeletions(ctx); err != nil || len(dels) != 0 {
		t.Errorf("deletions after the re-import: %v %v", dels, err)
	}
	if r := w1.sync(-1, 0); len(r.RemoveTemplates) != 0 {
		t.Errorf("removals after the re-import: %+v", r.RemoveTemplates)
	}
}

// TestTemplateGC: content whose tag moved to newer content, which nothing
// uses, is collected (recorded as deleted, with the grace before now, and
// asked of the worker holding it); tagged content, content a sandbox uses
// and content already deleted are not.
func TestTemplateGC(t *testing.T) {
	e := newEnv(t)
	now := e.clock.Now()
	tm := func(name, c string, age time.Duration) model.Template {
		return model.Template{Name: name, Tag: "1", Digest: "sha256:" + strings.Repeat(c, 64), SizeBytes: 1, CreatedAt: now.Add(-age)}
	}
	appOld, appNew := tm("app", "a", 2*time.Hour), tm("app", "b", time.Hour)
	usedOld, usedNew := tm("used", "c", 2*time.Hour), tm("used", "d", time.Hour)
	w1, w2 := e.worker("w1"), e.worker("w2")
	w1.register(baseTemplate, appOld, appNew)
	w2.register(baseTemplate, usedOld, usedNew)
	if got, err := e.st.GetTemplate(e.ctx, "app", "1"); err != nil || got.Digest != appNew.Digest {
		t.Fatalf("app:1 = %+v, %v; want the newer content", got, err)
	}
	sb, _ := e.createSandbox("sb-uses-old", 256)
	sb.TemplateDigest = usedOld.Digest
	if _, err := e.st.UpdateSandbox(e.ctx, sb); err != nil {
		t.Fatal(err)
	}

	got, err := e.c.collectTemplates(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != appOld.Digest {
		t.Fatalf("collected %v, want only %s (untagged, unused)", got, appOld.Digest)
	}
	dels, _ := e.st.ListTemplateDeletions(e.ctx)
	if at := dels[appOld.Digest]; !at.Equal(now.Add(-TemplateGCGrace)) {
		t.Errorf("deletion of %s recorded at %v, want now minus the grace", appOld.Digest, at)
	}
	for _, d := range []string{baseTemplate.Digest, appNew.Digest, usedOld.Digest, usedNew.Digest} {
		if _, ok := dels[d]; ok {
			t.Errorf("%s was collected", d)
		}
	}
	resp := w1.sync(-1, 0)
	if len(resp.RemoveTemplates) != 1 || resp.RemoveTemplates[0].Digest != appOld.Digest {
		t.Errorf("w1 is asked to remove %+v, want %s", resp.RemoveTemplates, appOld.Digest)
	}
	if again, _ := e.c.collectTemplates(e.ctx); len(again) != 0 {
		t.Errorf("a second round collected %v again", again)
	}
}
