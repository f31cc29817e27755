package dockerfile

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/model"
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

func TestParse(t *testing.T) {
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
	spec, files, err := Parse([]byte(df), ctx, tmp, "app", "2", map[string]string{"PKG": "curl"})
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
	spec2, files2, err := Parse([]byte(df), ctx, t.TempDir(), "app", "2", map[string]string{"PKG": "curl"})
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
		_, _, err := Parse([]byte(c.df), ctx, t.TempDir(), "x", "", nil)
		if err == nil || !errors.Is(err, model.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err = %v, want ErrInvalid with %q", c.df, err, c.want)
		}
	}
	if _, _, err := Parse([]byte("FROM base"), ctx, t.TempDir(), "x", "", map[string]string{"NOPE": "1"}); err == nil || !strings.Contains(err.Error(), "no ARG NOPE") {
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
