package worker

// Template images: a template started once and checkpointed right after its
// agent answered. Where a runtime has one (Config.TemplateImages names the
// runtimes), a create without a warm-pool member restores the image under
// the new sandbox's id instead of booting the template; the first create of
// a (template, runtime, resources) combination boots as usual and builds the
// image in the background. Images live in the snapshot store under
// "tpl-<digest>-<runtime>-<vcpus>x<mib>" (kind template); a failed restore
// from an image falls back to a boot, and drops the image.
//
// Why opt-in per runtime: restoring is a win where booting is slow (QEMU
// boots a kernel: ~3 s under TCG against ~1 s for a restore), not where
// booting is a ~0.1 s process start (gVisor); `airlock bench --only
// template` measures both on a given machine. A template with a start or
// ready command (model.TemplateConfig) uses images on every runtime that
// can snapshot: the image holds the started process, ready, so a create
// skips the start-up (the code interpreter: ~4.5 s booted and started
// against ~0.3 s restored on gVisor here).

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/snapshot"
	"github.com/airlock/airlock/internal/workerapi"
)

// defaultDiskMiB is the disk size runtimes give a sandbox that names none
// (gvisor.DefaultDiskMiB, the qemu driver's default).
const defaultDiskMiB = 4096

// TemplateImageTimeout bounds building one template image.
const TemplateImageTimeout = 15 * time.Minute

// templateImageKey is the snapshot-store id of the image for s.
func templateImageKey(s workerapi.SandboxSpec, rt string) string {
	key := fmt.Sprintf("%s%s-%s-%dx%d", templateSnapshotPrefix, templateKeyDigest(s.TemplateDigest), rt, s.Resources.VCPUs, s.Resources.MemoryMiB)
	if d := s.Resources.DiskMiB; d != 0 && d != defaultDiskMiB {
		// The image holds the guest's disk (QEMU) or its overlay's size
		// limit (gVisor): sandboxes of another disk size need their own.
		// (The default size keeps the key images had before disk_mib.)
		key += fmt.Sprintf("x%d", d)
	}
	return key
}

// templateImage returns the committed image for s when its runtime uses
// images; without one it starts building it (once) and returns false. For
// a template with a start command it waits for that build and returns
// its image: booting beside the builder would start the template twice
// on the same cores (minutes each for a Jupyter kernel under TCG).
func (w *Worker) templateImage(ctx context.Context, s workerapi.SandboxSpec) (snapshot.Manifest, string, bool) {
	m, dir, ok, building := w.templateImageOrBuild(ctx, s)
	if ok || building == nil || !w.hasStartCommand(s.TemplateDigest) {
		return m, dir, ok
	}
	select {
	case <-building:
	case <-ctx.Done():
		return snapshot.Manifest{}, "", false
	}
	m, dir, ok, _ = w.templateImageOrBuild(ctx, s)
	return m, dir, ok
}

// templateImageOrBuild is templateImage without the wait: when there is no
// image it returns the channel closed when the build of it ends (nil: the
// runtime uses no images).
func (w *Worker) templateImageOrBuild(ctx context.Context, s workerapi.SandboxSpec) (snapshot.Manifest, string, bool, <-chan struct{}) {
	rt := s.Runtime
	if rt == "" {
		rt = w.cfg.Driver.Name()
	}
	if w.cfg.Snapshots == nil || w.cfg.TemplateImages[NoTemplateImages] || !(w.cfg.TemplateImages[rt] || w.hasStartCommand(s.TemplateDigest)) {
		return snapshot.Manifest{}, "", false, nil
	}
	if _, ok := w.cfg.Driver.(runtime.Snapshotter); !ok {
		return snapshot.Manifest{}, "", false, nil
	}
	key := templateImageKey(s, rt)
	if ms, err := w.cfg.Snapshots.List(key); err == nil {
		for _, m := range ms {
			if m.Kind == snapshot.KindTemplate && m.TemplateDigest == s.TemplateDigest {
				if _, dir, err := w.cfg.Snapshots.Get(key, m.ID); err == nil {
					return m, dir, true, nil
				}
			}
		}
	}
	w.mu.Lock()
	done, building := w.imageBuilds[key]
	if !building {
		if w.imageBuilds == nil {
			w.imageBuilds = map[string]chan struct{}{}
		}
		done = make(chan struct{})
		w.imageBuilds[key] = done
		w.actions.Add(1)
		go func() {
			defer w.actions.Done()
			err := w.buildTemplateImage(ctx, s, rt, key)
			if err != nil && ctx.Err() == nil {
				w.log.Warn("template image not built; creates boot the template", "template", s.Template, "runtime", rt, "err", err)
			}
			w.mu.Lock()
			delete(w.imageBuilds, key)
			w.mu.Unlock()
			close(done)
		}()
	}
	w.mu.Unlock()
	return snapshot.Manifest{}, "", false, done
}

// buildTemplateImage boots s's template under a throwaway id, waits for
// its agent, checkpoints it as the image key, and releases it.
func (w *Worker) buildTemplateImage(ctx context.Context, s workerapi.SandboxSpec, rt, key string) (err error) {
	snap := w.cfg.Driver.(runtime.Snapshotter)
	rootfs := w.cfg.RootFS(s.TemplateDigest)
	if rootfs == "" {
		return fmt.Errorf("template %s is not present", s.TemplateDigest)
	}
	ctx, cancel := context.WithTimeout(ctx, TemplateImageTimeout)
	defer cancel()
	t0 := time.Now()
	id := builderID()
	spec := runtime.Spec{ID: id, Runtime: rt, RootFS: rootfs, VCPUs: s.Resources.VCPUs, MemoryMiB: s.Resources.MemoryMiB, DiskMiB: s.Resources.DiskMiB, Hostname: id}
	defer func() {
		if derr := w.deleteRuntime(context.WithoutCancel(ctx), id); derr != nil {
			w.log.Warn("release template image builder", "id", id, "err", derr)
		}
	}()
	// The builder reaches nothing: a template image is the template, not
	// a sandbox.
	h, err := w.startRuntime(ctx, spec, noEgress)
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	ac := w.newAgentClient(h)
	err = ac.WaitReady(ctx)
	if err == nil {
		// The image holds the template's start command running, its
		// ready command passed: a restore skips both.
		err = w.runStartCommand(ctx, ac, s.TemplateDigest, nil)
	}
	ac.Close()
	h.Close()
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	m, err := w.writeSnapshot(ctx, snap, key, id, false, w.snapshotMeta(s, snapshot.KindTemplate, s.Template))
	if err != nil {
		return err
	}
	w.log.Info("template image built", "template", s.Template, "runtime", rt, "image", key, "bytes", m.Bytes, "took", time.Since(t0))
	return nil
}

// startFromImage restores s from template image m (in dir); on failure the
// image is dropped (the next create rebuilds it) and the caller boots.
func (w *Worker) startFromImage(ctx context.Context, s workerapi.SandboxSpec, m snapshot.Manifest, dir string) (runtime.Sandbox, *agentclient.Client, error) {
	h, ac, err := w.restoreFrom(ctx, s, m, dir, w.cfg.Driver.(runtime.Snapshotter))
	if err != nil {
		w.log.Warn("start from template image failed; booting instead", "sandbox", s.ID, "image", m.SandboxID, "err", err)
		if derr := w.cfg.Snapshots.Delete(m.SandboxID, m.ID); derr != nil {
			w.log.Warn("drop template image", "image", m.SandboxID, "err", derr)
		}
	}
	return h, ac, err
}

// builderID is a sandbox id for an image builder, as long as the server's
// ids ("sb-" and 26 characters; runsc matches ids by prefix).
func builderID() string { return model.NewID("tb") }

// removeTemplates acts on the server's deletions (SyncResponse.
// RemoveTemplates): each deleted template no local sandbox uses goes from
// the catalog (Config.RemoveTemplate: its tree and its ext4 image) and
// from the snapshot store (its template images), in the background; the
// next Sync reports the catalog without it. One still in use stays, and
// the server keeps asking.
func (w *Worker) removeTemplates(ctx context.Context, rs []workerapi.TemplateRemoval) {
	if len(rs) == 0 || w.cfg.RemoveTemplate == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	asked := make(map[string]bool, len(rs))
	for _, r := range rs {
		asked[r.Digest] = true
	}
	for d := range w.removedTemplates {
		if !asked[d] {
			delete(w.removedTemplates, d) // the server saw it gone
		}
	}
	for _, r := range rs {
		if w.removingTemplates[r.Digest] || w.removedTemplates[r.Digest] {
			continue // in progress, or done and not yet seen (a report of an empty catalog is none)
		}
		if user := w.templateUserLocked(r.Digest); user != "" {
			w.log.Debug("deleted template still in use here; kept for now", "template", r.Digest, "user", user)
			continue
		}
		if w.removingTemplates == nil {
			w.removingTemplates = map[string]bool{}
		}
		w.removingTemplates[r.Digest] = true
		w.actions.Add(1)
		go func() {
			defer w.actions.Done()
			err := w.removeTemplate(r)
			w.mu.Lock()
			delete(w.removingTemplates, r.Digest)
			if err == nil {
				if w.removedTemplates == nil {
					w.removedTemplates = map[string]bool{}
				}
				w.removedTemplates[r.Digest] = true
			}
			w.mu.Unlock()
			if err != nil {
				w.log.Warn("remove deleted template", "template", r.Digest, "err", err)
				return
			}
			w.templatesGone.Store(true)
			w.kickSync()
		}()
	}
}

// templateUserLocked names what uses template digest here: a sandbox, or
// a template image being built ("": nothing). w.mu is held.
func (w *Worker) templateUserLocked(digest string) string {
	for id, sb := range w.sandboxes {
		if sb.spec.TemplateDigest == digest && sb.state != model.StateDeleted {
			return "sandbox " + id
		}
	}
	prefix := templateSnapshotPrefix + templateKeyDigest(digest) + "-"
	for key := range w.imageBuilds {
		if strings.HasPrefix(key, prefix) {
			return "template image build " + key
		}
	}
	return ""
}

// templateKeyDigest is the part of a digest template image keys carry.
func templateKeyDigest(digest string) string {
	d := strings.TrimPrefix(digest, "sha256:")
	if len(d) > 24 {
		d = d[:24]
	}
	return d
}

// removeTemplate removes one deleted template: its catalog entry, then
// its template images.
func (w *Worker) removeTemplate(r workerapi.TemplateRemoval) error {
	removed, err := w.cfg.RemoveTemplate(r.Digest, r.DeletedAt)
	if err != nil {
		return err
	}
	if !removed {
		w.log.Info("deleted template kept: the copy here was imported after the deletion", "template", r.Digest, "deleted_at", r.DeletedAt)
		return nil
	}
	w.log.Info("deleted template removed", "template", r.Digest)
	if w.cfg.Snapshots == nil {
		return nil
	}
	ids, err := w.cfg.Snapshots.Sandboxes()
	if err != nil {
		return fmt.Errorf("list template images: %w", err)
	}
	prefix := templateSnapshotPrefix + templateKeyDigest(r.Digest) + "-"
	for id := range ids {
		if strings.HasPrefix(id, prefix) {
			if err := w.cfg.Snapshots.DeleteSandbox(id); err != nil {
				return fmt.Errorf("remove template image %s: %w", id, err)
			}
		}
	}
	return nil
}

// NoTemplateImages in Config.TemplateImages turns template images off
// altogether, for templates with a start command too (to measure booting
// them: `airlock up --template-images none`).
const NoTemplateImages = "none"

// hasStartCommand reports whether template digest has a start or ready
// command.
func (w *Worker) hasStartCommand(digest string) bool {
	c := w.templateConfig(digest)
	return c != nil && (c.StartCmd != "" || c.ReadyCmd != "")
}
