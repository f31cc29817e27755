package api_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/model"
)

// TestTemplateGetAndDelete: GET /v1/templates/{ref} by name, name:tag and
// digest (with config and holding workers; a digest no tag points at any
// more while a worker holds it); DELETE is operators' only, refused for
// base and while a sandbox or a warm pool uses the template (naming them),
// and otherwise removes every name of the content and records the
// deletion.
func TestTemplateGetAndDelete(t *testing.T) {
	e := newEnv(t)
	base := e.srv.URL
	pyDigest := "sha256:" + strings.Repeat("2", 64)
	oldDigest := "sha256:" + strings.Repeat("3", 64) // py's content before its tag moved
	cfg := &model.TemplateConfig{Env: []string{"PATH=/opt/py/bin:/usr/bin"}, WorkingDir: "/srv", User: "app", Cmd: []string{"python3"}}
	now := time.Now().UTC()
	if err := e.st.PutTemplate(e.ctx, model.Template{Name: "py", Tag: "3", Digest: pyDigest, SizeBytes: 77, CreatedAt: now, Config: cfg}); err != nil {
		t.Fatal(err)
	}
	if err := e.st.UpsertWorker(e.ctx, model.Worker{ID: "w1", DataPlaneURL: "http://127.0.0.1:1", Runtimes: model.NamedRuntimes("gvisor"),
		Templates: []string{baseDigest, pyDigest, oldDigest}, CapacityMiB: 8192, CapacityVCPUs: 8, LastHeartbeat: now, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := e.st.UpsertWorker(e.ctx, model.Worker{ID: "w2", DataPlaneURL: "http://127.0.0.1:2", Runtimes: model.NamedRuntimes("gvisor"),
		Templates: []string{baseDigest}, CapacityMiB: 8192, CapacityVCPUs: 8, LastHeartbeat: now, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}

	// GET, by every form of reference, with any key.
	user, _ := e.orgClient("acme", false)
	for _, ref := range []string{"py:3", pyDigest} {
		got, err := user.GetTemplate(e.ctx, ref)
		if err != nil {
			t.Fatalf("GET %s: %v", ref, err)
		}
		if got.Name != "py" || got.Tag != "3" || got.Digest != pyDigest || got.SizeBytes != 77 || !slices.Equal(got.Workers, []string{"w1"}) {
			t.Errorf("GET %s = %+v", ref, got)
		}
		if got.Config == nil || got.Config.User != "app" || got.Config.WorkingDir != "/srv" || !slices.Equal(got.Config.Env, cfg.Env) {
			t.Errorf("GET %s config = %+v, want %+v", ref, got.Config, cfg)
		}
	}
	got, err := e.admin.GetTemplate(e.ctx, "base")
	if err != nil || got.Digest != baseDigest || !slices.Equal(got.Workers, []string{"w1", "w2"}) || got.Config != nil {
		t.Errorf("GET base = %+v, %v", got, err)
	}
	got, err = e.admin.GetTemplate(e.ctx, oldDigest)
	if err != nil || got.Name != "" || got.Digest != oldDigest || !slices.Equal(got.Workers, []string{"w1"}) {
		t.Errorf("GET of untagged content = %+v, %v", got, err)
	}
	for _, ref := range []string{"nope", "py:2", "sha256:" + strings.Repeat("9", 64)} {
		if st, _, eb := raw(t, "GET", base+"/v1/templates/"+ref, e.adminKey, ""); st != 404 || !strings.Contains(eb.Message, "not found") {
			t.Errorf("GET %s: %d %q, want 404", ref, st, eb.Message)
		}
	}
	if st, _, _ := raw(t, "GET", base+"/v1/templates/py:3", "", ""); st != 401 {
		t.Errorf("GET without a key: %d, want 401", st)
	}

	// DELETE: operators only (an admin of another org is not one).
	orgAdmin, _ := e.orgClient("other", true)
	for name, c := range map[string]*client.Client{"a member key": user, "another org's admin key": orgAdmin} {
		_, err := c.DeleteTemplate(e.ctx, "py:3")
		if st, _ := apiStatus(t, err); st != 403 || !strings.Contains(err.Error(), "admin key") {
			t.Errorf("DELETE with %s: %d %v, want 403", name, st, err)
		}
	}
	for _, ref := range []string{"base", "base:latest", baseDigest} {
		st, _, eb := raw(t, "DELETE", base+"/v1/templates/"+ref, e.adminKey, "")
		if st != 409 || !strings.Contains(eb.Message, "built-in base") {
			t.Errorf("DELETE %s: %d %q, want 409 for the built-in template", ref, st, eb.Message)
		}
	}
	if st, _, _ := raw(t, "DELETE", base+"/v1/templates/nope", e.adminKey, ""); st != 404 {
		t.Errorf("DELETE nope: %d, want 404", st)
	}

	// In use: a sandbox of another org, then a warm pool.
	sb, _, err := user.CreateSandbox(e.ctx, client.CreateSandboxRequest{Template: "py:3"}, "")
	if err != nil {
		t.Fatal(err)
	}
	st, _, eb := raw(t, "DELETE", base+"/v1/templates/py:3", e.adminKey, "")
	if st != 409 || !strings.Contains(eb.Message, "sandbox "+sb.ID) || !strings.Contains(eb.Message, "in use") {
		t.Fatalf("DELETE of a template a sandbox uses: %d %q, want 409 naming %s", st, eb.Message, sb.ID)
	}
	if _, err := e.admin.GetTemplate(e.ctx, "py:3"); err != nil {
		t.Fatalf("the refused delete removed the template: %v", err)
	}
	cur, err := e.st.GetSandbox(e.ctx, sb.ID) // the controller finishes a delete
	if err != nil {
		t.Fatal(err)
	}
	cur.State, cur.DesiredState = model.StateDeleted, model.StateDeleted
	if _, err := e.st.UpdateSandbox(e.ctx, cur); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.SetPool(e.ctx, "py:3", client.SetPoolRequest{Size: 1}); err != nil {
		t.Fatal(err)
	}
	st, _, eb = raw(t, "DELETE", base+"/v1/templates/"+pyDigest, e.adminKey, "")
	if st != 409 || !strings.Contains(eb.Message, "warm pool py:3") || strings.Contains(eb.Message, sb.ID) {
		t.Fatalf("DELETE of a pooled template: %d %q, want 409 naming the pool only", st, eb.Message)
	}
	if err := e.admin.DeletePool(e.ctx, "py:3"); err != nil {
		t.Fatal(err)
	}

	// Unused: deleted, with every name of the content.
	if err := e.st.PutTemplate(e.ctx, model.Template{Name: "python", Tag: "latest", Digest: pyDigest, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	kicks := e.kicks.Load()
	del, err := e.admin.DeleteTemplate(e.ctx, "py:3")
	if err != nil {
		t.Fatalf("DELETE py:3: %v", err)
	}
	if del.Digest != pyDigest || !slices.Equal(del.Workers, []string{"w1"}) || e.kicks.Load() == kicks {
		t.Errorf("DELETE answered %+v (kicked %v), want py's digest on w1", del, e.kicks.Load() != kicks)
	}
	for _, ref := range []string{"py:3", "python", pyDigest} {
		if _, err := e.admin.GetTemplate(e.ctx, ref); err == nil {
			t.Errorf("GET %s after the delete: found", ref)
		} else if st, _ := apiStatus(t, err); st != 404 {
			t.Errorf("GET %s after the delete: %v, want 404", ref, err)
		}
	}
	ts, err := e.admin.ListTemplates(e.ctx)
	if err != nil || len(ts) != 1 || ts[0].Name != "base" {
		t.Errorf("templates after the delete: %+v %v, want only base", ts, err)
	}
	if _, _, err := user.CreateSandbox(e.ctx, client.CreateSandboxRequest{Template: "py:3"}, ""); err == nil {
		t.Error("a sandbox was created from a deleted template")
	}
	dels, err := e.st.ListTemplateDeletions(e.ctx)
	if _, ok := dels[pyDigest]; err != nil || !ok {
		t.Errorf("deletions = %v %v, want %s recorded", dels, err, pyDigest)
	}
	// Content no tag points at, by digest.
	if _, err := e.admin.DeleteTemplate(e.ctx, oldDigest); err != nil {
		t.Errorf("DELETE of untagged content: %v", err)
	}
	if _, err := e.admin.GetTemplate(e.ctx, oldDigest); err == nil {
		t.Error("GET of deleted untagged content: found")
	}
}
