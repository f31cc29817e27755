package build

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/testenv"
)

func write(t *testing.T, p, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestApplyOverlay makes a real overlay over a lower tree, changes it the
// ways a RUN step can (and a hostile one would: symlinks to the host's
// paths, a replaced directory, an opaque one, a hard link), and checks
// that Apply on a clone gives exactly the merged view, leaves the lower
// tree and the host alone, and follows no link.
func TestApplyOverlay(t *testing.T) {
	testenv.RequireRoot(t, "overlayfs and tmpfs mounts")
	dir := t.TempDir()
	lower := filepath.Join(dir, "lower")
	write(t, filepath.Join(lower, "keep"), "keep\n")
	write(t, filepath.Join(lower, "gone"), "gone\n")
	write(t, filepath.Join(lower, "mod"), "old\n")
	write(t, filepath.Join(lower, "d/x"), "x\n")
	write(t, filepath.Join(lower, "opq/old"), "old\n")
	write(t, filepath.Join(lower, "tofile/y"), "y\n")
	outside := filepath.Join(dir, "outside")
	write(t, filepath.Join(outside, "secret"), "host\n")

	ov, err := MountOverlay(filepath.Join(dir, "ov"), lower, 64)
	if err != nil {
		t.Fatal(err)
	}
	defer ov.Release()
	m := ov.Merged
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Remove(filepath.Join(m, "gone")))
	must(os.WriteFile(filepath.Join(m, "mod"), []byte("new\n"), 0o600)) // in place: lower's inode must not change
	must(os.WriteFile(filepath.Join(m, "d/new"), []byte("n\n"), 0o644))
	must(os.RemoveAll(filepath.Join(m, "opq")))
	must(os.Mkdir(filepath.Join(m, "opq"), 0o750))
	must(os.WriteFile(filepath.Join(m, "opq/fresh"), []byte("f\n"), 0o644))
	must(os.RemoveAll(filepath.Join(m, "tofile")))
	must(os.WriteFile(filepath.Join(m, "tofile"), []byte("now a file\n"), 0o644))
	// Hostile: a symlink to the host's directory, then a name under it in
	// the guest's view would resolve outside; a link to the host's file.
	must(os.Symlink(outside, filepath.Join(m, "escape")))
	must(os.Symlink(filepath.Join(outside, "secret"), filepath.Join(m, "d/secret-link")))
	must(os.WriteFile(filepath.Join(m, "h1"), []byte("hard\n"), 0o644))
	must(os.Link(filepath.Join(m, "h1"), filepath.Join(m, "h2")))
	must(os.Chmod(filepath.Join(m, "keep"), 0o600)) // metadata-only change: copied up
	must(ov.Unmount())

	dst := filepath.Join(dir, "dst")
	must(Clone(lower, dst))
	st, err := Apply(ov.Upper, dst)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	t.Logf("applied: %+v", st)
	read := func(root, p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			return "<missing>"
		}
		return string(b)
	}
	want := map[string]string{"keep": "keep\n", "gone": "<missing>", "mod": "new\n", "d/x": "x\n", "d/new": "n\n",
		"opq/old": "<missing>", "opq/fresh": "f\n", "tofile": "now a file\n", "h1": "hard\n", "h2": "hard\n"}
	for p, w := range want {
		if got := read(dst, p); got != w {
			t.Errorf("dst/%s = %q, want %q", p, got, w)
		}
	}
	if got := read(lower, "mod"); got != "old\n" {
		t.Errorf("lower/mod changed to %q: a write went through a shared inode", got)
	}
	if fi, _ := os.Stat(filepath.Join(lower, "keep")); fi.Mode().Perm() != 0o644 {
		t.Errorf("lower/keep mode changed to %v", fi.Mode())
	}
	if fi, _ := os.Stat(filepath.Join(dst, "keep")); fi.Mode().Perm() != 0o600 {
		t.Errorf("dst/keep mode %v, want 0600", fi.Mode())
	}
	if fi, _ := os.Stat(filepath.Join(dst, "opq")); fi.Mode().Perm() != 0o750 {
		t.Errorf("dst/opq mode %v, want 0750", fi.Mode())
	}
	if l, err := os.Readlink(filepath.Join(dst, "escape")); err != nil || l != outside {
		t.Errorf("escape link = %q, %v (kept as data)", l, err)
	}
	a, _ := os.Stat(filepath.Join(dst, "h1"))
	b, _ := os.Stat(filepath.Join(dst, "h2"))
	if !os.SameFile(a, b) {
		t.Errorf("h1 and h2 are no longer one file")
	}
	if got := read(outside, "secret"); got != "host\n" {
		t.Errorf("the host's file changed: %q", got)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 1 {
		t.Errorf("something was written outside: %v", entries)
	}
}

// TestApplyRefusesThroughSymlink hand-writes an upper layer (as a guest
// with a writable root could shape one) whose directory entry stands
// where the clone has a symlink to the outside: Apply replaces the link
// with a directory instead of writing through it.
func TestApplyRefusesThroughSymlink(t *testing.T) {
	testenv.RequireRoot(t, "chown in Apply")
	dir := t.TempDir()
	outside := filepath.Join(dir, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "dst")
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dst, "link")); err != nil {
		t.Fatal(err)
	}
	upper := filepath.Join(dir, "upper")
	write(t, filepath.Join(upper, "link/planted"), "x\n")
	if _, err := Apply(upper, dst); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("Apply wrote through a symlink: %v", entries)
	}
	if fi, err := os.Lstat(filepath.Join(dst, "link")); err != nil || !fi.IsDir() {
		t.Errorf("dst/link is not a directory now: %v", err)
	}
	// A whiteout device is a removal; any other device is never made.
	if err := unix.Mknod(filepath.Join(upper, "dev"), syscall.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	st, err := Apply(upper, dst)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dst, "dev")); !errors.Is(err, os.ErrNotExist) || st.Skipped != 1 {
		t.Errorf("a device node was made in the template (%v, skipped %d)", err, st.Skipped)
	}
}

func TestParseDockerfile(t *testing.T) {
	ctx := t.TempDir()
	write(t, filepath.Join(ctx, "app/main.py"), "print('hi')\n")
	write(t, filepath.Join(ctx, "app/lib/util.py"), "x = 1\n")
	write(t, filepath.Join(ctx, "app/secret.env"), "KEY=1\n")
	write(t, filepath.Join(ctx, "run.sh"), "#!/bin/sh\n")
	write(t, filepath.Join(ctx, ".dockerignore"), "app/*.env\n")
	df := `# syntax=docker/dockerfile:1
ARG VERSION=1.0
FROM base
ARG PKG=jq
ENV APP_HOME=/srv/app \
    MODE=prod
RUN apt-get install -y $PKG \
 && echo done
COPY --chown=user:user app/ $APP_HOME/
COPY run.sh /usr/local/bin/run
WORKDIR $APP_HOME
USER user
EXPOSE 8000
LABEL a=b
CMD ["python3", "main.py"]
START python3 -m http.server 8000
READY curl -sf localhost:8000
`
	tmp := t.TempDir()
	spec, files, err := ParseDockerfile([]byte(df), ctx, tmp, "app", "2", map[string]string{"PKG": "curl"})
	if err != nil {
		t.Fatal(err)
	}
	if spec.From != "base" || spec.Name != "app" || spec.Tag != "2" || spec.StartCmd != "python3 -m http.server 8000" || spec.ReadyCmd != "curl -sf localhost:8000" {
		t.Errorf("spec = %+v", spec)
	}
	kinds := []string{}
	for _, s := range spec.Steps {
		kinds = append(kinds, s.Kind)
	}
	if got := strings.Join(kinds, ","); got != "ENV,RUN,COPY,COPY,WORKDIR,USER,CMD" {
		t.Fatalf("steps %s", got)
	}
	if run := spec.Steps[1].Args[0]; !strings.Contains(run, "PKG='curl'") || !strings.Contains(run, "apt-get install -y $PKG") {
		t.Errorf("RUN = %q: want the build arg in its environment, the command as written", run)
	}
	cp := spec.Steps[2]
	if cp.Args[0] != "/srv/app/" || cp.Chown != "user:user" || cp.ToFile {
		t.Errorf("COPY app/ = %+v", cp)
	}
	if one := spec.Steps[3]; one.Args[0] != "/usr/local/bin/run" || !one.ToFile {
		t.Errorf("COPY run.sh = %+v", one)
	}
	if spec.Steps[4].Args[0] != "/srv/app" {
		t.Errorf("WORKDIR = %v", spec.Steps[4].Args)
	}
	if c := spec.Steps[6]; !c.Exec || strings.Join(c.Args, " ") != "python3 main.py" {
		t.Errorf("CMD = %+v", c)
	}
	if len(files) != 2 {
		t.Fatalf("files = %+v", files)
	}
	names := tarNames(t, files[0].Path)
	if strings.Join(names, " ") != "lib/ lib/util.py main.py" {
		t.Errorf("tar of app/ = %v (secret.env is ignored; contents, not the directory)", names)
	}
	// The same context packs to the same hash (no times in the tar).
	spec2, files2, err := ParseDockerfile([]byte(df), ctx, t.TempDir(), "app", "2", map[string]string{"PKG": "curl"})
	if err != nil || files2[0].Hash != files[0].Hash || spec2.Steps[2].FilesHash != spec.Steps[2].FilesHash {
		t.Errorf("repacking changed the hash: %v", err)
	}

	for _, c := range []struct{ df, want string }{
		{"RUN true", "before FROM"},
		{"FROM base\nFROM base", "multi-stage"},
		{"FROM base\nCOPY ../etc/passwd /x", "outside the build context"},
		{"FROM base\nCOPY nothing-here /x", "not in the build context"},
		{"FROM base\nADD https://example.invalid/x /x", "URL"},
		{"FROM base\nRUN --mount=type=cache,target=/x true", "not supported"},
		{"FROM base\nHEALTHCHECK CMD true", "not supported"},
		{"FROM scratch", "scratch"},
		{"FROM base\nSTART", "needs a shell command"},
	} {
		_, _, err := ParseDockerfile([]byte(c.df), ctx, t.TempDir(), "x", "", nil)
		if err == nil || !errors.Is(err, model.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err = %v, want ErrInvalid with %q", c.df, err, c.want)
		}
	}
	if _, _, err := ParseDockerfile([]byte("FROM base"), ctx, t.TempDir(), "x", "", map[string]string{"NOPE": "1"}); err == nil || !strings.Contains(err.Error(), "no ARG NOPE") {
		t.Errorf("unknown --build-arg: %v", err)
	}
}

func tarNames(t *testing.T, p string) []string {
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, h.Name)
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		s    model.BuildSpec
		want string
	}{
		{model.BuildSpec{}, "no parent"},
		{model.BuildSpec{From: "base", Steps: []model.BuildStep{{Kind: "HEALTHCHECK"}}}, "unknown kind"},
		{model.BuildSpec{From: "base", Steps: []model.BuildStep{{Kind: model.StepCopy, Args: []string{"/x"}}}}, "files_hash"},
		{model.BuildSpec{From: "base", Steps: []model.BuildStep{{Kind: model.StepEnv, Args: []string{"A"}}}}, "pairs"},
		{model.BuildSpec{From: "base", Steps: []model.BuildStep{{Kind: model.StepEnv, Args: []string{"A=B", "c"}}}}, "variable name"},
		{model.BuildSpec{From: "base", Steps: []model.BuildStep{{Kind: model.StepRun, Args: []string{"a", "b"}}}}, "one shell command"},
		{model.BuildSpec{From: "base", Steps: []model.BuildStep{{Kind: model.StepCopy, Args: []string{"/x"}, FilesHash: "h", Chmod: "9"}}}, "octal"},
	} {
		if err := Validate(c.s); err == nil || !errors.Is(err, model.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.s, err, c.want)
		}
	}
}
