package snapshot_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/blob/blobtest"
	"github.com/airlock/airlock/internal/snapshot"
)

// Push and Pull move a snapshot between two workers' stores through each
// backend, under its id, byte for byte; a second push uploads nothing; a
// blob store that lies is caught by the hashes and leaves nothing behind.
func TestPushPull(t *testing.T) {
	for name, open := range blobtest.Backends {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			b := open(t)
			src, dst := open2(t)
			fs := randomFiles()
			m := commit(t, src, sbID, fs, snapshot.Meta{Kind: snapshot.KindSuspend, Runtime: "fake", TemplateDigest: "sha256:t"})

			if ok, err := snapshot.InBlobStore(ctx, b, sbID, m.ID); ok || err != nil {
				t.Fatalf("in blob store before push: %v %v", ok, err)
			}
			if _, err := dst.Pull(ctx, b, sbID, m.ID); !errors.Is(err, snapshot.ErrNotFound) {
				t.Fatalf("pull before push: %v, want ErrNotFound", err)
			}
			st, err := src.Push(ctx, b, sbID, m.ID)
			if err != nil {
				t.Fatal(err)
			}
			if st.Artifacts != len(fs) || st.Uploaded != len(fs) || st.Bytes != m.Bytes {
				t.Fatalf("first push: %+v, want %d artifacts, %d bytes", st, len(fs), m.Bytes)
			}
			if st, err := src.Push(ctx, b, sbID, m.ID); err != nil || st.Uploaded != 0 || st.Bytes != 0 {
				t.Fatalf("second push: %+v %v, want nothing uploaded", st, err)
			}
			// A second snapshot with the same big artifact shares its blob.
			fs2 := files{"pages.img": fs["pages.img"], "new.img": []byte("new")}
			m2 := commit(t, src, sbID, fs2, snapshot.Meta{Kind: snapshot.KindCheckpoint, Name: "c"})
			if st, err := src.Push(ctx, b, sbID, m2.ID); err != nil || st.Uploaded != 1 || st.Bytes != 3 {
				t.Fatalf("push sharing an artifact: %+v %v, want 1 upload of 3 bytes", st, err)
			}
			if ok, err := snapshot.InBlobStore(ctx, b, sbID, m.ID); !ok || err != nil {
				t.Fatalf("in blob store after push: %v %v", ok, err)
			}

			got, err := dst.Pull(ctx, b, sbID, m.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.ID != m.ID || got.Bytes != m.Bytes || got.Kind != snapshot.KindSuspend || got.TemplateDigest != "sha256:t" {
				t.Fatalf("pulled manifest %+v, want %+v", got, m)
			}
			_, dir, err := dst.Get(sbID, m.ID)
			if err != nil {
				t.Fatal(err)
			}
			checkContent(t, dir, fs)
			if err := dst.Verify(sbID, m.ID); err != nil {
				t.Fatalf("verify pulled: %v", err)
			}
			// Pulling what is here already is a no-op.
			if again, err := dst.Pull(ctx, b, sbID, m.ID); err != nil || again.ID != m.ID {
				t.Fatalf("pull again: %v", err)
			}

			// A blob store whose artifact was swapped fails the pull and
			// leaves nothing in the store.
			var big snapshot.Artifact
			for _, a := range m2.Artifacts {
				if a.Path == "pages.img" {
					big = a
				}
			}
			evil := []byte(strings.Repeat("x", int(big.Size)))
			if err := b.Put(ctx, snapshot.BlobKey(big.SHA256), strings.NewReader(string(evil)), big.Size); err != nil {
				t.Fatal(err)
			}
			third, _ := open2(t)
			if _, err := third.Pull(ctx, b, sbID, m2.ID); !errors.Is(err, snapshot.ErrCorrupt) {
				t.Fatalf("pull of a tampered artifact: %v, want ErrCorrupt", err)
			}
			if ms, err := third.List(sbID); err != nil || len(ms) != 0 {
				t.Fatalf("tampered pull left %v %v", ms, err)
			}
			leftovers(t, third)

			// A manifest filed under another snapshot's key is refused.
			rc, n, err := b.Get(ctx, snapshot.ManifestKey(sbID, m.ID))
			if err != nil {
				t.Fatal(err)
			}
			data, _ := io.ReadAll(rc)
			rc.Close()
			other := "snap-bbbbbbbbbbbbbbbbbbbbbbbbbb"
			if err := b.Put(ctx, snapshot.ManifestKey(sbID, other), strings.NewReader(string(data)), n); err != nil {
				t.Fatal(err)
			}
			if _, err := third.Pull(ctx, b, sbID, other); !errors.Is(err, snapshot.ErrCorrupt) {
				t.Fatalf("pull of a misfiled manifest: %v, want ErrCorrupt", err)
			}
			// Hostile manifests: an escaping path, sizes that lie.
			for i, bad := range []string{
				`{"id":"` + other + `","sandbox_id":"` + sbID + `","kind":"suspend","bytes":1,"artifacts":[{"path":"../../etc/x","size":1,"sha256":"` + strings.Repeat("a", 64) + `"}]}`,
				`{"id":"` + other + `","sandbox_id":"` + sbID + `","kind":"suspend","bytes":5,"artifacts":[{"path":"a","size":1,"sha256":"` + strings.Repeat("a", 64) + `"}]}`,
				`{"id":"` + other + `","sandbox_id":"` + sbID + `","kind":"weird","bytes":0,"artifacts":[]}`,
				`not json`,
			} {
				if err := b.Put(ctx, snapshot.ManifestKey(sbID, other), strings.NewReader(bad), int64(len(bad))); err != nil {
					t.Fatal(err)
				}
				if _, err := third.Pull(ctx, b, sbID, other); !errors.Is(err, snapshot.ErrCorrupt) {
					t.Errorf("hostile manifest %d: %v, want ErrCorrupt", i, err)
				}
			}
			leftovers(t, third)

			if err := snapshot.DropFromBlobStore(ctx, b, sbID, m.ID); err != nil {
				t.Fatal(err)
			}
			if ok, _ := snapshot.InBlobStore(ctx, b, sbID, m.ID); ok {
				t.Fatal("still in the blob store after DropFromBlobStore")
			}
		})
	}
}

func open2(t *testing.T) (*snapshot.Store, *snapshot.Store) {
	t.Helper()
	return open(t), open(t)
}

// leftovers fails t if s's directory holds anything but empty sandbox dirs.
func leftovers(t *testing.T, s *snapshot.Store) {
	t.Helper()
	filepath.WalkDir(s.Dir(), func(p string, e os.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			t.Errorf("left behind: %s", p)
		}
		return nil
	})
}

func TestValidManifestKey(t *testing.T) {
	sb, snap, ok := snapshot.ValidManifestKey(snapshot.ManifestKey(sbID, "snap-x"))
	if !ok || sb != sbID || snap != "snap-x" {
		t.Fatalf("round trip: %q %q %v", sb, snap, ok)
	}
	for _, k := range []string{"snapshots/a", "snapshots/a/b", "blobs/sha256/x", "snapshots/../b.json", "snapshots/a/.b.json"} {
		if _, _, ok := snapshot.ValidManifestKey(k); ok {
			t.Errorf("%q accepted", k)
		}
	}
}

// GCBlobStore removes refused manifests and the artifacts nothing lists any
// more, keeps shared artifacts and anything young, and leaves foreign
// objects alone.
func TestGCBlobStore(t *testing.T) {
	for name, open := range blobtest.Backends {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			b := open(t)
			s := open2first(t)
			fs := randomFiles()
			m1 := commit(t, s, sbID, fs, snapshot.Meta{Kind: snapshot.KindSuspend})
			m2 := commit(t, s, sbID, files{"pages.img": fs["pages.img"], "own.img": []byte("own")}, snapshot.Meta{Kind: snapshot.KindSuspend})
			for _, m := range []snapshot.Manifest{m1, m2} {
				if _, err := s.Push(ctx, b, sbID, m.ID); err != nil {
					t.Fatal(err)
				}
			}
			if err := b.Put(ctx, "other/thing", strings.NewReader("x"), 1); err != nil {
				t.Fatal(err)
			}
			now := time.Now().Add(time.Hour) // everything is an hour old
			keepOnly := func(id string) func(string, string) bool {
				return func(sb, snap string) bool { return sb == sbID && snap == id }
			}
			// Young: nothing goes.
			if st, err := snapshot.GCBlobStore(ctx, b, keepOnly(""), 2*time.Hour, now); err != nil || st != (snapshot.BlobGCStats{}) {
				t.Fatalf("gc of young objects: %+v %v", st, err)
			}
			st, err := snapshot.GCBlobStore(ctx, b, keepOnly(m2.ID), time.Minute, now)
			if err != nil {
				t.Fatal(err)
			}
			// m1 goes with its 3 own artifacts; pages.img is m2's too.
			if st.Manifests != 1 || st.Blobs != len(fs)-1 {
				t.Fatalf("gc keeping m2: %+v, want 1 manifest and %d blobs", st, len(fs)-1)
			}
			other, _ := open2(t)
			if _, err := other.Pull(ctx, b, sbID, m2.ID); err != nil {
				t.Fatalf("pull of the kept snapshot after gc: %v", err)
			}
			if ok, _ := snapshot.InBlobStore(ctx, b, sbID, m1.ID); ok {
				t.Fatal("refused manifest still there")
			}
			st, err = snapshot.GCBlobStore(ctx, b, keepOnly(""), time.Minute, now)
			if err != nil || st.Manifests != 1 || st.Blobs != 2 {
				t.Fatalf("gc keeping nothing: %+v %v, want 1 manifest, 2 blobs", st, err)
			}
			left, err := b.List(ctx, "")
			if err != nil || len(left) != 1 || left[0].Key != "other/thing" {
				t.Fatalf("left after gc: %+v %v, want only other/thing", left, err)
			}
		})
	}
}

func open2first(t *testing.T) *snapshot.Store { s, _ := open2(t); return s }
