package oci

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/airlock/airlock/internal/model"
)

// maxMetaBytes bounds a manifest, an index or an image config: they are
// read whole.
const maxMetaBytes = 4 << 20

// Annotations that name an image in an OCI layout's index.
const (
	refNameAnnotation    = "org.opencontainers.image.ref.name"
	imageNameAnnotation  = "io.containerd.image.name"
	maxIndexDepth        = 4
	maxManifestsPerIndex = 1024
)

// source is an opened image archive or layout.
type source struct {
	kind  string // "oci-layout" or "docker-archive"
	image v1.Image
}

// open opens src: a directory holding an OCI image layout, or a tar file
// holding an OCI image layout or a `docker save` archive (a layout is
// unpacked into scratch first). It picks the image for platform (or ref).
func open(src, scratch string, o Options) (source, error) {
	fi, err := os.Stat(src)
	if err != nil {
		return source{}, fmt.Errorf("open %s: %w", src, err)
	}
	if fi.IsDir() {
		if _, err := os.Stat(filepath.Join(src, "oci-layout")); err != nil {
			return source{}, fmt.Errorf("%s is a directory without an oci-layout file; give an OCI image layout directory, or a tar archive (OCI layout or docker save): %w", src, model.ErrInvalid)
		}
		img, err := fromLayout(src, o)
		return source{kind: "oci-layout", image: img}, err
	}
	if !fi.Mode().IsRegular() {
		return source{}, fmt.Errorf("%s is neither a directory nor a regular file: %w", src, model.ErrInvalid)
	}
	names, err := scanTar(src)
	if err != nil {
		return source{}, err
	}
	has := func(n string) bool { _, ok := names[n]; return ok }
	switch {
	case has("oci-layout") && has("index.json"):
		dir := filepath.Join(scratch, "layout")
		if err := unpackLayout(src, dir, o.Limits.MaxBytes); err != nil {
			return source{}, err
		}
		img, err := fromLayout(dir, o)
		return source{kind: "oci-layout", image: img}, err
	case has("manifest.json"):
		if names["manifest.json"] > maxMetaBytes {
			return source{}, fmt.Errorf("%s: manifest.json is %d bytes (at most %d): %w", src, names["manifest.json"], maxMetaBytes, model.ErrInvalid)
		}
		img, err := fromDockerArchive(src, names, o)
		return source{kind: "docker-archive", image: img}, err
	}
	return source{}, fmt.Errorf("%s holds neither an OCI image layout (oci-layout, index.json) nor a docker save archive (manifest.json): %w", src, model.ErrInvalid)
}

// scanTar returns the size of every regular file of the tar at p by
// cleaned name.
func scanTar(p string) (map[string]int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", p, err)
	}
	defer f.Close()
	var magic [2]byte
	if _, err := io.ReadFull(f, magic[:]); err == nil && magic == [2]byte{0x1f, 0x8b} {
		return nil, fmt.Errorf("%s is gzip-compressed; decompress it first (gunzip, or docker save without | gzip): %w", p, model.ErrInvalid)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	names := map[string]int64{}
	tr := tar.NewReader(f)
	for n := 0; ; n++ {
		if n > 1<<20 {
			return nil, fmt.Errorf("%s: more than %d entries; not an image archive: %w", p, 1<<20, model.ErrInvalid)
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s is not a readable tar archive: %v: %w", p, err, model.ErrInvalid)
		}
		if hdr.Typeflag == tar.TypeReg || hdr.Typeflag == tar.TypeRegA {
			names[path.Clean(hdr.Name)] = hdr.Size
		}
	}
	return names, nil
}

// blobName matches the blob paths of an OCI layout.
var blobName = regexp.MustCompile(`^blobs/sha256/[0-9a-f]{64}$|^blobs/sha512/[0-9a-f]{128}$`)

// unpackLayout writes the layout files of the tar at p (oci-layout,
// index.json, blobs/<alg>/<hex>; nothing else) into the new directory dir,
// at most maxBytes in all.
func unpackLayout(p, dir string, maxBytes int64) error {
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("open %s: %w", p, err)
	}
	defer f.Close()
	for _, d := range []string{dir, filepath.Join(dir, "blobs", "sha256"), filepath.Join(dir, "blobs", "sha512")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("unpack layout: %w", err)
		}
	}
	var total int64
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: read tar: %v: %w", p, err, model.ErrInvalid)
		}
		if hdr.Typeflag != tar.TypeReg && hdr.Typeflag != tar.TypeRegA {
			continue
		}
		n := path.Clean(hdr.Name)
		if n != "oci-layout" && n != "index.json" && !blobName.MatchString(n) {
			continue // e.g. a docker save's manifest.json beside its layout
		}
		if (n == "oci-layout" || n == "index.json") && hdr.Size > maxMetaBytes {
			return fmt.Errorf("%s: %s is %d bytes (at most %d): %w", p, n, hdr.Size, maxMetaBytes, model.ErrInvalid)
		}
		if total += hdr.Size; total > maxBytes {
			return fmt.Errorf("%s: the layout holds more than %d bytes (Limits.MaxBytes): %w", p, maxBytes, model.ErrInvalid)
		}
		// The name is one of the fixed ones or a hex digest under the
		// directories made above: it cannot leave dir. O_EXCL: a second
		// entry of one name is an error, not an overwrite.
		out, err := os.OpenFile(filepath.Join(dir, filepath.FromSlash(n)), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fmt.Errorf("unpack layout %s: %w", n, err)
		}
		_, err = io.Copy(out, tr)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("unpack layout %s: %w", n, err)
		}
	}
}

// fromLayout picks the image of the layout at dir.
func fromLayout(dir string, o Options) (v1.Image, error) {
	if fi, err := os.Stat(filepath.Join(dir, "index.json")); err != nil {
		return nil, fmt.Errorf("OCI layout %s: %w", dir, err)
	} else if fi.Size() > maxMetaBytes {
		return nil, fmt.Errorf("OCI layout %s: index.json is %d bytes (at most %d): %w", dir, fi.Size(), maxMetaBytes, model.ErrInvalid)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	var found []candidate
	if err := collect(idx, o, 0, false, &found); err != nil {
		return nil, fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	switch len(found) {
	case 1:
		return found[0].image, nil
	case 0:
		what := "image for " + o.platform()
		if o.Ref != "" {
			what += " named " + o.Ref
		}
		return nil, fmt.Errorf("OCI layout %s has no %s: %w", dir, what, model.ErrNotFound)
	}
	var names []string
	for _, c := range found {
		names = append(names, c.name())
	}
	return nil, fmt.Errorf("OCI layout %s has %d images for %s (%s); name one with --ref: %w", dir, len(found), o.platform(), strings.Join(names, ", "), model.ErrInvalid)
}

type candidate struct {
	image v1.Image
	desc  v1.Descriptor
}

func (c candidate) name() string {
	if n := c.desc.Annotations[refNameAnnotation]; n != "" {
		return n
	}
	if n := c.desc.Annotations[imageNameAnnotation]; n != "" {
		return n
	}
	return c.desc.Digest.String()
}

// refMatches reports whether a descriptor's annotations name ref.
func refMatches(d v1.Descriptor, ref string) bool {
	return d.Annotations[refNameAnnotation] == ref || d.Annotations[imageNameAnnotation] == ref
}

// collect gathers the images of idx for o's platform (and ref, matched on
// the outermost descriptor that names one), descending into nested indexes.
func collect(idx v1.ImageIndex, o Options, depth int, named bool, out *[]candidate) error {
	im, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	if len(im.Manifests) > maxManifestsPerIndex {
		return fmt.Errorf("an index with %d manifests (at most %d): %w", len(im.Manifests), maxManifestsPerIndex, model.ErrInvalid)
	}
	for _, d := range im.Manifests {
		if d.Size > maxMetaBytes {
			return fmt.Errorf("manifest %s is %d bytes (at most %d): %w", d.Digest, d.Size, maxMetaBytes, model.ErrInvalid)
		}
		ok := named || o.Ref == "" || refMatches(d, o.Ref)
		switch {
		case d.MediaType.IsIndex():
			if depth >= maxIndexDepth {
				return fmt.Errorf("indexes nested deeper than %d: %w", maxIndexDepth, model.ErrInvalid)
			}
			if !ok {
				continue
			}
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return fmt.Errorf("index %s: %w", d.Digest, err)
			}
			if err := collect(child, o, depth+1, o.Ref != "", out); err != nil {
				return err
			}
		case d.MediaType.IsImage():
			if !ok {
				continue
			}
			if d.Platform != nil && !o.platformMatches(d.Platform.OS, d.Platform.Architecture) {
				continue // e.g. another architecture, or an attestation (unknown/unknown)
			}
			img, err := idx.Image(d.Digest)
			if err != nil {
				return fmt.Errorf("image %s: %w", d.Digest, err)
			}
			if d.Platform == nil {
				// Single-platform layouts often leave the platform out of
				// the index: the config says.
				cf, err := configFile(img)
				if err != nil {
					return fmt.Errorf("image %s: %w", d.Digest, err)
				}
				if !o.platformMatches(cf.OS, cf.Architecture) {
					continue
				}
			}
			*out = append(*out, candidate{image: img, desc: d})
		}
	}
	return nil
}

// fromDockerArchive opens the image of a docker save archive; with several,
// o.Ref names the repo:tag.
func fromDockerArchive(p string, names map[string]int64, o Options) (v1.Image, error) {
	opener := func() (io.ReadCloser, error) { return os.Open(p) }
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, fmt.Errorf("docker archive %s: manifest.json: %v: %w", p, err, model.ErrInvalid)
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("docker archive %s: manifest.json lists no image: %w", p, model.ErrInvalid)
	}
	var tag *name.Tag
	if o.Ref != "" {
		t, err := name.NewTag(o.Ref, name.WeakValidation)
		if err != nil {
			return nil, fmt.Errorf("--ref %q is not an image tag: %v: %w", o.Ref, err, model.ErrInvalid)
		}
		tag = &t
	} else if len(m) > 1 {
		var tags []string
		for _, d := range m {
			tags = append(tags, d.RepoTags...)
		}
		return nil, fmt.Errorf("docker archive %s holds %d images (%s); name one with --ref: %w", p, len(m), strings.Join(tags, ", "), model.ErrInvalid)
	}
	for _, d := range m {
		if sz := names[path.Clean(d.Config)]; sz > maxMetaBytes {
			return nil, fmt.Errorf("docker archive %s: config %s is %d bytes (at most %d): %w", p, d.Config, sz, maxMetaBytes, model.ErrInvalid)
		}
	}
	img, err := tarball.Image(opener, tag)
	if err != nil {
		return nil, fmt.Errorf("docker archive %s: %v: %w", p, err, model.ErrInvalid)
	}
	return img, nil
}

// configFile reads an image's config, bounded.
func configFile(img v1.Image) (*v1.ConfigFile, error) {
	m, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	if m.Config.Size > maxMetaBytes {
		return nil, fmt.Errorf("config is %d bytes (at most %d): %w", m.Config.Size, maxMetaBytes, model.ErrInvalid)
	}
	return img.ConfigFile()
}
