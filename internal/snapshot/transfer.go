package snapshot

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/airlock/airlock/internal/model"
)

// Export writes a committed snapshot as a tar stream: manifest.json first,
// then every artifact in manifest order, as regular files with mode 0600.
// Artifacts are hashed while they are sent; a mismatch with the manifest
// fails the export with ErrCorrupt (the receiver's Import would reject the
// stream too).
func (s *Store) Export(ctx context.Context, sandboxID, snapshotID string, w io.Writer) error {
	m, dir, err := s.Get(sandboxID, snapshotID)
	if err != nil {
		return err
	}
	manifest, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return fmt.Errorf("snapshot: export %s: %w", snapshotID, err)
	}
	tw := tar.NewWriter(w)
	hdr := func(name string, size int64) *tar.Header {
		return &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: size, Mode: 0o600, ModTime: m.CreatedAt, Format: tar.FormatPAX}
	}
	if err := tw.WriteHeader(hdr(ManifestFile, int64(len(manifest)))); err != nil {
		return fmt.Errorf("snapshot: export %s: %w", snapshotID, err)
	}
	if _, err := tw.Write(manifest); err != nil {
		return fmt.Errorf("snapshot: export %s: %w", snapshotID, err)
	}
	for _, a := range m.Artifacts {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("snapshot: export %s: %w", snapshotID, err)
		}
		if err := exportFile(ctx, tw, hdr(a.Path, a.Size), filepath.Join(dir, filepath.FromSlash(a.Path)), a); err != nil {
			return fmt.Errorf("snapshot: export %s: artifact %s: %w", snapshotID, a.Path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("snapshot: export %s: %w", snapshotID, err)
	}
	return nil
}

func exportFile(ctx context.Context, tw *tar.Writer, h *tar.Header, p string, a Artifact) error {
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("%v: %w", err, ErrCorrupt)
	}
	defer f.Close()
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	sum := sha256.New()
	n, err := io.Copy(io.MultiWriter(tw, sum), &ctxReader{ctx: ctx, r: io.LimitReader(f, a.Size)})
	if err != nil {
		return err
	}
	if n != a.Size || hex.EncodeToString(sum.Sum(nil)) != a.SHA256 {
		return fmt.Errorf("content differs from the manifest: %w", ErrCorrupt)
	}
	return nil
}

// ctxReader fails reads once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// Import reads a stream written by Export into a new snapshot of sandboxID
// (a new id; name, runtime and kind from the manifest). Every entry must be
// a regular file the manifest lists, with its size and sha256; paths that
// escape, links, extra or missing artifacts, and totals above the import
// bound are rejected with model.ErrInvalid. Nothing is left on failure.
func (s *Store) Import(ctx context.Context, sandboxID string, r io.Reader) (_ Manifest, err error) {
	p, err := s.Begin(sandboxID)
	if err != nil {
		return Manifest{}, err
	}
	defer func() {
		if err != nil {
			p.Abort()
		}
	}()
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("snapshot: import into %s: %s: %w", sandboxID, fmt.Sprintf(format, args...), model.ErrInvalid)
	}
	tr := tar.NewReader(&ctxReader{ctx: ctx, r: r})

	h, err := tr.Next()
	if err != nil {
		if ctx.Err() != nil {
			return Manifest{}, fmt.Errorf("snapshot: import into %s: %w", sandboxID, ctx.Err())
		}
		return Manifest{}, invalid("read manifest: %v", err)
	}
	if h.Name != ManifestFile || h.Typeflag != tar.TypeReg {
		return Manifest{}, invalid("first entry is %q (type %c), want %s", h.Name, h.Typeflag, ManifestFile)
	}
	if h.Size > maxManifestBytes {
		return Manifest{}, invalid("manifest of %d bytes (at most %d)", h.Size, maxManifestBytes)
	}
	data, err := io.ReadAll(io.LimitReader(tr, maxManifestBytes+1))
	if err != nil {
		return Manifest{}, invalid("read manifest: %v", err)
	}
	var src Manifest
	if err := json.Unmarshal(data, &src); err != nil {
		return Manifest{}, invalid("manifest: %v", err)
	}
	if err := validKind(src.Kind); err != nil {
		return Manifest{}, invalid("manifest kind %q", src.Kind)
	}
	if err := checkArtifacts(src.Artifacts); err != nil {
		return Manifest{}, invalid("manifest: %v", err)
	}
	want := map[string]Artifact{}
	var total int64
	for _, a := range src.Artifacts {
		want[a.Path] = a
		total += a.Size
		if total > s.maxBytes || total < 0 {
			return Manifest{}, invalid("artifacts total more than %d bytes", s.maxBytes)
		}
	}
	if total != src.Bytes {
		return Manifest{}, invalid("manifest says %d bytes, its artifacts sum to %d", src.Bytes, total)
	}

	got := map[string]bool{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if ctx.Err() != nil {
				return Manifest{}, fmt.Errorf("snapshot: import into %s: %w", sandboxID, ctx.Err())
			}
			return Manifest{}, invalid("read tar: %v", err)
		}
		if h.Typeflag != tar.TypeReg {
			return Manifest{}, invalid("entry %q has type %c, only regular files are allowed", h.Name, h.Typeflag)
		}
		a, ok := want[h.Name]
		if !ok {
			return Manifest{}, invalid("entry %q is not in the manifest", h.Name)
		}
		if got[h.Name] {
			return Manifest{}, invalid("entry %q appears twice", h.Name)
		}
		got[h.Name] = true
		if h.Size != a.Size {
			return Manifest{}, invalid("entry %q has %d bytes, manifest says %d", h.Name, h.Size, a.Size)
		}
		if err := importFile(p.Dir(), a, tr); err != nil {
			if ctx.Err() != nil {
				return Manifest{}, fmt.Errorf("snapshot: import into %s: %w", sandboxID, ctx.Err())
			}
			return Manifest{}, invalid("entry %q: %v", h.Name, err)
		}
	}
	if len(got) != len(want) {
		for path := range want {
			if !got[path] {
				return Manifest{}, invalid("artifact %q is missing from the stream", path)
			}
		}
	}
	m, err := p.Commit(Meta{Name: src.Name, Runtime: src.Runtime, Kind: src.Kind,
		Template: src.Template, TemplateDigest: src.TemplateDigest, VCPUs: src.VCPUs, MemoryMiB: src.MemoryMiB})
	if err != nil {
		return Manifest{}, err
	}
	return m, nil
}

// importFile writes one artifact below dir (path already validated) and
// checks its size and sha256.
func importFile(dir string, a Artifact, r io.Reader) error {
	p := filepath.Join(dir, filepath.FromSlash(a.Path))
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	sum := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, sum), io.LimitReader(r, a.Size+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if n != a.Size {
		return fmt.Errorf("%d bytes, manifest says %d", n, a.Size)
	}
	if got := hex.EncodeToString(sum.Sum(nil)); got != a.SHA256 {
		return fmt.Errorf("sha256 %s, manifest says %s", got, a.SHA256)
	}
	return nil
}
