package agent

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/testenv"
)

// FuzzOpenDir walks arbitrary paths through a tree that holds what guest
// code can plant: symlinks made by a user (one to a directory outside the
// tree, one inside), root's own symlinks (relative, absolute, to itself,
// to a file), a file and a FIFO in the way. Paths never contain "..", and
// every root symlink stays inside the tree, so whatever the walk opens
// or creates must be inside it: a result outside, or anything made in the
// directory the user's symlink points to, is a symlink followed that must
// not be. The walk must not leak a descriptor, and without create it must
// make nothing.
func FuzzOpenDir(f *testing.F) {
	testenv.RequireRoot(f, "the fixture's symlinks are owned by another user, as guest code plants them")
	base := f.TempDir()
	tree, outside := filepath.Join(base, "tree"), filepath.Join(base, "outside")
	for _, d := range []string{outside, filepath.Join(tree, "a", "b")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(tree, "f"), []byte("x"), 0o644); err != nil {
		f.Fatal(err)
	}
	links := []struct {
		name, target string
		uid          int
	}{
		{"rl", "a/b", 0},
		{"rself", ".", 0},
		{"rloop", "rloop", 0},
		{"rabs", filepath.Join(tree, "a"), 0},
		{"rfile", "f", 0},
		{"ul", outside, 1000},
		{"a/ul2", "../../outside", 1000},
	}
	for _, l := range links {
		p := filepath.Join(tree, l.name)
		if err := os.Symlink(l.target, p); err != nil {
			f.Fatal(err)
		}
		if err := os.Lchown(p, l.uid, l.uid); err != nil {
			f.Fatal(err)
		}
	}
	if err := unix.Mkfifo(filepath.Join(tree, "p"), 0o644); err != nil {
		f.Fatal(err)
	}

	for _, s := range []string{"", "a", "a/b", "rl", "rl/new", "rself/rself/a", "rloop", "rloop/x", "rabs/b",
		"rfile", "rfile/x", "ul", "ul/x", "a/ul2", "a/ul2/x", "p", "p/x", "f", "//a//b/", "./a/./b", "rabs/ul2/x"} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, rel string, create bool) {
		if strings.Contains(rel, "..") || strings.ContainsRune(rel, 0) {
			t.Skip()
		}
		var before []string
		if !create {
			before = listTree(t, tree)
		}
		fds := countFDs(t)
		d, err := walker{create: create, mode: 0o750}.openDir(tree + "/" + rel)
		if err == nil {
			got, lerr := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(d.Fd())))
			d.Close()
			if lerr != nil {
				t.Fatal(lerr)
			}
			if got != tree && !strings.HasPrefix(got, tree+"/") {
				t.Fatalf("openDir(%q) opened %s, outside the tree", rel, got)
			}
		}
		if n := countFDs(t); n != fds {
			t.Fatalf("openDir(%q) (err %v) leaked %d descriptors", rel, err, n-fds)
		}
		if ents, _ := os.ReadDir(outside); len(ents) > 0 {
			t.Fatalf("openDir(%q, create=%v) made %s in the directory a user's symlink points to", rel, create, ents[0].Name())
		}
		if !create && !slices.Equal(before, listTree(t, tree)) {
			t.Fatalf("openDir(%q) without create changed the tree", rel)
		}
	})
}

func listTree(t *testing.T, root string) []string {
	var out []string
	filepath.WalkDir(root, func(p string, _ os.DirEntry, err error) error {
		out = append(out, p)
		return nil
	})
	return out
}

func countFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}
