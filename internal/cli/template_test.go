package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
)

func TestRefName(t *testing.T) {
	for ref, want := range map[string]string{
		"alpine":                        "alpine:latest",
		"docker.io/library/alpine:3.20": "alpine:3.20",
		"localhost:5000/team/App:v1":    "app:v1",
		"registry.example:5000/app":     "app:latest",
		"app@sha256:0123":               "",
		"registry.example/":             "",
	} {
		got, ok := refName(ref)
		if got != want || ok != (want != "") {
			t.Errorf("refName(%q) = %q, %v; want %q", ref, got, ok, want)
		}
	}
}

// TestTemplateGetAndRemoveCommands: `template get` shows a template with
// its config and workers; `template rm` is refused (naming the sandbox)
// while a sandbox uses it, and for base; once the sandbox is deleted it
// deletes the template, which `template ls` no longer lists.
func TestTemplateGetAndRemoveCommands(t *testing.T) {
	e := newLifecycleEnv(t)
	py := model.Template{Name: "py", Tag: "3", Digest: "sha256:" + strings.Repeat("4", 64), SizeBytes: 3 << 20, CreatedAt: time.Now(),
		Config: &model.TemplateConfig{User: "app", WorkingDir: "/srv", Env: []string{"A=1", "B=2"}, Cmd: []string{"python3"}}}
	if err := e.st.PutTemplate(e.ctx, py); err != nil {
		t.Fatal(err)
	}
	out := e.mustRun("template", "get", "py:3")
	for _, want := range []string{"Name:", "py:3", py.Digest, "3.0 MiB", "User:", "app", "/srv", "A=1", "B=2", "Cmd:", "python3", "Workers:", "none"} {
		if !strings.Contains(out, want) {
			t.Errorf("template get lacks %q:\n%s", want, out)
		}
	}
	base := decodeJSON[apitypes.Template](t, e.mustRun("template", "get", "base", "--json"))
	if base.Digest != testDigest || len(base.Workers) != 1 || base.Workers[0] != "w1" {
		t.Errorf("template get base --json = %+v", base)
	}
	if code, _, errOut := e.run("template", "get", "nope"); code != ExitError || !strings.Contains(errOut, "not found") {
		t.Errorf("template get nope: exit %d %q", code, errOut)
	}
	if code, _, errOut := e.run("template", "rm", "base"); code != ExitError || !strings.Contains(errOut, "built-in base") {
		t.Errorf("template rm base: exit %d %q", code, errOut)
	}

	id := strings.TrimSpace(e.mustRun("sandbox", "create", "--template", "py:3", "--no-wait"))
	if code, _, errOut := e.run("template", "rm", "py:3"); code != ExitError || !strings.Contains(errOut, id) {
		t.Fatalf("template rm of a template in use: exit %d %q, want it to name %s", code, errOut, id)
	}
	org := decodeJSON[model.Org](t, e.mustRun("org", "create", "acme", "--json"))
	key := strings.TrimSpace(e.mustRun("key", "create", "--org", org.ID, "--admin"))
	if code, _, errOut := e.runKey(key, "template", "rm", "py:3"); code != ExitError || !strings.Contains(errOut, "admin key of the") {
		t.Fatalf("template rm by another org's admin: exit %d %q", code, errOut)
	}

	e.mustRun("sandbox", "rm", id)
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, out, errOut := e.run("template", "rm", "py:3")
		if code == 0 {
			if !strings.Contains(out, "deleted py:3 "+py.Digest) {
				t.Errorf("template rm output %q", out)
			}
			break
		}
		if !strings.Contains(errOut, id) || time.Now().After(deadline) {
			t.Fatalf("template rm after the sandbox's delete: exit %d %q", code, errOut)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if out := e.mustRun("template", "ls"); strings.Contains(out, "py") || !strings.Contains(out, "base") {
		t.Errorf("template ls after rm:\n%s", out)
	}
	if code, _, errOut := e.run("template", "get", "py:3"); code != ExitError || !strings.Contains(errOut, "not found") {
		t.Errorf("template get after rm: exit %d %q", code, errOut)
	}
}
