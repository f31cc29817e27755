package oci

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/airlock/airlock/internal/model"
)

// Pull from a real registry server (go-containerregistry's, in process on
// loopback): a single image and a multi-platform index give the same
// template as importing the image's layout.
func TestPull(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	agent := fakeAgent(t)
	work := workDir(t)

	img := testImage(t)
	lay := filepath.Join(work, "layout")
	writeLayout(t, img, lay)
	want, err := Import(context.Background(), filepath.Join(work, "want"), lay, importOpts(t, agent, "app:1.0"))
	if err != nil {
		t.Fatal(err)
	}

	push := func(ref string, write func(name.Reference) error) string {
		t.Helper()
		r, err := name.ParseReference(host + "/" + ref)
		if err != nil {
			t.Fatal(err)
		}
		if err := write(r); err != nil {
			t.Fatalf("push %s: %v", r, err)
		}
		return r.String()
	}
	single := push("team/app:1.0", func(r name.Reference) error { return remote.Write(r, img) })
	// An index with this platform's image and another architecture's.
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.Architecture = "s390x"
	other, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: other, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "s390x"}}},
		mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: cfArch(t, img)}}},
	)
	multi := push("team/multi:2", func(r name.Reference) error { return remote.WriteIndex(r, idx) })

	for i, ref := range []string{single, multi} {
		rep, err := Pull(context.Background(), filepath.Join(work, "data", string(rune('a'+i))), ref, importOpts(t, agent, "app:1.0"), PullOptions{})
		if err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
		if rep.Template.Digest != want.Template.Digest || rep.Source != "registry" {
			t.Errorf("pull %s: %s from %s; want %s, as imported from the layout", ref, rep.Template.Digest, rep.Source, want.Template.Digest)
		}
	}
	if _, err := Pull(context.Background(), filepath.Join(work, "data", "x"), host+"/team/missing:1", importOpts(t, agent, "x"), PullOptions{}); err == nil {
		t.Error("pull of a missing image succeeded")
	}
	if _, err := Pull(context.Background(), filepath.Join(work, "data", "x"), "Not A Ref", importOpts(t, agent, "x"), PullOptions{}); !errors.Is(err, model.ErrInvalid) {
		t.Errorf("pull of a bad reference: %v", err)
	}
}

func cfArch(t *testing.T, img v1.Image) string {
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	return cf.Architecture
}
