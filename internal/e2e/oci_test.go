package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/image"
	"github.com/airlock/airlock/internal/image/oci/ocitest"
	"github.com/airlock/airlock/internal/model"
)

// An OCI image built here from local files (no registry), imported with
// `airlock template import` into the worker's catalog: a sandbox from it,
// gVisor and QEMU alike, sees exactly the image's tree (whiteouts, an opaque directory,
// hard and symbolic links, owners) and runs commands with the image's
// Env, WorkingDir and User as defaults.
func TestImportedOCITemplate(t *testing.T) {
	s := need(t)
	c := s.client()
	lay := ociE2ELayout(t)
	cli := airlockCLI(t, s, append(os.Environ(), "AIRLOCK_URL="+s.url(), "AIRLOCK_API_KEY="+s.adminKey))
	out, code := cli("", "template", "import", lay, "--name", "oci-e2e:v1", "--data-dir", s.workerDir)
	checkImportedTemplate(t, s, c, out, code, "gvisor", "qemu")
}

// The same image sent through the API (`airlock template import --upload`,
// POST /v1/templates: no root, no worker data directory on the caller's
// side) gives the same template; a hostile layer is refused with a 422
// naming the entry, and nothing is written outside.
func TestImportedOCITemplateUpload(t *testing.T) {
	s := need(t)
	c := s.client()
	lay := ociE2ELayout(t)
	cli := airlockCLI(t, s, append(os.Environ(), "AIRLOCK_URL="+s.url(), "AIRLOCK_API_KEY="+s.adminKey))
	out, code := cli("", "template", "import", lay, "--upload", "--name", "oci-e2e:v1")
	checkImportedTemplate(t, s, c, out, code, "gvisor")

	outside := filepath.Join(t.TempDir(), "outside")
	img := ocitest.Image(t, v1.Config{}, []ocitest.Entry{ocitest.Dir("bin", 0o755), ocitest.File("../../../../../../.."+outside, "pwned", 0o644)})
	bad := filepath.Join(t.TempDir(), "bad")
	ocitest.WriteLayout(t, img, bad)
	cmd := exec.Command(filepath.Join(s.bin, "airlock"), "template", "import", bad, "--upload", "--name", "oci-bad:v1")
	cmd.Env = append(os.Environ(), "AIRLOCK_URL="+s.url(), "AIRLOCK_API_KEY="+s.adminKey)
	b, err := cmd.CombinedOutput()
	out, code = string(b), cmd.ProcessState.ExitCode()
	if err == nil || code == 0 || !strings.Contains(out, "HTTP 422") || !strings.Contains(out, "leaves the root") {
		t.Errorf("a hostile layer through the API: exit %d, %q; want a 422 saying the entry leaves the root", code, out)
	}
	if _, err := os.Stat(outside); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the hostile layer wrote %s: %v", outside, err)
	}
}

// ociE2ELayout writes the test image's OCI layout and returns its path.
func ociE2ELayout(t *testing.T) string {
	t.Helper()
	probe := filepath.Join(t.TempDir(), "probe")
	build := exec.Command("go", "build", "-o", probe, "./testdata/probe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the probe: %v\n%s", err, out)
	}
	bin, err := os.ReadFile(probe)
	if err != nil {
		t.Fatal(err)
	}
	F, D := ocitest.File, ocitest.Dir
	img := ocitest.Image(t, v1.Config{
		Env:        []string{"PATH=/bin", "GREETING=hello from the image", "MODE=image"},
		WorkingDir: "/srv",
		User:       "app",
		Cmd:        []string{"/bin/probe", "id"},
	}, []ocitest.Entry{
		D("bin", 0o755), F("bin/probe", string(bin), 0o755),
		D("etc", 0o755), F("etc/passwd", "root:x:0:0:root:/root:/bin/probe\napp:x:1001:1001::/srv:/bin/probe\n", 0o644),
		F("etc/group", "root:x:0:\napp:x:1001:\n", 0o644),
		D("srv", 0o755).Owned(1001, 1001), F("srv/hello", "hello\n", 0o640).Owned(1001, 1001),
		ocitest.Hardlink("srv/hl", "srv/hello"), ocitest.Symlink("srv/abs", "/srv/hello"),
		ocitest.Symlink("escape", "../../../../../etc"),
		D("old", 0o755), F("old/a", "a", 0o644), F("old/b", "b", 0o644),
		D("opq", 0o755), F("opq/x", "x", 0o644),
	}, []ocitest.Entry{
		F("old/.wh.a", "", 0o644),
		F("opq/.wh..wh..opq", "", 0o644), F("opq/new", "new", 0o644),
	})
	lay := filepath.Join(t.TempDir(), "layout")
	ocitest.WriteLayout(t, img, lay)
	return lay
}

// checkImportedTemplate checks an import's output (out, exit code) named
// oci-e2e:v1 and a sandbox of each runtime from it.
func checkImportedTemplate(t *testing.T, s *stack, c *client.Client, out string, code int, runtimes ...string) {
	t.Helper()
	if code != 0 {
		t.Fatalf("template import exited %d: %s", code, out)
	}
	f := strings.Fields(out)
	if len(f) != 2 || f[0] != "oci-e2e:v1" || !strings.HasPrefix(f[1], "sha256:") {
		t.Fatalf("template import printed %q", out)
	}
	digest := f[1]
	t.Cleanup(func() { // after the sandboxes are gone (cleanups run last first)
		os.RemoveAll(filepath.Dir(image.TemplateRootFS(s.workerDir, digest)))
		img := filepath.Join(s.workerDir, "images", strings.TrimPrefix(digest, "sha256:")+".ext4")
		os.Remove(img + ".done")
		os.Remove(img)
		// The QEMU template image the worker checkpoints after the first
		// create (worker/templates.go), which it never drops itself.
		tpls, _ := filepath.Glob(filepath.Join(s.workerDir, "snapshots", "tpl-"+strings.TrimPrefix(digest, "sha256:")[:24]+"-*"))
		for _, p := range tpls {
			os.RemoveAll(p)
		}
	})
	// Without --no-wait the command returned once the server listed it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ts, err := c.ListTemplates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(ts, func(tp model.Template) bool { return tp.Name == "oci-e2e" && tp.Tag == "v1" && tp.Digest == digest }) {
		t.Fatalf("the server does not list oci-e2e:v1 %s: %+v", digest, ts)
	}

	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) { checkImportedSandbox(t, c, rt, digest) })
	}
}

// checkImportedSandbox creates a sandbox of runtime rt from oci-e2e:v1 and
// checks its tree and command defaults.
func checkImportedSandbox(t *testing.T, c *client.Client, rt, digest string) {
	// QEMU may still be setting up in the background, and builds the
	// template's ext4 image at its first create.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	sb, op, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "oci-e2e:v1", Runtime: rt, Env: map[string]string{"MODE": "sandbox"}}, "")
	if err != nil {
		t.Fatalf("create a %s sandbox: %v", rt, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if op, err := c.DeleteSandbox(ctx, sb.ID); err == nil {
			c.WaitOperation(ctx, op.ID)
		}
	})
	if _, err := c.WaitOperation(ctx, op.ID); err != nil {
		t.Fatalf("%s sandbox from the imported template did not start: %v", rt, err)
	}
	if sb.TemplateDigest != digest {
		t.Fatalf("sandbox template digest %s, want %s", sb.TemplateDigest, digest)
	}
	probeRun := func(req client.CreateCommandRequest) string {
		t.Helper()
		r := run(t, c, sb.ID, req, nil)
		if r.exit.ExitCode != 0 || r.exit.Error != "" {
			t.Fatalf("%v: exit %+v, stderr %q", req.Argv, r.exit, r.stderr)
		}
		return r.stdout
	}

	// The image's defaults: user app (1001), cwd /srv, its Env under the
	// sandbox's and the command's.
	if got := probeRun(client.CreateCommandRequest{Argv: []string{"probe", "id"}}); got != "uid=1001 gid=1001 cwd=/srv\n" {
		t.Errorf("defaults: %q", got)
	}
	if got := probeRun(client.CreateCommandRequest{Argv: []string{"probe", "env", "GREETING", "MODE", "PATH"}}); got != "GREETING=hello from the image\nMODE=sandbox\nPATH=/bin\n" {
		t.Errorf("env: %q", got)
	}
	// No command: the image's Cmd (/bin/probe id), with the same defaults.
	if got := probeRun(client.CreateCommandRequest{}); got != "uid=1001 gid=1001 cwd=/srv\n" {
		t.Errorf("the image's Cmd: %q", got)
	}
	// A command's own values win.
	if got := probeRun(client.CreateCommandRequest{Argv: []string{"probe", "id"}, User: "root", Cwd: "/opq"}); got != "uid=0 gid=0 cwd=/opq\n" {
		t.Errorf("own user and cwd: %q", got)
	}
	if got := probeRun(client.CreateCommandRequest{Argv: []string{"probe", "env", "GREETING"}, Env: map[string]string{"GREETING": "mine"}}); got != "GREETING=mine\n" {
		t.Errorf("own env: %q", got)
	}

	// The tree.
	got := probeRun(client.CreateCommandRequest{Argv: []string{"probe", "stat",
		"/srv", "/srv/hello", "/srv/hl", "/srv/abs", "/escape", "/old/a", "/old/b", "/opq/x", "/opq/new", "/usr/local/bin/airlock-agent"}})
	ino := regexp.MustCompile(` ino=\d+`)
	inos := ino.FindAllString(got, -1)
	want := strings.Join([]string{
		"/srv dir 0755 1001:1001",
		`/srv/hello file 0640 1001:1001 "hello\n"`,
		`/srv/hl file 0640 1001:1001 "hello\n"`,
		"/srv/abs symlink 0777 0:0 -> /srv/hello",
		"/escape symlink 0777 0:0 -> ../../../../../etc",
		"/old/a missing",
		`/old/b file 0644 0:0 "b"`,
		"/opq/x missing",
		`/opq/new file 0644 0:0 "new"`,
	}, "\n") + "\n"
	lines := strings.SplitAfter(ino.ReplaceAllString(got, ""), "\n")
	if len(lines) < 10 || strings.Join(lines[:9], "") != want || !strings.HasPrefix(lines[9], "/usr/local/bin/airlock-agent file 0755 0:0 ") {
		t.Errorf("tree in the sandbox:\n%s\nwant:\n%s/usr/local/bin/airlock-agent file 0755 0:0 …", got, want)
	}
	// A hard link is one file in the sandbox too.
	if len(inos) < 2 || inos[0] != inos[1] {
		t.Errorf("/srv/hello and /srv/hl: inodes %v, want one", inos)
	}
}

// A template deleted through the API leaves the worker: an imported
// template a gVisor sandbox uses cannot be deleted (409 naming the
// sandbox); once the sandbox is deleted it can, and the worker's data
// directory no longer holds it, nor does `template ls` list it.
func TestDeleteImportedTemplate(t *testing.T) {
	s := need(t)
	c := s.client()
	F, D := ocitest.File, ocitest.Dir
	img := ocitest.Image(t, v1.Config{Env: []string{"PATH=/usr/local/bin"}}, []ocitest.Entry{
		D("etc", 0o755), F("etc/hostname", "oci-del\n", 0o644), F("etc/passwd", "root:x:0:0:root:/:/usr/local/bin/airlock-agent\n", 0o644),
	})
	lay := filepath.Join(t.TempDir(), "layout")
	ocitest.WriteLayout(t, img, lay)
	cli := airlockCLI(t, s, append(os.Environ(), "AIRLOCK_URL="+s.url(), "AIRLOCK_API_KEY="+s.adminKey))
	out, code := cli("", "template", "import", lay, "--name", "oci-del:v1", "--data-dir", s.workerDir)
	f := strings.Fields(out)
	if code != 0 || len(f) != 2 || f[0] != "oci-del:v1" {
		t.Fatalf("template import exited %d: %q", code, out)
	}
	digest := f[1]
	hexPart := strings.TrimPrefix(digest, "sha256:")
	tdir := filepath.Join(s.workerDir, "templates", hexPart)
	t.Cleanup(func() { os.RemoveAll(tdir) }) // when the test failed before the worker removed it
	if _, err := os.Stat(tdir); err != nil {
		t.Fatalf("the import left no catalog entry: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, op, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "oci-del:v1", Runtime: "gvisor"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitOperation(ctx, op.ID); err != nil {
		t.Fatalf("sandbox from the imported template did not start: %v", err)
	}
	got, err := c.GetTemplate(ctx, "oci-del:v1")
	if err != nil || got.Digest != digest || !slices.Equal(got.Workers, []string{"w-e2e"}) || got.Config == nil {
		t.Fatalf("GET oci-del:v1 = %+v, %v", got, err)
	}
	if _, err := c.DeleteTemplate(ctx, "oci-del:v1"); !errors.Is(err, model.ErrConflict) || !strings.Contains(err.Error(), sb.ID) {
		t.Fatalf("DELETE of a template in use: %v, want a conflict naming %s", err, sb.ID)
	}
	dop, err := c.DeleteSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitOperation(ctx, dop.ID); err != nil {
		t.Fatal(err)
	}
	del, err := c.DeleteTemplate(ctx, "oci-del:v1")
	if err != nil {
		t.Fatalf("DELETE after the sandbox went: %v", err)
	}
	if del.Digest != digest || !slices.Equal(del.Workers, []string{"w-e2e"}) {
		t.Errorf("DELETE answered %+v", del)
	}
	for {
		_, err := os.Stat(tdir)
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the worker still holds %s: %v", tdir, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if m, _ := filepath.Glob(filepath.Join(s.workerDir, "templates", "*"+hexPart+"*")); len(m) != 0 {
		t.Errorf("left in the catalog: %v", m)
	}
	if _, err := os.Stat(filepath.Join(s.workerDir, "images", hexPart+".ext4")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("its ext4 image: %v, want none", err)
	}
	if out, code := cli("", "template", "ls"); code != 0 || strings.Contains(out, "oci-del") || !strings.Contains(out, "base") {
		t.Errorf("template ls after the delete (exit %d):\n%s", code, out)
	}
	if _, err := c.GetTemplate(ctx, digest); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("GET of the deleted digest: %v, want not found", err)
	}
}
