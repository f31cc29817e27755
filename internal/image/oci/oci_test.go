package oci

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/image"
	"github.com/airlock/airlock/internal/image/oci/ocitest"
	"github.com/airlock/airlock/internal/model"
)

type entry = ocitest.Entry

var (
	dir      = ocitest.Dir
	file     = ocitest.File
	symlink  = ocitest.Symlink
	hardlink = ocitest.Hardlink
	tarDir   = ocitest.TarDir
)

func buildImage(t *testing.T, cfg v1.Config, layers ...[]entry) v1.Image {
	return ocitest.Image(t, cfg, layers...)
}

func writeLayout(t *testing.T, img v1.Image, dir string) { ocitest.WriteLayout(t, img, dir) }

// fakeAgent is a stand-in for airlock-agent: the importer copies it
// verbatim, so any file does.
func fakeAgent(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "airlock-agent")
	if err := os.WriteFile(p, []byte("\x7fELF agent"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// workDir is a t.TempDir whose read-only directories (the images' own)
// do not stop its removal without root.
func workDir(t *testing.T) string {
	d := t.TempDir()
	t.Cleanup(func() { removeTree(d) })
	return d
}

func importOpts(t *testing.T, agent, nameTag string) Options {
	n, tag, _ := strings.Cut(nameTag, ":")
	return Options{Name: n, Tag: tag, Agent: agent, NoOwners: os.Geteuid() != 0}
}

// listing describes the tree at root, one line per entry, in path order:
// path, type, mode (with setuid/setgid/sticky), owner when checked, and
// the content of a file or the target of a symlink.
func listing(t *testing.T, root string, owners bool) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		line := fmt.Sprintf("%s %s %04o", rel, typeName(fi.Mode()), st.Mode&0o7777)
		if owners {
			line += fmt.Sprintf(" %d:%d", st.Uid, st.Gid)
		}
		switch {
		case fi.Mode().IsRegular() && rel != AgentPath:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line += " " + fmt.Sprintf("%q", b)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			line += " -> " + target
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func typeName(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "file"
	case m.IsDir():
		return "dir"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m&fs.ModeNamedPipe != 0:
		return "fifo"
	}
	return "other"
}

// The test image: two layers exercising whiteouts, an opaque directory,
// hard links (within and across layers), symlinks (one pointing outside
// the root, one absolute, replaced by a file in the next layer), a device
// node (skipped), a fifo, setuid and sticky modes, owners and xattrs.
func testImage(t *testing.T) v1.Image {
	own := func(e entry, uid, gid int) entry { return e.Owned(uid, gid) }
	tool := file("usr/bin/tool", "#!/bin/sh\necho tool\n", 0o755).Owned(1001, 1001)
	tool.Xattrs = map[string]string{"user.airlock.test": "yes", "trusted.overlay.opaque": "y"}
	l1 := []entry{
		dir("etc", 0o755),
		file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\napp:x:1001:1001::/home/app:/bin/sh\n", 0o644),
		symlink("etc/alt", "/usr/bin/tool"),
		dir("usr", 0o755), dir("usr/bin", 0o755),
		tool,
		hardlink("usr/bin/tool-link", "usr/bin/tool"),
		file("usr/bin/suid", "suid", 0o4755),
		symlink("escape", "../../../../../../tmp"),
		dir("old", 0o755), file("old/a", "a", 0o644), file("old/b", "b", 0o644),
		dir("opq", 0o750), file("opq/x", "x", 0o644), dir("opq/sub", 0o755), file("opq/sub/y", "y", 0o644),
		file("gone", "gone", 0o644),
		dir("tmp", 0o1777),
		dir("dev", 0o755), {Name: "dev/null", Type: tar.TypeChar, Mode: 0o666}, hardlink("dev/null2", "dev/null"),
		dir("run", 0o755), {Name: "run/fifo", Type: tar.TypeFifo, Mode: 0o640},
		own(dir("home/app", 0o700), 1001, 1001),
		own(dir("srv", 0o755), 1001, 1001),
		// A read-only directory still takes its children.
		dir("ro", 0o555), file("ro/f", "f", 0o444),
	}
	l2 := []entry{
		file(".wh.gone", "", 0o644),
		file("old/.wh.a", "", 0o644),
		file("opq/.wh..wh..opq", "", 0o644),
		file("opq/new", "new", 0o600),
		file("etc/alt", "replaced", 0o644), // replaces the symlink, not written through it
		hardlink("usr/bin/tool-link2", "usr/bin/tool"),
		file("srv/app.conf", "port=8080\n", 0o640),
	}
	cfg := v1.Config{
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=hello", "GREETING=hello world"},
		WorkingDir: "/srv",
		User:       "app",
		Entrypoint: []string{"/usr/bin/tool"},
		Cmd:        []string{"--serve"},
	}
	return buildImage(t, cfg, l1, l2)
}

// wantTree is testImage's tree after import (owners when run as root).
var wantTree = []string{
	". dir 0755 0:0",
	"dev dir 0755 0:0",
	"escape symlink 0777 0:0 -> ../../../../../../tmp",
	"etc dir 0755 0:0",
	`etc/alt file 0644 0:0 "replaced"`,
	`etc/passwd file 0644 0:0 "root:x:0:0:root:/root:/bin/sh\napp:x:1001:1001::/home/app:/bin/sh\n"`,
	"home dir 0755 0:0",
	"home/app dir 0700 1001:1001",
	"old dir 0755 0:0",
	`old/b file 0644 0:0 "b"`,
	"opq dir 0750 0:0",
	`opq/new file 0600 0:0 "new"`,
	"ro dir 0555 0:0",
	`ro/f file 0444 0:0 "f"`,
	"run dir 0755 0:0",
	"run/fifo fifo 0640 0:0",
	"srv dir 0755 1001:1001",
	`srv/app.conf file 0640 0:0 "port=8080\n"`,
	"tmp dir 1777 0:0",
	"usr dir 0755 0:0",
	"usr/bin dir 0755 0:0",
	`usr/bin/suid file 4755 0:0 "suid"`,
	`usr/bin/tool file 0755 1001:1001 "#!/bin/sh\necho tool\n"`,
	`usr/bin/tool-link file 0755 1001:1001 "#!/bin/sh\necho tool\n"`,
	`usr/bin/tool-link2 file 0755 1001:1001 "#!/bin/sh\necho tool\n"`,
	"usr/local dir 0755 0:0",
	"usr/local/bin dir 0755 0:0",
	"usr/local/bin/airlock-agent file 0755 0:0",
}

func wantListing(owners bool) []string {
	if owners {
		return wantTree
	}
	var out []string
	for _, l := range wantTree {
		f := strings.SplitN(l, " ", 5) // path type mode owner [rest]
		out = append(out, strings.Join(slices.Delete(f, 3, 4), " "))
	}
	return out
}

func TestImportLayout(t *testing.T) {
	img := testImage(t)
	agent := fakeAgent(t)
	work := workDir(t)
	lay := filepath.Join(work, "layout")
	writeLayout(t, img, lay)

	data := filepath.Join(work, "data")
	rep, err := Import(context.Background(), data, lay, importOpts(t, agent, "app:1.0"))
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	tp := rep.Template
	if tp.Name != "app" || tp.Tag != "1.0" || !strings.HasPrefix(tp.Digest, "sha256:") || rep.Existing || rep.Source != "oci-layout" || rep.Layers != 2 {
		t.Fatalf("report = %+v", rep)
	}
	owners := os.Geteuid() == 0
	rootfs := image.TemplateRootFS(data, tp.Digest)
	if got, want := listing(t, rootfs, owners), wantListing(owners); !slices.Equal(got, want) {
		t.Errorf("tree:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Hard links share one inode, across layers too.
	ino := func(p string) uint64 {
		fi, err := os.Lstat(filepath.Join(rootfs, p))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	if a, b, c := ino("usr/bin/tool"), ino("usr/bin/tool-link"), ino("usr/bin/tool-link2"); a != b || a != c {
		t.Errorf("hard links: inodes %d %d %d, want one", a, b, c)
	}
	if ino("usr/bin/suid") == ino("usr/bin/tool") {
		t.Error("distinct files share an inode")
	}
	// Modification times are the layer's.
	if fi, err := os.Lstat(filepath.Join(rootfs, "etc/passwd")); err != nil || !fi.ModTime().Equal(ocitest.MTime) {
		t.Errorf("etc/passwd mtime = %v, %v", fi.ModTime(), err)
	}
	if fi, err := os.Lstat(filepath.Join(rootfs, "ro")); err != nil || !fi.ModTime().Equal(ocitest.MTime) {
		t.Errorf("ro mtime = %v, %v (a directory's mtime is set after its children)", fi.ModTime(), err)
	}
	// The agent is the given binary.
	if b, err := os.ReadFile(filepath.Join(rootfs, AgentPath)); err != nil || string(b) != "\x7fELF agent" {
		t.Errorf("agent = %q, %v", b, err)
	}
	// Device nodes are skipped and reported.
	if rep.DevicesSkipped != 2 || !slices.Equal(rep.Devices, []string{"/dev/null", "/dev/null2"}) {
		t.Errorf("devices: %d %v, want /dev/null and its hard link", rep.DevicesSkipped, rep.Devices)
	}
	// user.* is restored where the file system takes it; trusted.* never.
	buf := make([]byte, 64)
	n, err := unix.Lgetxattr(filepath.Join(rootfs, "usr/bin/tool"), "user.airlock.test", buf)
	switch {
	case err == nil:
		if string(buf[:n]) != "yes" || rep.Xattrs != 1 || rep.XattrsSkipped != 1 {
			t.Errorf("xattr = %q; report %d restored %d skipped, want yes, 1, 1", buf[:n], rep.Xattrs, rep.XattrsSkipped)
		}
	case errors.Is(err, unix.ENOTSUP):
		if rep.Xattrs != 0 || rep.XattrsSkipped != 2 {
			t.Errorf("no user xattrs here; report %d restored %d skipped, want 0, 2", rep.Xattrs, rep.XattrsSkipped)
		}
	default:
		t.Errorf("user.airlock.test: %v", err)
	}
	if _, err := unix.Lgetxattr(filepath.Join(rootfs, "usr/bin/tool"), "trusted.overlay.opaque", buf); err == nil {
		t.Error("trusted.overlay.opaque was restored")
	}

	// The config, stored with the template in the catalog.
	got, err := image.ReadTemplate(data, tp.Digest)
	if err != nil {
		t.Fatal(err)
	}
	want := &model.TemplateConfig{
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=hello", "GREETING=hello world"},
		WorkingDir: "/srv", User: "app", Entrypoint: []string{"/usr/bin/tool"}, Cmd: []string{"--serve"},
	}
	if got.Config == nil || fmt.Sprint(*got.Config) != fmt.Sprint(*want) {
		t.Errorf("stored config = %+v, want %+v", got.Config, want)
	}
	if env := got.Config.EnvMap(); env["GREETING"] != "hello world" || got.Config.CommandUser() != "app" {
		t.Errorf("EnvMap = %v, CommandUser = %q", env, got.Config.CommandUser())
	}
	if ts, err := image.ListTemplates(data); err != nil || len(ts) != 1 || ts[0].Digest != tp.Digest {
		t.Errorf("ListTemplates = %v, %v", ts, err)
	}
	// No host user but root reaches the tree (it holds setuid programs).
	if fi, err := os.Stat(filepath.Dir(rootfs)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("template directory mode = %v, %v; want 0700", fi.Mode(), err)
	}
	// Scratch is gone.
	if left, _ := filepath.Glob(filepath.Join(data, "templates", ".import-*")); len(left) != 0 {
		t.Errorf("scratch left behind: %v", left)
	}

	// Importing it again is a no-op with the same digest; under another
	// name it is a conflict.
	again, err := Import(context.Background(), data, lay, importOpts(t, agent, "app:1.0"))
	if err != nil || !again.Existing || again.Template.Digest != tp.Digest {
		t.Errorf("second import = %+v, %v; want the existing %s", again, err, tp.Digest)
	}
	if _, err := Import(context.Background(), data, lay, importOpts(t, agent, "other")); !errors.Is(err, model.ErrConflict) {
		t.Errorf("import under another name: %v, want a conflict", err)
	}
}

// The same image as a layout directory, a tar of that layout and a docker
// save archive, each into its own data directory, gives one digest: the
// digest is content-addressed and stable.
func TestImportFormatsOneDigest(t *testing.T) {
	img := testImage(t)
	agent := fakeAgent(t)
	work := workDir(t)
	lay := filepath.Join(work, "layout")
	writeLayout(t, img, lay)
	layTar := filepath.Join(work, "layout.tar")
	tarDir(t, lay, layTar)
	docker := filepath.Join(work, "docker.tar")
	tag, err := name.NewTag("example.test/app:1.0")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(docker, tag, img); err != nil {
		t.Fatal(err)
	}
	digests := map[string]string{}
	for i, src := range []string{lay, layTar, docker} {
		rep, err := Import(context.Background(), filepath.Join(work, fmt.Sprint("data", i)), src, importOpts(t, agent, "app:1.0"))
		if err != nil {
			t.Fatalf("import %s: %v", src, err)
		}
		digests[filepath.Base(src)+" "+rep.Source] = rep.Template.Digest
	}
	var first string
	for k, d := range digests {
		if first == "" {
			first = d
		}
		if d != first {
			t.Errorf("digests differ: %v", digests)
			break
		}
		_ = k
	}
	if _, ok := digests["docker.tar docker-archive"]; !ok {
		t.Errorf("the docker archive was not read as one: %v", digests)
	}
	// A different config is a different template.
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.Config.Env = append(cf.Config.Env, "EXTRA=1")
	img2, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	lay2 := filepath.Join(work, "layout2")
	writeLayout(t, img2, lay2)
	rep, err := Import(context.Background(), filepath.Join(work, "data9"), lay2, importOpts(t, agent, "app:1.0"))
	if err != nil || rep.Template.Digest == first {
		t.Errorf("import with another Env: %s, %v; want a digest other than %s", rep.Template.Digest, err, first)
	}
}

// Hostile layers are refused, with a message naming the entry, and write
// nothing outside the root.
func TestImportHostile(t *testing.T) {
	agent := fakeAgent(t)
	work := workDir(t)
	canary := filepath.Join(work, "canary")
	if err := os.MkdirAll(canary, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(canary, "secret"), []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(work, "data")
	// From the root (data/templates/.import-X/rootfs), "../../../../canary"
	// is the canary.
	up := "../../../../canary"
	cases := []struct {
		name   string
		layers [][]entry
		want   string
	}{
		{"dotdot file", [][]entry{{file(up+"/evil", "evil", 0o644)}}, "leaves the root"},
		{"dotdot inside", [][]entry{{dir("a", 0o755), file("a/../../evil", "evil", 0o644)}}, "leaves the root"},
		{"absolute file", [][]entry{{file(canary+"/evil", "evil", 0o644)}}, "leaves the root"},
		{"absolute symlink then write", [][]entry{{symlink("link", canary), file("link/evil", "evil", 0o644)}}, `parent "link" is a symbolic link`},
		{"relative symlink then write", [][]entry{{symlink("link", up), file("link/evil", "evil", 0o644)}}, `parent "link" is a symbolic link`},
		{"symlink then dir", [][]entry{{symlink("link", canary), dir("link/sub", 0o755)}}, `parent "link" is a symbolic link`},
		{"symlink in one layer, write in the next", [][]entry{{dir("etc", 0o755), symlink("etc/d", canary)}, {file("etc/d/evil", "evil", 0o644)}}, `parent "etc/d" is a symbolic link`},
		{"whiteout through a symlink", [][]entry{{symlink("link", canary)}, {file("link/.wh.secret", "", 0o644)}}, `parent "link" is a symbolic link`},
		{"opaque through a symlink", [][]entry{{symlink("link", canary)}, {file("link/.wh..wh..opq", "", 0o644)}}, `parent "link" is a symbolic link`},
		{"whiteout of ..", [][]entry{{dir("a", 0o755)}, {file("a/.wh...", "", 0o644)}}, `a whiteout of ".."`},
		{"whiteout of .", [][]entry{{dir("a", 0o755)}, {file("a/.wh..", "", 0o644)}}, `a whiteout of "."`},
		{"dotdot whiteout", [][]entry{{file(up+"/.wh.secret", "", 0o644)}}, "leaves the root"},
		{"hard link outside", [][]entry{{hardlink("hl", up+"/secret")}}, "leaves the root"},
		{"hard link absolute", [][]entry{{hardlink("hl", canary+"/secret")}}, "leaves the root"},
		{"hard link through a symlink", [][]entry{{symlink("link", canary), hardlink("hl", "link/secret")}}, `parent "link" is a symbolic link`},
		{"hard link to a directory", [][]entry{{dir("d", 0o755), hardlink("hl", "d")}}, "hard link to the directory"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			img := buildImage(t, v1.Config{}, c.layers...)
			lay := filepath.Join(t.TempDir(), "layout")
			writeLayout(t, img, lay)
			_, err := Import(context.Background(), data, lay, importOpts(t, agent, "evil"))
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Import = %v; want a refusal saying %q", err, c.want)
			}
			t.Log(err)
			checkCanary(t, canary)
			if ts, _ := image.ListTemplates(data); len(ts) != 0 {
				t.Errorf("a template was added: %v", ts)
			}
			if left, _ := filepath.Glob(filepath.Join(data, "templates", ".import-*")); len(left) != 0 {
				t.Errorf("scratch left behind: %v", left)
			}
		})
	}
}

// checkCanary fails unless canary holds exactly its secret, unchanged.
func checkCanary(t *testing.T, canary string) {
	t.Helper()
	es, err := os.ReadDir(canary)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 1 || es[0].Name() != "secret" {
		var names []string
		for _, e := range es {
			names = append(names, e.Name())
		}
		t.Fatalf("canary holds %v; something was written outside the root", names)
	}
	if b, err := os.ReadFile(filepath.Join(canary, "secret")); err != nil || string(b) != "secret" {
		t.Fatalf("canary secret = %q, %v", b, err)
	}
	fi, err := os.Stat(filepath.Join(canary, "secret"))
	if err != nil || fi.Mode().Perm() != 0o644 || fi.Sys().(*syscall.Stat_t).Nlink != 1 {
		t.Fatalf("canary secret changed: %v, %v", fi.Mode(), err)
	}
}

func TestImportLimits(t *testing.T) {
	agent := fakeAgent(t)
	var es []entry
	for i := range 10 {
		es = append(es, file(fmt.Sprintf("f%d", i), strings.Repeat("x", 1000), 0o644))
	}
	img := buildImage(t, v1.Config{}, es)
	lay := filepath.Join(t.TempDir(), "layout")
	writeLayout(t, img, lay)
	for _, c := range []struct {
		limits Limits
		want   string
	}{
		{Limits{MaxEntries: 5}, "more than 5 entries"},
		{Limits{MaxBytes: 4000}, "more than 4000 bytes"},
		{Limits{MaxLayers: 1}, ""}, // one layer: fine
	} {
		o := importOpts(t, agent, "big")
		o.Limits = c.limits
		_, err := Import(context.Background(), workDir(t), lay, o)
		if c.want == "" {
			if err != nil {
				t.Errorf("limits %+v: %v", c.limits, err)
			}
			continue
		}
		if !errors.Is(err, model.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("limits %+v: %v; want an error saying %q", c.limits, err, c.want)
		}
	}
	img2 := buildImage(t, v1.Config{}, es[:1], es[1:2])
	lay2 := filepath.Join(t.TempDir(), "layout")
	writeLayout(t, img2, lay2)
	o := importOpts(t, agent, "big")
	o.Limits.MaxLayers = 1
	if _, err := Import(context.Background(), workDir(t), lay2, o); err == nil || !strings.Contains(err.Error(), "2 layers (at most 1") {
		t.Errorf("two layers with MaxLayers 1: %v", err)
	}
}

// A layer blob replaced by another valid one is caught by its diff_id.
func TestImportAlteredLayer(t *testing.T) {
	agent := fakeAgent(t)
	img := buildImage(t, v1.Config{}, []entry{file("f", "good", 0o644)})
	lay := filepath.Join(t.TempDir(), "layout")
	writeLayout(t, img, lay)
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	d, err := ls[0].Digest()
	if err != nil {
		t.Fatal(err)
	}
	evil := buildImage(t, v1.Config{}, []entry{file("f", "evil", 0o644)})
	els, _ := evil.Layers()
	rc, err := els[0].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if err := os.WriteFile(filepath.Join(lay, "blobs", "sha256", d.Hex), b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Import(context.Background(), workDir(t), lay, importOpts(t, agent, "x"))
	if !errors.Is(err, model.ErrInvalid) || !strings.Contains(err.Error(), "corrupt or altered") {
		t.Fatalf("Import = %v; want the diff_id mismatch", err)
	}
}

func TestImportRejects(t *testing.T) {
	agent := fakeAgent(t)
	work := workDir(t)
	img := buildImage(t, v1.Config{}, []entry{file("f", "x", 0o644)})
	lay := filepath.Join(work, "layout")
	writeLayout(t, img, lay)

	// Another architecture.
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.Architecture = "s390x"
	other, _ := mutate.ConfigFile(img, cf)
	layOther := filepath.Join(work, "other")
	writeLayout(t, other, layOther)

	gz := filepath.Join(work, "x.tar.gz")
	os.WriteFile(gz, []byte{0x1f, 0x8b, 8, 0}, 0o644)
	notImage := filepath.Join(work, "plain.tar")
	tarDir(t, filepath.Join(lay, "blobs"), notImage)

	for _, c := range []struct {
		src, name, want string
	}{
		{lay, "Bad/Name", "template name"},
		{filepath.Join(work, "missing"), "x", "no such file"},
		{work, "x", "without an oci-layout file"},
		{gz, "x", "gzip-compressed"},
		{notImage, "x", "neither an OCI image layout"},
		{layOther, "x", "no image for linux/" + runtime.GOARCH},
	} {
		_, err := Import(context.Background(), filepath.Join(work, "data"), c.src, importOpts(t, agent, c.name))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Import(%s, %s) = %v; want an error saying %q", c.src, c.name, err, c.want)
		}
	}
}
