// Package ocitest builds OCI images from entries listed in a test, with
// go-containerregistry's own writers (tarball layers, mutate, layout), for
// the tests of the importer (internal/image/oci), the CLI and the
// end-to-end suite. No registry is involved.
package ocitest

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"runtime"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Entry is one tar entry of a layer.
type Entry struct {
	Name     string
	Type     byte // tar.Type*
	Mode     int64
	UID, GID int
	Body     string // a regular file's content
	Link     string // a symlink's or hard link's target
	Xattrs   map[string]string
}

// Dir is a directory entry.
func Dir(name string, mode int64) Entry { return Entry{Name: name, Type: tar.TypeDir, Mode: mode} }

// File is a regular file entry.
func File(name, body string, mode int64) Entry {
	return Entry{Name: name, Type: tar.TypeReg, Mode: mode, Body: body}
}

// Symlink is a symbolic link entry.
func Symlink(name, target string) Entry {
	return Entry{Name: name, Type: tar.TypeSymlink, Mode: 0o777, Link: target}
}

// Hardlink is a hard link entry to the earlier entry target.
func Hardlink(name, target string) Entry {
	return Entry{Name: name, Type: tar.TypeLink, Mode: 0o644, Link: target}
}

// Owned returns e owned by uid:gid.
func (e Entry) Owned(uid, gid int) Entry { e.UID, e.GID = uid, gid; return e }

// MTime is every entry's modification time.
var MTime = time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)

// LayerTar writes entries as an uncompressed tar (PAX, for xattrs).
func LayerTar(t testing.TB, es []Entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		hdr := &tar.Header{Name: e.Name, Typeflag: e.Type, Mode: e.Mode, Uid: e.UID, Gid: e.GID, Linkname: e.Link, ModTime: MTime, Format: tar.FormatPAX}
		if e.Type == tar.TypeReg {
			hdr.Size = int64(len(e.Body))
		}
		if e.Type == tar.TypeChar || e.Type == tar.TypeBlock {
			hdr.Devmajor, hdr.Devminor = 1, 3
		}
		for k, v := range e.Xattrs {
			if hdr.PAXRecords == nil {
				hdr.PAXRecords = map[string]string{}
			}
			hdr.PAXRecords["SCHILY.xattr."+k] = v
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("tar header %s: %v", e.Name, err)
		}
		if e.Type == tar.TypeReg {
			if _, err := io.WriteString(tw, e.Body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Image makes a linux image for this machine's architecture of the layers,
// in order, with cfg as its config.
func Image(t testing.TB, cfg v1.Config, layers ...[]Entry) v1.Image {
	t.Helper()
	img := empty.Image
	for _, es := range layers {
		b := LayerTar(t, es)
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
		if err != nil {
			t.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			t.Fatal(err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", runtime.GOARCH, cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// RefName is the ref.name annotation WriteLayout gives the image.
const RefName = "test"

// WriteLayout writes img as an OCI image layout directory at dir.
func WriteLayout(t testing.TB, img v1.Image, dir string) {
	t.Helper()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": RefName})); err != nil {
		t.Fatal(err)
	}
}

// TarDir writes the tree at dir as a tar file at out (a layout tar).
func TarDir(t testing.TB, dir, out string) {
	t.Helper()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}
