package blob_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/blob"
	"github.com/airlock/airlock/internal/blob/blobtest"
	"github.com/airlock/airlock/internal/model"
)

func TestStores(t *testing.T) {
	for name, open := range blobtest.Backends {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			ctx := context.Background()

			if _, _, err := s.Get(ctx, "a/missing"); !errors.Is(err, blob.ErrNotFound) {
				t.Fatalf("get missing: %v, want ErrNotFound", err)
			}
			if _, err := s.Stat(ctx, "a/missing"); !errors.Is(err, blob.ErrNotFound) {
				t.Fatalf("stat missing: %v, want ErrNotFound", err)
			}
			if err := s.Delete(ctx, "a/missing"); err != nil {
				t.Fatalf("delete missing: %v", err)
			}

			small := []byte("hello, blob")
			if err := s.Put(ctx, "a/small", bytes.NewReader(small), int64(len(small))); err != nil {
				t.Fatal(err)
			}
			// Big enough for a multipart upload in parallel parts (S3),
			// from a file as snapshots are uploaded.
			big := make([]byte, blob.PartSize*2+12345)
			rand.Read(big)
			fp := filepath.Join(t.TempDir(), "big")
			if err := os.WriteFile(fp, big, 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(fp)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := s.Put(ctx, "a/b/big", f, int64(len(big))); err != nil {
				t.Fatal(err)
			}
			for key, want := range map[string][]byte{"a/small": small, "a/b/big": big} {
				rc, n, err := s.Get(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(rc)
				rc.Close()
				if err != nil {
					t.Fatal(err)
				}
				if n != int64(len(want)) || !bytes.Equal(got, want) {
					t.Fatalf("%s: got %d bytes (size %d), want %d identical", key, len(got), n, len(want))
				}
				o, err := s.Stat(ctx, key)
				if err != nil || o.Size != int64(len(want)) || o.Key != key {
					t.Fatalf("stat %s: %+v %v", key, o, err)
				}
			}

			// Replacing is whole.
			if err := s.Put(ctx, "a/small", strings.NewReader("v2"), 2); err != nil {
				t.Fatal(err)
			}
			if got := read(t, s, "a/small"); got != "v2" {
				t.Fatalf("after replace: %q", got)
			}

			// A reader shorter than the size given leaves nothing new.
			if err := s.Put(ctx, "a/short", strings.NewReader("abc"), 10); err == nil {
				t.Fatal("put of 3 bytes with size 10 succeeded")
			}
			if _, err := s.Stat(ctx, "a/short"); !errors.Is(err, blob.ErrNotFound) {
				t.Fatalf("short put left an object: %v", err)
			}
			// And a longer one.
			if err := s.Put(ctx, "a/long", strings.NewReader("abcdef"), 3); err == nil {
				t.Fatal("put of 6 bytes with size 3 succeeded")
			}
			if _, err := s.Stat(ctx, "a/long"); !errors.Is(err, blob.ErrNotFound) {
				t.Fatalf("long put left an object: %v", err)
			}

			if err := s.Put(ctx, "c", strings.NewReader("c"), 1); err != nil {
				t.Fatal(err)
			}
			list := func(prefix string) string {
				os, err := s.List(ctx, prefix)
				if err != nil {
					t.Fatal(err)
				}
				var keys []string
				for _, o := range os {
					keys = append(keys, o.Key)
				}
				return strings.Join(keys, ",")
			}
			if got, want := list(""), "a/b/big,a/small,c"; got != want {
				t.Fatalf("list: %s, want %s", got, want)
			}
			if got, want := list("a/"), "a/b/big,a/small"; got != want {
				t.Fatalf("list a/: %s, want %s", got, want)
			}
			if got, want := list("a/s"), "a/small"; got != want {
				t.Fatalf("list a/s: %s, want %s", got, want)
			}
			if got := list("zzz/"); got != "" {
				t.Fatalf("list zzz/: %s", got)
			}

			if err := s.Delete(ctx, "a/b/big"); err != nil {
				t.Fatal(err)
			}
			if _, _, err := s.Get(ctx, "a/b/big"); !errors.Is(err, blob.ErrNotFound) {
				t.Fatalf("get deleted: %v", err)
			}
			if got, want := list(""), "a/small,c"; got != want {
				t.Fatalf("list after delete: %s, want %s", got, want)
			}

			for _, bad := range []string{"", "/a", "a//b", "a/../b", "..", "a/.hidden", "A", "a b", "a\x00", strings.Repeat("x", blob.MaxKeyLen+1)} {
				if err := s.Put(ctx, bad, strings.NewReader("x"), 1); !errors.Is(err, model.ErrInvalid) {
					t.Errorf("put %q: %v, want ErrInvalid", bad, err)
				}
				if _, _, err := s.Get(ctx, bad); !errors.Is(err, model.ErrInvalid) {
					t.Errorf("get %q: %v, want ErrInvalid", bad, err)
				}
			}
		})
	}
}

func read(t *testing.T, s blob.Store, key string) string {
	t.Helper()
	rc, _, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestOpenRefusesBadURLs(t *testing.T) {
	for _, u := range []string{
		"", "/tmp/x", "ftp://x", "file://host/dir", "file:///tmp/x?y=1", "file://relative",
		"s3://", "s3://key:secret@bucket", "s3://bucket?endpoint=ftp://x", "s3://bucket?endpoint=http://h/path", "s3://bucket?color=red", "s3://bucket/UPPER",
	} {
		if _, err := blob.Open(context.Background(), u); !errors.Is(err, model.ErrInvalid) {
			t.Errorf("open %q: %v, want ErrInvalid", u, err)
		}
	}
}

func TestDirKeepsNoTemporaryFiles(t *testing.T) {
	dir := t.TempDir()
	s, err := blob.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Put(ctx, "x/y", strings.NewReader("data"), 4); err == nil {
		t.Fatal("put with a cancelled context succeeded")
	}
	var left []string
	filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if !e.IsDir() {
			left = append(left, p)
		}
		return nil
	})
	if len(left) != 0 {
		t.Fatalf("files left after a failed put: %v", left)
	}
	if s.String() != "file://"+dir {
		t.Fatalf("String: %s", s.String())
	}
}
