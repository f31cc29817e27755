package worker

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/image"
	"github.com/airlock/airlock/internal/image/build"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/gvisor"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

// buildEnv is a worker over real gVisor with a builder whose catalog holds
// the base template (cloned from the test cache).
type buildEnv struct {
	srv  *fakeServer
	tw   *testWorker
	dir  string
	base model.Template
}

func newBuildEnv(t *testing.T) *buildEnv {
	runsc := requireRunsc(t)
	tmpl, rootfs := baseTemplate(t)
	// The builder's data directory is on the cache's file system, so that
	// clones are hard links, as on a worker.
	dir, err := os.MkdirTemp(filepath.Dir(testCacheDir), "airlock-build-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		build.ReleaseStale(filepath.Join(dir, "build-scratch"))
		os.RemoveAll(dir)
	})
	tdir := filepath.Dir(image.TemplateRootFS(dir, tmpl.Digest))
	if err := os.MkdirAll(tdir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := build.Clone(rootfs, filepath.Join(tdir, "rootfs")); err != nil {
		t.Fatal(err)
	}
	if err := image.RenameTemplate(dir, tmpl); err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	d, err := gvisor.New(gvisor.Config{RunscPath: runsc, StateDir: filepath.Join(base, "state"), RunDir: filepath.Join(base, "run")})
	if err != nil {
		t.Fatal(err)
	}
	drv := &runtime.Multi{Drivers: map[string]runtime.Driver{gvisor.Name: d}, Default: gvisor.Name}
	e := &buildEnv{srv: newFakeServer(t), dir: dir, base: tmpl}
	e.tw = startWorkerWith(t, e.srv, drv, func(digest string) string { return image.TemplateRootFS(dir, digest) }, nil, func(c *Config) {
		c.Builder = &build.Builder{Dir: dir, Agent: buildAgent(t), Log: testLogger()}
		c.Templates = func() ([]model.Template, error) { return image.ListTemplates(dir) }
	})
	t.Cleanup(func() {
		for range 10 {
			if syscall.Unmount(filepath.Join(base, "state", "null-netns"), syscall.MNT_DETACH) != nil {
				break
			}
		}
	})
	ctx := testContext(t)
	e.srv.waitRegistered(ctx, 1)
	return e
}

// build sends spec (with files) to the worker and returns its events and
// the error the stream ended with.
func (e *buildEnv) build(t *testing.T, spec model.BuildSpec, files map[string][]byte) ([]model.BuildEvent, error) {
	t.Helper()
	id := model.NewID("bld")
	tok := e.srv.sign(t, token.Claims{SandboxID: id, OrgID: "org-1", Scope: token.ScopeBuild})
	var bf []workerapi.BuildFile
	for h, b := range files {
		b := b
		bf = append(bf, workerapi.BuildFile{Hash: h, Size: int64(len(b)), Open: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }})
	}
	var dp workerapi.DataPlane
	var evs []model.BuildEvent
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	err := dp.Build(ctx, workerapi.Target{Worker: "w-test", URL: e.tw.w.DataPlaneURL(), Token: tok},
		workerapi.BuildRequest{ID: id, OrgID: "org-1", Spec: spec, FromDigest: e.base.Digest}, bf, func(ev model.BuildEvent) {
			if ev.Type == "output" {
				t.Logf("  | %s", ev.Text)
			}
			evs = append(evs, ev)
		})
	return evs, err
}

func tarOf(t *testing.T, files map[string]string) (string, []byte) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, name := range []string{"a.txt", "sub/", "sub/b.txt"} {
		body, ok := files[name]
		if !ok {
			continue
		}
		hdr := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}
		if strings.HasSuffix(name, "/") {
			hdr = &tar.Header{Name: name, Mode: 0o755, Typeflag: tar.TypeDir}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, body)
	}
	tw.Close()
	sum := sha256.Sum256(buf.Bytes())
	return hex.EncodeToString(sum[:]), buf.Bytes()
}

func stepReports(evs []model.BuildEvent) map[int]model.BuildStepReport {
	out := map[int]model.BuildStepReport{}
	for _, ev := range evs {
		if ev.Type == "step" && ev.Step != nil {
			out[ev.Step.Index] = *ev.Step
		}
	}
	return out
}

func doneDigest(t *testing.T, evs []model.BuildEvent) string {
	t.Helper()
	for _, ev := range evs {
		if ev.Type == "done" {
			return ev.Digest
		}
	}
	t.Fatalf("no done event in %+v", evs)
	return ""
}

// TestBuildGVisor builds a recipe on a real worker: RUN in a gVisor
// sandbox over an overlay, COPY confined, config steps; checks the tree
// and config of the result, that a rebuild with one changed COPY re-runs
// only it and what follows, that a clean rebuild gives the same digest,
// and that a failing step reports itself and leaves nothing mounted.
func TestBuildGVisor(t *testing.T) {
	if testing.Short() {
		t.Skip("boots gVisor sandboxes")
	}
	e := newBuildEnv(t)
	spec := func(filesHash string) model.BuildSpec {
		return model.BuildSpec{Name: "app", Tag: "1", From: "base", Steps: []model.BuildStep{
			{Kind: model.StepEnv, Args: []string{"GREETING", "hello from env"}},
			{Kind: model.StepRun, Args: []string{`echo "$GREETING" > /greeting && echo kept > /tmp/kept && id -u > /uid && rm /etc/debian_version && mkdir -p /app/sub && ln -s /etc/passwd /app/pw && echo out; echo err >&2`}},
			{Kind: model.StepCopy, Args: []string{"/app/"}, FilesHash: filesHash, Chown: "user"},
			{Kind: model.StepWorkdir, Args: []string{"/app/work"}},
			{Kind: model.StepRun, Args: []string{"pwd > here && cat /app/a.txt > copied"}},
			{Kind: model.StepUser, Args: []string{"user"}},
			{Kind: model.StepCmd, Args: []string{"sleep", "1"}, Exec: true},
		}, StartCmd: "sleep infinity", ReadyCmd: "true"}
	}
	h1, t1 := tarOf(t, map[string]string{"a.txt": "one\n", "sub/": "", "sub/b.txt": "bee\n"})
	evs, err := e.build(t, spec(h1), map[string][]byte{h1: t1})
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	d1 := doneDigest(t, evs)
	reps := stepReports(evs)
	for i := range 7 {
		if reps[i].Cached {
			t.Errorf("first build: step %d (%s) reported cached", i, reps[i].Text)
		}
	}
	var sawOut, sawErr bool
	for _, ev := range evs {
		sawOut = sawOut || ev.Type == "output" && ev.Stream == "stdout" && ev.Text == "out"
		sawErr = sawErr || ev.Type == "output" && ev.Stream == "stderr" && ev.Text == "err"
	}
	if !sawOut || !sawErr {
		t.Errorf("RUN output not streamed per stream (stdout %v, stderr %v)", sawOut, sawErr)
	}
	tmpl, err := image.ReadTemplate(e.dir, d1)
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.Name != "app" || tmpl.Tag != "1" {
		t.Errorf("template named %s:%s", tmpl.Name, tmpl.Tag)
	}
	c := tmpl.Config
	if c == nil || c.WorkingDir != "/app/work" || c.User != "user" || strings.Join(c.Cmd, " ") != "sleep 1" || c.StartCmd != "sleep infinity" || c.ReadyCmd != "true" || c.EnvMap()["GREETING"] != "hello from env" {
		t.Errorf("config = %+v", c)
	}
	root := image.TemplateRootFS(e.dir, d1)
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return string(b)
	}
	if got := read("greeting"); got != "hello from env\n" {
		t.Errorf("/greeting = %q", got)
	}
	if got := read("tmp/kept"); got != "kept\n" {
		t.Errorf("/tmp/kept written by RUN = %q (a tmpfs over /tmp?)", got)
	}
	if got := read("uid"); got != "0\n" {
		t.Errorf("RUN ran as uid %q, want root", got)
	}
	if _, err := os.Lstat(filepath.Join(root, "etc/debian_version")); !os.IsNotExist(err) {
		t.Errorf("/etc/debian_version removed by RUN is still there: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(image.TemplateRootFS(e.dir, e.base.Digest), "etc/debian_version")); err != nil {
		t.Errorf("the parent lost /etc/debian_version: %v", err)
	}
	if l, err := os.Readlink(filepath.Join(root, "app/pw")); err != nil || l != "/etc/passwd" {
		t.Errorf("/app/pw = %q, %v", l, err)
	}
	if got := read("app/a.txt") + read("app/sub/b.txt") + read("app/work/copied") + read("app/work/here"); got != "one\nbee\none\n/app/work\n" {
		t.Errorf("copied files = %q", got)
	}
	if fi, err := os.Stat(filepath.Join(root, "app/a.txt")); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1000 {
		t.Errorf("COPY --chown=user: /app/a.txt %v, %v", fi, err)
	}

	// One changed COPY: the steps before it are cached, it and the rest run.
	h2, t2 := tarOf(t, map[string]string{"a.txt": "two\n", "sub/": "", "sub/b.txt": "bee\n"})
	evs, err = e.build(t, spec(h2), map[string][]byte{h2: t2})
	if err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	reps = stepReports(evs)
	for i := range 7 {
		if want := i < 2; reps[i].Cached != want {
			t.Errorf("rebuild: step %d (%s) cached = %v, want %v", i, reps[i].Text, reps[i].Cached, want)
		}
	}
	d2 := doneDigest(t, evs)
	if d2 == d1 {
		t.Errorf("a changed COPY gave the same digest %s", d2)
	}
	if got := read2(t, e.dir, d2, "app/work/copied"); got != "two\n" {
		t.Errorf("rebuilt /app/work/copied = %q", got)
	}

	// A clean build of the first inputs (no cache) gives the first digest.
	s := spec(h1)
	s.Force = true
	evs, err = e.build(t, s, map[string][]byte{h1: t1})
	if err != nil {
		t.Fatalf("forced build: %v", err)
	}
	if reps := stepReports(evs); reps[1].Cached {
		t.Errorf("forced build used the cache")
	}
	if d := doneDigest(t, evs); d != d1 {
		t.Errorf("clean rebuild digest %s, first build %s", d, d1)
	}

	// A failing step: the error names it; nothing stays mounted or in scratch.
	bad := model.BuildSpec{Name: "bad", From: "base", Steps: []model.BuildStep{{Kind: model.StepRun, Args: []string{"echo about to fail; exit 3"}}}}
	evs, err = e.build(t, bad, nil)
	if err == nil || !strings.Contains(err.Error(), "step 1") || !strings.Contains(err.Error(), "exited 3") {
		t.Errorf("failing build: err = %v", err)
	}
	if mounts, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mounts), e.dir) {
		t.Errorf("mounts left under %s", e.dir)
	}
	if left, _ := os.ReadDir(filepath.Join(e.dir, "build-scratch")); len(left) != 0 {
		t.Errorf("scratch left: %v", left)
	}
	if ts, _ := image.ListTemplates(e.dir); len(ts) != 3 {
		t.Errorf("catalog has %d templates, want base and two builds", len(ts))
	}
}

func read2(t *testing.T, dir, digest, p string) string {
	b, err := os.ReadFile(filepath.Join(image.TemplateRootFS(dir, digest), p))
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

// TestTemplateStartCommand builds templates with START/READY and starts
// sandboxes from them: the start command runs and the sandbox is running
// only once the ready command passed (the server it starts answers); a
// start command that dies fails the start with its exit in the reason,
// and the sandbox is released.
func TestTemplateStartCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("boots gVisor sandboxes")
	}
	e := newBuildEnv(t)
	ctx := testContext(t)
	good := model.BuildSpec{Name: "svc", From: "base", Steps: []model.BuildStep{
		{Kind: model.StepRun, Args: []string{"mkdir -p /srv && echo served > /srv/index.html"}},
	},
		StartCmd: "sleep 0.5; exec python3 -m http.server 8000 --bind 127.0.0.1 --directory /srv",
		ReadyCmd: `python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/index.html')"`,
	}
	evs, err := e.build(t, good, nil)
	if err != nil {
		t.Fatal(err)
	}
	id := newSandboxID()
	e.srv.assign(id, doneDigest(t, evs), model.StateRunning)
	e.srv.waitObserved(ctx, id, model.StateRunning)
	ac, _, err := e.tw.w.agentFor(id)
	if err != nil {
		t.Fatal(err)
	}
	info, err := ac.GetProcess(ctx, StartCommandID)
	if err != nil || !info.Running {
		t.Fatalf("start command: %+v, %v", info, err)
	}
	exit, out, err := runToExit(ctx, ac, agentapi.ProcessSpec{ID: "probe", Argv: []string{"python3", "-c", "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/index.html').read().decode())"}})
	if err != nil || exit.ExitCode != 0 || strings.TrimSpace(out) != "served" {
		t.Errorf("the started server: exit %+v, out %q, %v", exit, out, err)
	}
	e.srv.assign(id, doneDigest(t, evs), model.StateDeleted)
	e.srv.waitObserved(ctx, id, model.StateDeleted)

	bad := model.BuildSpec{Name: "dies", From: "base", StartCmd: "exit 5", ReadyCmd: "false"}
	evs, err = e.build(t, bad, nil)
	if err != nil {
		t.Fatal(err)
	}
	id2 := newSandboxID()
	e.srv.assign(id2, doneDigest(t, evs), model.StateRunning)
	o := e.srv.waitObserved(ctx, id2, model.StateFailed)
	if !strings.Contains(o.Reason, "start command exited (5)") {
		t.Errorf("failed start reason = %q", o.Reason)
	}
	e.srv.assign(id2, doneDigest(t, evs), model.StateDeleted)
	e.srv.waitObserved(ctx, id2, model.StateDeleted)
}
