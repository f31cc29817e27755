package snapshot

// Snapshots in the shared blob store (package blob), so that another worker
// can restore them: a suspended sandbox wakes on any worker with capacity,
// and one whose worker is lost is restored elsewhere.
//
// Layout in the blob store, content-addressed:
//
//	blobs/sha256/<hex>                         one artifact's bytes
//	snapshots/<sandbox-id>/<snapshot-id>.json  the manifest (the commit point)
//
// Push uploads every artifact the store does not hold yet (an object under
// its sha256 of the right size is the same bytes: identical artifacts of
// several snapshots are stored once), then the manifest; a snapshot is in
// the blob store once its manifest is. Pull reads the manifest, checks it
// as Import does (kinds, paths, bounds), downloads every artifact into a
// pending snapshot checking size and sha256, and commits it under the same
// id: what the blob store holds is never trusted further than its hashes.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/blob"
)

// BlobKey is the key of an artifact with sha256 sum in the blob store.
func BlobKey(sum string) string { return "blobs/sha256/" + sum }

// ManifestKey is the key of snapshot snapshotID's manifest in the blob store.
func ManifestKey(sandboxID, snapshotID string) string {
	return "snapshots/" + sandboxID + "/" + snapshotID + ".json"
}

// PushStats says what a Push moved.
type PushStats struct {
	Artifacts, Uploaded int   // artifacts in the snapshot, and uploaded (the rest were there)
	Bytes               int64 // uploaded bytes
}

// Push uploads committed snapshot snapshotID of sandboxID to b (see the
// comment above). Pushing a snapshot again uploads only what is missing.
func (s *Store) Push(ctx context.Context, b blob.Store, sandboxID, snapshotID string) (PushStats, error) {
	var st PushStats
	m, dir, err := s.Get(sandboxID, snapshotID)
	if err != nil {
		return st, err
	}
	manifest, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return st, fmt.Errorf("snapshot: push %s: %w", snapshotID, err)
	}
	fail := func(err error) (PushStats, error) {
		return st, fmt.Errorf("snapshot: push %s: %w", snapshotID, err)
	}
	for _, a := range m.Artifacts {
		st.Artifacts++
		key := BlobKey(a.SHA256)
		if o, err := b.Stat(ctx, key); err == nil && o.Size == a.Size {
			continue
		} else if err != nil && !errors.Is(err, blob.ErrNotFound) {
			return fail(err)
		}
		f, err := os.Open(filepath.Join(dir, filepath.FromSlash(a.Path)))
		if err != nil {
			return fail(fmt.Errorf("artifact %s: %v: %w", a.Path, err, ErrCorrupt))
		}
		err = b.Put(ctx, key, f, a.Size)
		f.Close()
		if err != nil {
			return fail(fmt.Errorf("artifact %s: %w", a.Path, err))
		}
		st.Uploaded++
		st.Bytes += a.Size
	}
	if err := b.Put(ctx, ManifestKey(sandboxID, snapshotID), strings.NewReader(string(manifest)), int64(len(manifest))); err != nil {
		return fail(err)
	}
	return st, nil
}

// InBlobStore reports whether snapshot snapshotID of sandboxID is in b
// (its manifest is: Push writes it last).
func InBlobStore(ctx context.Context, b blob.Store, sandboxID, snapshotID string) (bool, error) {
	_, err := b.Stat(ctx, ManifestKey(sandboxID, snapshotID))
	if errors.Is(err, blob.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// Pull downloads snapshot snapshotID of sandboxID from b into the store
// under the same id (see the comment above). A snapshot already committed
// here is returned as it is. Errors: ErrNotFound when b does not hold it,
// ErrCorrupt when what b holds fails a check; nothing is left on failure.
func (s *Store) Pull(ctx context.Context, b blob.Store, sandboxID, snapshotID string) (_ Manifest, err error) {
	if err := validName("sandbox id", sandboxID); err != nil {
		return Manifest{}, err
	}
	if err := validName("snapshot id", snapshotID); err != nil {
		return Manifest{}, err
	}
	if m, _, err := s.Get(sandboxID, snapshotID); err == nil {
		return m, nil
	}
	corrupt := func(format string, args ...any) error {
		return fmt.Errorf("snapshot: pull %s from %s: %s: %w", snapshotID, b, fmt.Sprintf(format, args...), ErrCorrupt)
	}
	rc, n, err := b.Get(ctx, ManifestKey(sandboxID, snapshotID))
	if errors.Is(err, blob.ErrNotFound) {
		return Manifest{}, fmt.Errorf("snapshot: %s of %s is not in blob store %s: %w", snapshotID, sandboxID, b, ErrNotFound)
	}
	if err != nil {
		return Manifest{}, fmt.Errorf("snapshot: pull %s: %w", snapshotID, err)
	}
	if n > maxManifestBytes {
		rc.Close()
		return Manifest{}, corrupt("manifest of %d bytes (at most %d)", n, maxManifestBytes)
	}
	data, err := io.ReadAll(io.LimitReader(rc, maxManifestBytes+1))
	rc.Close()
	if err != nil {
		return Manifest{}, fmt.Errorf("snapshot: pull %s: read manifest: %w", snapshotID, err)
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return Manifest{}, corrupt("manifest: %v", err)
	}
	if m.ID != snapshotID || m.SandboxID != sandboxID {
		return Manifest{}, corrupt("manifest is of %s/%s", m.SandboxID, m.ID)
	}
	if err := validKind(m.Kind); err != nil {
		return Manifest{}, corrupt("manifest kind %.80q", m.Kind)
	}
	if err := checkArtifacts(m.Artifacts); err != nil {
		return Manifest{}, corrupt("manifest: %v", err)
	}
	var total int64
	for _, a := range m.Artifacts {
		total += a.Size
		if total > s.maxBytes || total < 0 {
			return Manifest{}, corrupt("artifacts total more than %d bytes", s.maxBytes)
		}
	}
	if total != m.Bytes {
		return Manifest{}, corrupt("manifest says %d bytes, its artifacts sum to %d", m.Bytes, total)
	}

	p, err := s.begin(sandboxID, snapshotID)
	if err != nil {
		return Manifest{}, err
	}
	defer func() {
		if err != nil {
			p.Abort()
		}
	}()
	for _, a := range m.Artifacts {
		if err := pullFile(ctx, b, p.Dir(), a); err != nil {
			if errors.Is(err, ErrCorrupt) || errors.Is(err, blob.ErrNotFound) {
				return Manifest{}, corrupt("artifact %s: %v", a.Path, err)
			}
			return Manifest{}, fmt.Errorf("snapshot: pull %s: artifact %s: %w", snapshotID, a.Path, err)
		}
	}
	if err := syncTree(p.Dir()); err != nil {
		return Manifest{}, fmt.Errorf("snapshot: pull %s: %w", snapshotID, err)
	}
	if err := p.commit(m); err != nil {
		return Manifest{}, err
	}
	return m, nil
}

// pullFile downloads artifact a into dir, fsynced, checking its size and
// sha256.
func pullFile(ctx context.Context, b blob.Store, dir string, a Artifact) error {
	rc, n, err := b.Get(ctx, BlobKey(a.SHA256))
	if err != nil {
		return err
	}
	defer rc.Close()
	if n != a.Size {
		return fmt.Errorf("stored object has %d bytes, manifest says %d: %w", n, a.Size, ErrCorrupt)
	}
	return writeArtifact(dir, a, &ctxReader{ctx: ctx, r: rc}, true)
}

// syncTree fsyncs every directory under dir (files are synced as written).
func syncTree(dir string) error {
	return filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			return syncDir(p)
		}
		return nil
	})
}

// DropFromBlobStore removes snapshot snapshotID's manifest from b: it is no
// longer restorable from there. Its artifacts stay until GCBlobs finds them
// unreferenced (another snapshot may share them).
func DropFromBlobStore(ctx context.Context, b blob.Store, sandboxID, snapshotID string) error {
	return b.Delete(ctx, ManifestKey(sandboxID, snapshotID))
}

// ValidManifestKey reports whether key has the form ManifestKey writes, and
// returns its sandbox and snapshot ids.
func ValidManifestKey(key string) (sandboxID, snapshotID string, ok bool) {
	rest, ok := strings.CutPrefix(key, "snapshots/")
	if !ok {
		return "", "", false
	}
	sb, file, ok := strings.Cut(rest, "/")
	snap, isJSON := strings.CutSuffix(file, ".json")
	if !ok || !isJSON || validName("sandbox id", sb) != nil || validName("snapshot id", snap) != nil {
		return "", "", false
	}
	return sb, snap, true
}

// BlobGCStats says what GCBlobStore removed.
type BlobGCStats struct {
	Manifests, Blobs int   // removed
	Bytes            int64 // of the removed blobs
}

// GCBlobStore removes from b the manifests keep refuses (by sandbox and
// snapshot id), then every artifact no remaining manifest lists. Anything
// younger than minAge stays whatever keep says: a push uploads its
// artifacts before its manifest and reports the snapshot after both, so a
// young object may belong to a snapshot the caller does not know of yet.
// A manifest that cannot be read keeps every artifact (nothing is removed
// on doubt); objects that are not the package's own are left alone.
func GCBlobStore(ctx context.Context, b blob.Store, keep func(sandboxID, snapshotID string) bool, minAge time.Duration, now time.Time) (BlobGCStats, error) {
	var st BlobGCStats
	manifests, err := b.List(ctx, "snapshots/")
	if err != nil {
		return st, fmt.Errorf("snapshot: blob gc: %w", err)
	}
	referenced := map[string]bool{}
	for _, o := range manifests {
		sb, snap, ok := ValidManifestKey(o.Key)
		if !ok {
			continue
		}
		if now.Sub(o.Modified) >= minAge && !keep(sb, snap) {
			if err := b.Delete(ctx, o.Key); err != nil {
				return st, fmt.Errorf("snapshot: blob gc: %w", err)
			}
			st.Manifests++
			continue
		}
		rc, _, err := b.Get(ctx, o.Key)
		if err != nil {
			return st, fmt.Errorf("snapshot: blob gc: read %s: %w", o.Key, err)
		}
		data, err := io.ReadAll(io.LimitReader(rc, maxManifestBytes+1))
		rc.Close()
		var m Manifest
		if err == nil {
			err = json.Unmarshal(data, &m)
		}
		if err != nil {
			return st, fmt.Errorf("snapshot: blob gc: read %s: %w", o.Key, err)
		}
		for _, a := range m.Artifacts {
			referenced[a.SHA256] = true
		}
	}
	blobs, err := b.List(ctx, "blobs/sha256/")
	if err != nil {
		return st, fmt.Errorf("snapshot: blob gc: %w", err)
	}
	for _, o := range blobs {
		sum := strings.TrimPrefix(o.Key, "blobs/sha256/")
		if referenced[sum] || now.Sub(o.Modified) < minAge || strings.Contains(sum, "/") {
			continue
		}
		if err := b.Delete(ctx, o.Key); err != nil {
			return st, fmt.Errorf("snapshot: blob gc: %w", err)
		}
		st.Blobs++
		st.Bytes += o.Size
	}
	return st, nil
}
