package snapshot

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

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
		return Manifest{}, invalid("first entry is %.80q (type %c), want %s", h.Name, h.Typeflag, ManifestFile)
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
		return Manifest{}, invalid("manifest kind %.80q", src.Kind)
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
			return Manifest{}, invalid("entry %.80q has type %c, only regular files are allowed", h.Name, h.Typeflag)
		}
		a, ok := want[h.Name]
		if !ok {
			return Manifest{}, invalid("entry %.80q is not in the manifest", h.Name)
		}
		if got[h.Name] {
			return Manifest{}, invalid("entry %.80q appears twice", h.Name)
		}
		got[h.Name] = true
		if h.Size != a.Size {
			return Manifest{}, invalid("entry %.80q has %d bytes, manifest says %d", h.Name, h.Size, a.Size)
		}
		if err := importFile(p.Dir(), a, tr); err != nil {
			if ctx.Err() != nil {
				return Manifest{}, fmt.Errorf("snapshot: import into %s: %w", sandboxID, ctx.Err())
			}
			return Manifest{}, invalid("entry %.80q: %v", h.Name, err)
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
func importFile(dir string, a Artifact, r io.Reader) error { return writeArtifact(dir, a, r, false) }

// writeArtifact writes artifact a below dir from r (at most a.Size+1 bytes
// read), fsynced when durable, and checks its size and sha256 (a mismatch
// wraps ErrCorrupt). Import and Pull share it.
func writeArtifact(dir string, a Artifact, r io.Reader, durable bool) error {
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
	if err == nil && durable {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if n != a.Size {
		return fmt.Errorf("%d bytes, manifest says %d: %w", n, a.Size, ErrCorrupt)
	}
	if got := hex.EncodeToString(sum.Sum(nil)); got != a.SHA256 {
		return fmt.Errorf("sha256 %s, manifest says %s: %w", got, a.SHA256, ErrCorrupt)
	}
	return nil
}

// SignatureFile is the entry right after the manifest in an archive exported
// through the API server: the installation's signature over the manifest
// bytes (Sign). The manifest holds the size and sha256 of every artifact, so
// the signature covers the whole archive. A worker's Export does not write
// it and its Import does not take it: the API server adds it on export
// (Head.Signed) and checks and removes it on import (Head.Unsigned).
const SignatureFile = "manifest.json.sig"

// MaxHeadBytes bounds what ReadHead reads of an archive: the manifest entry
// (at most 1 MiB of data), the signature entry and their tar headers. An
// archive whose first entries take more (e.g. an endless run of PAX or GNU
// meta headers) is refused before more is read.
const MaxHeadBytes = 2 << 20

// maxSignatureBytes bounds the signature entry (a small JSON object).
const maxSignatureBytes = 4 << 10

// Head is the start of an archive written by Export: its manifest, as bytes
// and parsed, its signature entry if it has one, and the rest of the stream.
type Head struct {
	Manifest      Manifest
	ManifestBytes []byte
	Signature     []byte // the SignatureFile entry's content; nil if there is none

	entry  []byte    // the manifest entry as read: header blocks, data, padding
	sigLen int64     // bytes of the signature entry in the stream (0 if none)
	rest   io.Reader // the stream after the signature entry, or after the manifest entry if there is none
}

// ReadHead reads the start of archive r, at most MaxHeadBytes: the first
// entry must be the regular file manifest.json (at most 1 MiB of JSON),
// optionally followed by SignatureFile. Errors wrap model.ErrInvalid and say
// what is wrong. Only the head is buffered; the rest of r is read through
// Unsigned or Signed.
func ReadHead(r io.Reader) (*Head, error) {
	lr := &io.LimitedReader{R: r, N: MaxHeadBytes}
	var seen bytes.Buffer
	tee := io.TeeReader(lr, &seen)
	tr := tar.NewReader(tee)
	fail := func(format string, args ...any) error {
		if lr.N <= 0 {
			return model.Errorf(model.ErrInvalid, "its first entries take more than %d bytes (a checkpoint archive starts with %s, at most %d bytes, and %s)",
				MaxHeadBytes, ManifestFile, maxManifestBytes, SignatureFile)
		}
		return model.Errorf(model.ErrInvalid, format, args...)
	}
	h, err := tr.Next()
	if err != nil {
		return nil, fail("it is not a tar stream: %v", err)
	}
	if h.Name != ManifestFile || h.Typeflag != tar.TypeReg {
		return nil, fail("its first entry is %.80q (tar type %q); a checkpoint archive starts with the regular file %s", h.Name, h.Typeflag, ManifestFile)
	}
	if h.Size > maxManifestBytes {
		return nil, fail("its %s has %d bytes, more than %d", ManifestFile, h.Size, maxManifestBytes)
	}
	data, err := io.ReadAll(tr)
	if err != nil {
		return nil, fail("read %s: %v", ManifestFile, err)
	}
	hd := &Head{ManifestBytes: data}
	if err := json.Unmarshal(data, &hd.Manifest); err != nil {
		return nil, fail("its %s is not valid JSON: %v", ManifestFile, err)
	}
	end := blockEnd(seen.Len())
	h, err = tr.Next()
	switch {
	case errors.Is(err, io.EOF) && lr.N > 0: // the archive ends after the manifest
	case err != nil:
		return nil, fail("read the entry after %s: %v", ManifestFile, err)
	case h.Name == SignatureFile:
		if h.Typeflag != tar.TypeReg || h.Size > maxSignatureBytes {
			return nil, fail("its %s entry is not a regular file of at most %d bytes", SignatureFile, maxSignatureBytes)
		}
		sig, err := io.ReadAll(tr)
		if err != nil {
			return nil, fail("read %s: %v", SignatureFile, err)
		}
		if pad := blockEnd(seen.Len()) - seen.Len(); pad > 0 {
			if _, err := io.CopyN(io.Discard, tee, int64(pad)); err != nil {
				return nil, fail("read %s: %v", SignatureFile, err)
			}
		}
		hd.Signature = sig
		hd.sigLen = int64(seen.Len() - end)
		hd.entry = seen.Bytes()[:end]
		hd.rest = r
		return hd, nil
	}
	if end > seen.Len() {
		return nil, fail("it ends inside %s", ManifestFile)
	}
	b := seen.Bytes()
	hd.entry, hd.rest = b[:end], io.MultiReader(bytes.NewReader(b[end:]), r)
	return hd, nil
}

// blockEnd rounds n up to a whole tar block.
func blockEnd(n int) int { return (n + 511) &^ 511 }

// Unsigned returns the archive without its signature entry: what a worker's
// Import takes.
func (h *Head) Unsigned() io.Reader {
	return io.MultiReader(bytes.NewReader(h.entry), h.rest)
}

// Signed returns the archive with sig as its signature entry (replacing one
// it had) and how many bytes longer that makes it.
func (h *Head) Signed(sig []byte) (io.Reader, int64, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: SignatureFile, Size: int64(len(sig)), Mode: 0o600, ModTime: h.Manifest.CreatedAt.Truncate(time.Second), Format: tar.FormatUSTAR}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, 0, fmt.Errorf("snapshot: write %s: %w", SignatureFile, err)
	}
	if _, err := tw.Write(sig); err != nil {
		return nil, 0, fmt.Errorf("snapshot: write %s: %w", SignatureFile, err)
	}
	if err := tw.Flush(); err != nil { // pads the entry; no end-of-archive marker
		return nil, 0, fmt.Errorf("snapshot: write %s: %w", SignatureFile, err)
	}
	return io.MultiReader(bytes.NewReader(h.entry), &buf, h.rest), int64(buf.Len()) - h.sigLen, nil
}

// Signature is the content of SignatureFile (JSON).
type Signature struct {
	Alg   string `json:"alg"`    // SignatureAlg
	KeyID string `json:"key_id"` // KeyID of the signing key: names it, reveals nothing of it
	MAC   string `json:"mac"`    // lowercase hex HMAC-SHA256(key, signContext || manifest bytes)
}

// SignatureAlg is the only signature algorithm.
const SignatureAlg = "hmac-sha256"

// signContext separates archive signatures from every other use of a key.
const signContext = "airlock checkpoint archive v1\x00"

// Signature check failures.
var (
	// ErrSignatureKey: the archive was signed with another key (another
	// installation's).
	ErrSignatureKey = model.Errorf(model.ErrInvalid, "signed with another installation's key")
	// ErrSignatureMismatch: the signature names this key but does not match
	// the manifest (modified after export), or is malformed.
	ErrSignatureMismatch = model.Errorf(model.ErrInvalid, "the signature does not match the manifest")
)

// KeyID names an export key without revealing it.
func KeyID(key []byte) string {
	sum := sha256.Sum256(append([]byte("airlock export key id\x00"), key...))
	return hex.EncodeToString(sum[:8])
}

func manifestMAC(key, manifest []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(signContext))
	m.Write(manifest)
	return m.Sum(nil)
}

// Sign returns the SignatureFile content for manifest bytes under key.
func Sign(key, manifest []byte) []byte {
	b, err := json.Marshal(Signature{Alg: SignatureAlg, KeyID: KeyID(key), MAC: hex.EncodeToString(manifestMAC(key, manifest))})
	if err != nil {
		panic(err) // three strings
	}
	return append(b, '\n')
}

// Verify checks SignatureFile content sig over manifest bytes against key:
// nil, ErrSignatureKey or ErrSignatureMismatch.
func Verify(key, manifest, sig []byte) error {
	var s Signature
	if err := json.Unmarshal(sig, &s); err != nil || s.Alg != SignatureAlg {
		return fmt.Errorf("%w (not a %s signature)", ErrSignatureMismatch, SignatureAlg)
	}
	if s.KeyID != KeyID(key) {
		return fmt.Errorf("%w (key %.32q, this installation's is %s)", ErrSignatureKey, s.KeyID, KeyID(key))
	}
	mac, err := hex.DecodeString(s.MAC)
	if err != nil || !hmac.Equal(mac, manifestMAC(key, manifest)) {
		return ErrSignatureMismatch
	}
	return nil
}
