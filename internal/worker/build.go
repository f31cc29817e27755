package worker

// Template builds (internal/image/build does the building): the server
// sends a build as a tar (workerapi.BuildRequest, then the COPY files) to
// POST /v1/builds/{id}; the worker keeps the files in scratch under its
// data directory (bounded), runs the builder, and streams its events back
// as NDJSON, ending with "done" (once it has started the Sync that reports
// the new template; the server waits for that report) or "error". RUN steps run in sandboxes of a runtime that
// declares Caps.Build (gVisor), under the build's egress policy, with
// the worker's own resources for builds (BuildVCPUs, BuildMemoryMiB).

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/image/build"
	"github.com/airlock/airlock/internal/image/oci"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

// Resources of a build step's sandbox.
const (
	BuildVCPUs     = 2
	BuildMemoryMiB = 2048
	// maxBuildFilesBytes bounds all the files one build sends.
	maxBuildFilesBytes = 8 << 30
)

var buildFileName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

func (w *Worker) handleBuild(rw http.ResponseWriter, r *http.Request) {
	claims, err := w.authorize(r, token.ScopeBuild)
	if err != nil {
		writeError(rw, err)
		return
	}
	if w.cfg.Builder == nil {
		writeError(rw, model.Errorf(model.ErrUnavailable, "worker %s does not build templates", w.cfg.ID))
		return
	}
	rt := w.buildRuntime(r.Context())
	if rt == "" {
		writeError(rw, model.Errorf(model.ErrUnavailable, "worker %s has no runtime that runs build steps (gvisor)", w.cfg.ID))
		return
	}
	id := claims.SandboxID
	dir := w.cfg.Builder.FilesDir(id)
	os.RemoveAll(dir)
	defer os.RemoveAll(dir)
	req, files, err := readBuild(r.Body, dir)
	if err != nil {
		writeError(rw, err)
		return
	}
	if req.ID != id || req.OrgID != claims.OrgID {
		writeError(rw, model.Errorf(model.ErrForbidden, "the token is for another build"))
		return
	}
	rw.Header().Set("Content-Type", "application/x-ndjson")
	rw.WriteHeader(http.StatusOK)
	flusher, _ := rw.(http.Flusher)
	var mu sync.Mutex
	enc := json.NewEncoder(rw)
	seq := 0
	emit := func(ev model.BuildEvent) {
		mu.Lock()
		defer mu.Unlock()
		seq++
		ev.Seq, ev.Time = seq, time.Now().UTC()
		if err := enc.Encode(ev); err == nil && flusher != nil {
			flusher.Flush()
		}
	}
	runner := &buildRunner{w: w, runtime: rt, policy: req.Network, egress: req.Egress}
	t, _, err := w.cfg.Builder.Build(r.Context(), build.Request{ID: id, OrgID: req.OrgID, Spec: req.Spec, FromDigest: req.FromDigest, Files: files, Runner: runner}, emit)
	if err != nil {
		w.log.Info("template build failed", "build", id, "err", err)
		emit(model.BuildEvent{Type: "error", Text: err.Error()})
		return
	}
	w.log.Info("template built", "build", id, "template", t.Name+":"+t.Tag, "digest", t.Digest)
	w.changed() // the catalog changed: the next Sync reports it
	w.kickSync()
	emit(model.BuildEvent{Type: "done", Digest: t.Digest, Text: t.Name + ":" + t.Tag})
}

// buildRuntime is the first runtime of the worker that runs build steps.
func (w *Worker) buildRuntime(ctx context.Context) string {
	for _, info := range w.runtimeInfo(ctx) {
		if info.Caps.Build {
			return info.Name
		}
	}
	return ""
}

// readBuild reads a build's tar: the request, then its files into dir.
func readBuild(body io.Reader, dir string) (workerapi.BuildRequest, map[string]string, error) {
	var req workerapi.BuildRequest
	tr := tar.NewReader(body)
	hdr, err := tr.Next()
	if err != nil || hdr.Name != workerapi.BuildFileSpec || hdr.Size > workerapi.MaxBuildSpecBytes {
		return req, nil, model.Errorf(model.ErrInvalid, "a build starts with %s (at most %d bytes)", workerapi.BuildFileSpec, workerapi.MaxBuildSpecBytes)
	}
	if err := json.NewDecoder(io.LimitReader(tr, workerapi.MaxBuildSpecBytes)).Decode(&req); err != nil {
		return req, nil, model.Errorf(model.ErrInvalid, "decode %s: %v", workerapi.BuildFileSpec, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return req, nil, err
	}
	files := map[string]string{}
	var total int64
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return req, nil, model.Errorf(model.ErrInvalid, "read the build's files: %v", err)
		}
		name, ok := strings.CutPrefix(hdr.Name, workerapi.BuildFilesDir)
		if !ok || !buildFileName.MatchString(name) || hdr.Typeflag != tar.TypeReg {
			return req, nil, model.Errorf(model.ErrInvalid, "unexpected entry %q in the build", hdr.Name)
		}
		if hdr.Size > model.MaxBuildFileBytes {
			return req, nil, model.Errorf(model.ErrTooLarge, "build file %s is over %d bytes", name, model.MaxBuildFileBytes)
		}
		if total += hdr.Size; total > maxBuildFilesBytes {
			return req, nil, model.Errorf(model.ErrTooLarge, "the build's files are over %d bytes", int64(maxBuildFilesBytes))
		}
		p := filepath.Join(dir, name)
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return req, nil, model.Errorf(model.ErrInvalid, "build file %s: %v", name, err)
		}
		_, err = io.Copy(f, io.LimitReader(tr, hdr.Size))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return req, nil, model.Errorf(model.ErrUnavailable, "receive build file %s: %v", name, err)
		}
		files[name] = p
	}
	return req, files, nil
}

// buildRunner runs RUN steps for one build: each in a fresh sandbox of
// runtime over the step's root, under the build's egress policy.
type buildRunner struct {
	w       *Worker
	runtime string
	policy  *model.SandboxNetwork
	egress  *workerapi.Egress // the org's CA and secrets for its gateway
}

func (b *buildRunner) Run(ctx context.Context, rootfs string, p agentapi.ProcessSpec, out func(stream string, line []byte)) (exit agentapi.Exit, err error) {
	w := b.w
	id := builderID()
	spec := runtime.Spec{ID: id, Runtime: b.runtime, RootFS: rootfs, VCPUs: BuildVCPUs, MemoryMiB: BuildMemoryMiB, Hostname: "build", WritableRoot: true}
	policy := b.policy
	if policy == nil {
		policy = noEgress
	}
	w.setBuildEgress(id, b.egress)
	defer func() {
		if derr := w.deleteRuntime(context.WithoutCancel(ctx), id); derr != nil {
			err = errors.Join(err, fmt.Errorf("release the step's sandbox: %w", derr))
		}
		w.setBuildEgress(id, nil)
	}()
	if b.egress != nil && b.egress.CACert != "" && w.cfg.Gateway != nil && w.cfg.Network.Egress {
		// The org's CA is at BuildCABundle (the tree's bundle is the
		// step's to rewrite): TLS clients that honour these use it.
		env := map[string]string{}
		for _, k := range caEnv {
			env[k] = runtime.BuildCABundle
		}
		for k, v := range p.Env {
			env[k] = v
		}
		p.Env = env
	}
	sctx, cancel := context.WithTimeout(ctx, StartTimeout)
	h, err := w.startRuntime(sctx, spec, policy)
	if err != nil {
		cancel()
		return exit, fmt.Errorf("start the step's sandbox: %w", err)
	}
	defer h.Close()
	ac := w.newAgentClient(h)
	defer ac.Close()
	err = ac.WaitReady(sctx)
	cancel()
	if err != nil {
		return exit, fmt.Errorf("the step's sandbox: %w", err)
	}
	if _, err := ac.StartProcess(ctx, p); err != nil {
		return exit, fmt.Errorf("start the command: %w", err)
	}
	stream, err := ac.Output(ctx, p.ID, 0)
	if err != nil {
		return exit, fmt.Errorf("the command's output: %w", err)
	}
	defer stream.Close()
	lines := map[byte]*lineSplitter{
		agentapi.FrameStdout: {stream: "stdout", out: out},
		agentapi.FrameStderr: {stream: "stderr", out: out},
	}
	for {
		kind, payload, err := stream.Next()
		if err != nil {
			return exit, err
		}
		switch kind {
		case agentapi.FrameStdout, agentapi.FrameStderr:
			lines[kind].write(payload)
		case agentapi.FrameExit:
			for _, l := range lines {
				l.flush()
			}
			if err := json.Unmarshal(payload, &exit); err != nil {
				return exit, fmt.Errorf("the command's exit: %w", err)
			}
			return exit, nil
		case agentapi.FrameError:
			return exit, fmt.Errorf("the command failed: %s", bytes.TrimSpace(payload))
		}
	}
}

// lineSplitter turns output chunks into lines of at most
// model.MaxBuildLineBytes.
type lineSplitter struct {
	stream string
	out    func(string, []byte)
	buf    []byte
}

func (l *lineSplitter) write(p []byte) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.out(l.stream, l.buf[:i])
		l.buf = l.buf[i+1:]
	}
	for len(l.buf) > model.MaxBuildLineBytes {
		l.out(l.stream, l.buf[:model.MaxBuildLineBytes])
		l.buf = l.buf[model.MaxBuildLineBytes:]
	}
	l.buf = append([]byte(nil), l.buf...)
}

func (l *lineSplitter) flush() {
	if len(l.buf) > 0 {
		l.out(l.stream, l.buf)
		l.buf = nil
	}
}

// Background runs f as one of the worker's actions: Run waits for it
// before it returns (a shipped template's build in the background).
func (w *Worker) Background(f func()) {
	w.actions.Add(1)
	go func() {
		defer w.actions.Done()
		f()
	}()
}

// publicEgress is the policy of a shipped template's build: its RUN steps
// install Debian packages.
var publicEgress = &model.SandboxNetwork{Profile: "public", Policy: []byte(`{"version":1,"default":"allow"}`)}

// SystemOrg is the org a worker's own builds (the shipped templates) are
// cached under.
const SystemOrg = "system"

// BuildLocal builds spec on this worker for itself (a shipped template),
// its parent (spec.From, name[:tag]) from the worker's own catalog, the
// COPY files from disk, RUN steps with public egress; emit gets the events.
// It may run before Run.
func (w *Worker) BuildLocal(ctx context.Context, spec model.BuildSpec, files map[string]string, emit build.Emit) (model.Template, error) {
	if w.cfg.Builder == nil {
		return model.Template{}, model.Errorf(model.ErrUnavailable, "worker %s does not build templates", w.cfg.ID)
	}
	parent, err := w.localTemplate(spec.From)
	if err != nil {
		return model.Template{}, err
	}
	var runner build.Runner
	if rt := w.buildRuntime(ctx); rt != "" {
		runner = &buildRunner{w: w, runtime: rt, policy: publicEgress}
	}
	t, _, err := w.cfg.Builder.Build(ctx, build.Request{ID: model.NewID("bld"), OrgID: SystemOrg, Spec: spec, FromDigest: parent.Digest, Files: files, Runner: runner}, emit)
	if err == nil {
		w.changed()
	}
	return t, err
}

// localTemplate is the newest template of the catalog named ref
// (name[:tag], tag default latest).
func (w *Worker) localTemplate(ref string) (model.Template, error) {
	name, tag, _ := strings.Cut(ref, ":")
	if tag == "" {
		tag = "latest"
	}
	ts, err := w.cfg.Templates()
	if err != nil {
		return model.Template{}, err
	}
	var best model.Template
	for _, t := range ts {
		if t.Name == name && t.Tag == tag && !t.CreatedAt.Before(best.CreatedAt) {
			best = t
		}
	}
	if best.Digest == "" {
		return best, model.Errorf(model.ErrNotFound, "template %s:%s is not on worker %s", name, tag, w.cfg.ID)
	}
	return best, nil
}

// handleTemplateImport imports the archive in the body into the catalog
// (workerapi.RouteTemplateImport).
func (w *Worker) handleTemplateImport(rw http.ResponseWriter, r *http.Request) {
	claims, err := w.authorize(r, token.ScopeTemplateImport)
	if err != nil {
		writeError(rw, err)
		return
	}
	if w.cfg.ImportTemplate == nil || w.cfg.Builder == nil {
		writeError(rw, model.Errorf(model.ErrUnavailable, "worker %s does not import templates", w.cfg.ID))
		return
	}
	q := r.URL.Query()
	dir := w.cfg.Builder.FilesDir(claims.SandboxID)
	os.RemoveAll(dir)
	defer os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		writeError(rw, err)
		return
	}
	p := filepath.Join(dir, "image.tar")
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		writeError(rw, err)
		return
	}
	n, err := io.Copy(f, io.LimitReader(r.Body, workerapi.MaxImportBytes+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		writeError(rw, model.Errorf(model.ErrUnavailable, "receive the image: %v", err))
		return
	}
	if n > workerapi.MaxImportBytes {
		writeError(rw, model.Errorf(model.ErrTooLarge, "the image archive is over %d bytes", int64(workerapi.MaxImportBytes)))
		return
	}
	t, err := w.cfg.ImportTemplate(r.Context(), p, q.Get("name"), q.Get("tag"), q.Get("ref"))
	if errors.Is(err, oci.ErrRefused) {
		// A layer that reaches outside its root: the image is refused.
		err = model.Errorf(model.ErrUnprocessable, "%v", err)
	}
	if err != nil {
		writeError(rw, err)
		return
	}
	w.log.Info("template imported", "template", t.Name+":"+t.Tag, "digest", t.Digest, "bytes", n)
	w.changed()
	w.kickSync()
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(http.StatusCreated)
	json.NewEncoder(rw).Encode(t)
}
