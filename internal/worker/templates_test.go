package worker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/snapshot"
	"github.com/airlock/airlock/internal/token"
)

// TestTemplateImagesGVisor: with template images on for gvisor, the first
// sandbox of the template boots and an image is built in the background
// (its builder leaves no runtime behind); the next sandbox is restored
// from the image under its own id and hostname, reports started_from
// template_image, and is independent of the first.
func TestTemplateImagesGVisor(t *testing.T) {
	e := newGVisorEnvWith(t, nil, func(c *Config) { c.TemplateImages = map[string]bool{"gvisor": true} })
	ctx := testContext(t)
	if o := e.srv.waitObserved(ctx, e.id, model.StateRunning); o.StartedFrom != model.StartedBoot {
		t.Fatalf("first sandbox started from %q, want boot", o.StartedFrom)
	}
	// Wait for the image.
	var image snapshot.Manifest
	for image.ID == "" {
		ids, err := e.snaps.Sandboxes()
		if err != nil {
			t.Fatal(err)
		}
		for id := range ids {
			if strings.HasPrefix(id, templateSnapshotPrefix) {
				ms, _ := e.snaps.List(id)
				for _, m := range ms {
					if m.Kind == snapshot.KindTemplate && m.TemplateDigest == e.tmpl.Digest {
						image = m
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatal("no template image built")
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Logf("template image %s: %d bytes", image.ID, image.Bytes)
	// The builder is gone.
	deadline := time.Now().Add(30 * time.Second)
	for {
		ids, err := e.newDriver().List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		builders := 0
		for _, id := range ids {
			if strings.HasPrefix(id, "tb-") {
				builders++
			}
		}
		if builders == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("image builder runtime left behind: %v", ids)
		}
		time.Sleep(100 * time.Millisecond)
	}

	id2 := newSandboxID()
	t.Cleanup(func() { _ = e.newDriver().Delete(context.Background(), id2) })
	t0 := time.Now()
	e.srv.assign(id2, e.tmpl.Digest, model.StateRunning)
	o := e.srv.waitObserved(ctx, id2, model.StateRunning)
	t.Logf("assigned → running from the image: %v", time.Since(t0))
	if o.StartedFrom != model.StartedTemplateImage {
		t.Fatalf("second sandbox started from %q, want template_image", o.StartedFrom)
	}
	run := func(id, cid string, argv ...string) string {
		t.Helper()
		tok := e.srv.sign(t, token.Claims{SandboxID: id, Scope: token.ScopeCommand,
			Command: &model.CommandSpec{ID: cid, SandboxID: id, Argv: argv}})
		var out, errb strings.Builder
		exit, err := client.RunCommand(ctx, sandboxURL(e.tw.w, id)+"/commands/"+cid+"/attach", tok, nil, &out, &errb)
		if err != nil || exit.ExitCode != 0 {
			t.Fatalf("run %v in %s: %v %+v %s", argv, id, err, exit, errb.String())
		}
		return out.String()
	}
	if h := strings.TrimSpace(run(id2, "c-host", "hostname")); h != id2 {
		t.Fatalf("hostname in the restored sandbox = %q, want %q", h, id2)
	}
	run(id2, "c-write", "sh", "-c", "echo second > /tmp/mine")
	if out := run(e.id, "c-read", "sh", "-c", "cat /tmp/mine 2>/dev/null || echo absent"); strings.TrimSpace(out) != "absent" {
		t.Fatalf("first sandbox sees the second's file: %q", out)
	}
	e.srv.assign(id2, e.tmpl.Digest, model.StateDeleted)
	e.srv.waitObserved(ctx, id2, model.StateDeleted)
	// The image outlives the sandboxes made from it.
	if _, _, err := e.snaps.Get(image.SandboxID, image.ID); err != nil {
		t.Fatalf("template image gone after a delete: %v", err)
	}
}
