package snapshot_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/snapshot"
	"github.com/airlock/airlock/internal/snapshot/snapshottest"
)

// TestReadHeadMetaHeaderFlood: an endless run of meta headers, before the
// manifest or after it, is refused once MaxHeadBytes are read (security
// review M1: the API server used to buffer it all).
func TestReadHeadMetaHeaderFlood(t *testing.T) {
	// The flood really is one that archive/tar reads to the end.
	probe := &snapshottest.MetaFlood{}
	if _, err := tar.NewReader(io.LimitReader(probe, 4<<20)).Next(); err == nil || probe.N != 4<<20 {
		t.Fatalf("archive/tar stopped after %d bytes of the flood (%v): the test stream is not a meta-header flood", probe.N, err)
	}
	for _, tc := range []struct {
		name   string
		before []byte
	}{
		{"before the manifest", nil},
		{"after the manifest", streamNoEnd(manifestEntry())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flood := &snapshottest.MetaFlood{}
			r := io.MultiReader(bytes.NewReader(tc.before), io.LimitReader(flood, 256<<20))
			_, err := snapshot.ReadHead(r)
			if !errors.Is(err, model.ErrInvalid) || !strings.Contains(err.Error(), "more than") {
				t.Fatalf("ReadHead = %v, want ErrInvalid saying the first entries are too long", err)
			}
			if got := int64(len(tc.before)) + flood.N; got > snapshot.MaxHeadBytes {
				t.Fatalf("ReadHead read %d bytes, more than MaxHeadBytes %d", got, snapshot.MaxHeadBytes)
			}
			t.Logf("refused after %d bytes: %v", int64(len(tc.before))+flood.N, err)
		})
	}
}

// streamNoEnd is stream without the end-of-archive marker.
func streamNoEnd(entries ...entry) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		tw.WriteHeader(&h)
		tw.Write(e.body)
	}
	tw.Flush()
	return buf.Bytes()
}

func TestReadHeadRejects(t *testing.T) {
	body := []byte("pages")
	m := manifestEntry(art("pages.img", body))
	link := entry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "manifest.json", Linkname: "/etc/passwd"}}
	dir := entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "manifest.json", Mode: 0o700}}
	bigSig := reg(snapshot.SignatureFile, make([]byte, 8<<10))
	for _, tc := range []struct {
		name, stream, want string
	}{
		{"empty", "", "not a tar stream"},
		{"not a tar", strings.Repeat("not a tar ", 100), "not a tar stream"},
		{"manifest not first", string(stream(reg("pages.img", body), m)), `first entry is "pages.img"`},
		{"first entry with a long name", string(stream(reg(strings.Repeat("n", 100<<10), body), m)), `first entry is "nnnn`},
		{"manifest a symlink", string(stream(link, reg("pages.img", body))), "regular file manifest.json"},
		{"manifest a directory", string(stream(dir, reg("pages.img", body))), "regular file manifest.json"},
		{"manifest too big", string(stream(reg("manifest.json", make([]byte, 1<<20+1)))), "more than"},
		{"manifest not json", string(stream(reg("manifest.json", []byte("{")))), "not valid JSON"},
		{"manifest cut short", string(stream(m)[:600]), "manifest.json"},
		{"signature a symlink", string(stream(m, entry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: snapshot.SignatureFile, Linkname: "x"}})), snapshot.SignatureFile},
		{"signature too big", string(stream(m, bigSig)), snapshot.SignatureFile},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := snapshot.ReadHead(strings.NewReader(tc.stream))
			if !errors.Is(err, model.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ReadHead = %.300v, want ErrInvalid mentioning %q", err, tc.want)
			}
			if len(err.Error()) > 1024 {
				t.Fatalf("the error echoes the archive: %d bytes", len(err.Error()))
			}
		})
	}
}

// TestSignedArchive: the API server's signature goes in right after the
// manifest, verifies, and comes out again byte for byte; the worker's
// Import takes the unsigned stream and refuses the signed one.
func TestSignedArchive(t *testing.T) {
	src, dst := open(t), open(t)
	m := commit(t, src, sbID, randomFiles(), snapshot.Meta{Name: "cp1", Runtime: "gvisor", Kind: snapshot.KindCheckpoint})
	var exported bytes.Buffer
	if err := src.Export(context.Background(), sbID, m.ID, &exported); err != nil {
		t.Fatal(err)
	}
	key := []byte("0123456789abcdef0123456789abcdef")

	h, err := snapshot.ReadHead(bytes.NewReader(exported.Bytes()))
	if err != nil || h.Signature != nil || h.Manifest.ID != m.ID {
		t.Fatalf("ReadHead of an export = %+v, %v", h, err)
	}
	sr, extra, err := h.Signed(snapshot.Sign(key, h.ManifestBytes))
	if err != nil {
		t.Fatal(err)
	}
	signed, err := io.ReadAll(sr)
	if err != nil || int64(len(signed)) != int64(exported.Len())+extra {
		t.Fatalf("signed archive: %d bytes (%v), want %d + %d", len(signed), err, exported.Len(), extra)
	}
	// Any tar reader sees manifest.json, manifest.json.sig, the artifacts.
	tr := tar.NewReader(bytes.NewReader(signed))
	var names []string
	for {
		e, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("read the signed archive as tar: %v", err)
		}
		names = append(names, e.Name)
	}
	if len(names) != 2+len(m.Artifacts) || names[0] != snapshot.ManifestFile || names[1] != snapshot.SignatureFile {
		t.Fatalf("signed archive entries %v", names)
	}

	h2, err := snapshot.ReadHead(bytes.NewReader(signed))
	if err != nil || h2.Signature == nil {
		t.Fatalf("ReadHead of the signed archive = %+v, %v", h2, err)
	}
	if err := snapshot.Verify(key, h2.ManifestBytes, h2.Signature); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	unsigned, err := io.ReadAll(h2.Unsigned())
	if err != nil || !bytes.Equal(unsigned, exported.Bytes()) {
		t.Fatalf("Unsigned differs from the export (%d vs %d bytes, %v)", len(unsigned), exported.Len(), err)
	}
	if _, err := dst.Import(context.Background(), sbID, bytes.NewReader(unsigned)); err != nil {
		t.Fatalf("Import of the unsigned stream: %v", err)
	}
	if _, err := dst.Import(context.Background(), sbID, bytes.NewReader(signed)); !errors.Is(err, model.ErrInvalid) {
		t.Fatalf("Import of the signed stream = %v; the worker takes archives only without their signature", err)
	}
	// Re-signing replaces the signature entry: the size change is zero.
	if _, extra, err := h2.Signed(snapshot.Sign(key, h2.ManifestBytes)); err != nil || extra != 0 {
		t.Fatalf("re-sign: %d extra bytes, %v", extra, err)
	}
	// A manifest that ends the stream (no artifacts follow) still reads.
	only := stream(reg(snapshot.ManifestFile, h.ManifestBytes))
	if h3, err := snapshot.ReadHead(bytes.NewReader(only)); err != nil {
		t.Fatalf("ReadHead of a manifest-only archive: %v", err)
	} else if b, _ := io.ReadAll(h3.Unsigned()); !bytes.Equal(b, only) {
		t.Fatal("Unsigned of a manifest-only archive differs")
	}
}

func TestVerify(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	other := []byte("fedcba9876543210fedcba9876543210")
	manifest := []byte(`{"id":"snap-1","artifacts":[{"path":"checkpoint.img","size":5,"sha256":"aa"}]}`)
	good := snapshot.Sign(key, manifest)
	if err := snapshot.Verify(key, manifest, good); err != nil {
		t.Fatalf("Verify of a good signature: %v", err)
	}
	var forged snapshot.Signature
	json.Unmarshal(snapshot.Sign(other, manifest), &forged)
	forged.KeyID = snapshot.KeyID(key) // claims this installation's key
	forgedJSON, _ := json.Marshal(forged)
	for _, tc := range []struct {
		name     string
		manifest []byte
		sig      []byte
		want     error
	}{
		{"another key", manifest, snapshot.Sign(other, manifest), snapshot.ErrSignatureKey},
		{"manifest modified", bytes.Replace(manifest, []byte(`"aa"`), []byte(`"bb"`), 1), good, snapshot.ErrSignatureMismatch},
		{"another key claiming this one", manifest, forgedJSON, snapshot.ErrSignatureMismatch},
		{"not json", manifest, []byte("hmac"), snapshot.ErrSignatureMismatch},
		{"other alg", manifest, bytes.Replace(good, []byte("hmac-sha256"), []byte("none"), 1), snapshot.ErrSignatureMismatch},
		{"empty", manifest, []byte{}, snapshot.ErrSignatureMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := snapshot.Verify(key, tc.manifest, tc.sig); !errors.Is(err, tc.want) || !errors.Is(err, model.ErrInvalid) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
		})
	}
	if snapshot.KeyID(key) == snapshot.KeyID(other) || strings.Contains(string(good), fmt.Sprintf("%x", key)) {
		t.Fatal("key ids collide or the signature shows the key")
	}
}
