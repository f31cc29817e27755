package main

import (
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/airlock/airlock/internal/image"
	"github.com/airlock/airlock/internal/image/oci"
	"github.com/airlock/airlock/internal/image/oci/ocitest"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/testenv"
)

// `airlock template import` through the binary's own wiring: the CLI
// command, cmd/airlock's importer and the catalog.
func TestTemplateImportCommand(t *testing.T) {
	testenv.RequireRoot(t, "import keeps the image's file owners")
	work := t.TempDir()
	lay := filepath.Join(work, "layout")
	img := ocitest.Image(t, v1.Config{Env: []string{"GREETING=hi"}, WorkingDir: "/srv"},
		[]ocitest.Entry{ocitest.Dir("srv", 0o755), ocitest.File("srv/hello", "hello\n", 0o644)})
	ocitest.WriteLayout(t, img, lay)
	data := filepath.Join(work, "data")

	// No base template to take the agent from, and none given: refused.
	if code := run([]string{"template", "import", lay, "--name", "app:1.0", "--data-dir", data, "--no-wait"}); code == 0 {
		t.Fatal("import without an agent succeeded")
	}
	if ts, _ := image.ListTemplates(data); len(ts) != 0 {
		t.Fatalf("templates after a failed import: %v", ts)
	}

	// A base template in the catalog gives its agent.
	build := filepath.Join(data, "templates", ".build-test")
	agentDir := filepath.Join(build, "rootfs", "usr", "local", "bin")
	if err := os.MkdirAll(agentDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(agentDir, "airlock-agent"), []byte("\x7fELF base agent"), 0o755); err != nil {
		t.Fatal(err)
	}
	base := model.Template{Name: "base", Tag: "latest", Digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", CreatedAt: time.Now().UTC()}
	if err := image.AddTemplate(data, build, base); err != nil {
		t.Fatal(err)
	}
	if code := run([]string{"template", "import", lay, "--name", "app:1.0", "--data-dir", data, "--no-wait"}); code != 0 {
		t.Fatalf("import exited %d", code)
	}
	var got model.Template
	ts, err := image.ListTemplates(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range ts {
		if tp.Name == "app" && tp.Tag == "1.0" {
			got = tp
		}
	}
	if got.Digest == "" || got.Config == nil || got.Config.WorkingDir != "/srv" || len(got.Config.Env) != 1 {
		t.Fatalf("imported template = %+v (all: %+v)", got, ts)
	}
	b, err := os.ReadFile(filepath.Join(image.TemplateRootFS(data, got.Digest), oci.AgentPath))
	if err != nil || string(b) != "\x7fELF base agent" {
		t.Errorf("agent = %q, %v; want the base template's", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(image.TemplateRootFS(data, got.Digest), "srv/hello")); err != nil || string(b) != "hello\n" {
		t.Errorf("srv/hello = %q, %v", b, err)
	}

	// `template pull` from a registry (go-containerregistry's own, in
	// process): the name comes from the reference.
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	pushed := ocitest.Image(t, v1.Config{User: "1000:1000"}, []ocitest.Entry{ocitest.File("pulled", "yes", 0o644)})
	for ref, im := range map[string]v1.Image{host + "/team/pulled:2.0": pushed, host + "/team/same:1": img} {
		r, err := name.ParseReference(ref)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(r, im); err != nil {
			t.Fatal(err)
		}
	}
	if code := run([]string{"template", "pull", host + "/team/pulled:2.0", "--data-dir", data, "--no-wait"}); code != 0 {
		t.Fatalf("pull exited %d", code)
	}
	ts, err = image.ListTemplates(data)
	if err != nil {
		t.Fatal(err)
	}
	var pulled model.Template
	for _, tp := range ts {
		if tp.Name == "pulled" && tp.Tag == "2.0" {
			pulled = tp
		}
	}
	if pulled.Config == nil || pulled.Config.User != "1000:1000" {
		t.Fatalf("pulled template = %+v (all: %+v)", pulled, ts)
	}
	if b, err := os.ReadFile(filepath.Join(image.TemplateRootFS(data, pulled.Digest), "pulled")); err != nil || string(b) != "yes" {
		t.Errorf("pulled file = %q, %v", b, err)
	}
	// The content of app:1.0 under another name: refused (one name per
	// template for now).
	if code := run([]string{"template", "pull", host + "/team/same:1", "--data-dir", data, "--no-wait"}); code == 0 {
		t.Error("pulling app:1.0's image as same:1 succeeded")
	}
}
