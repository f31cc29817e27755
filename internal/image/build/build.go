// Package build turns a recipe (model.BuildSpec) into a template of a
// worker's catalog, one step at a time, each step cached by its parent and
// its inputs (internal/dockerfile reads Dockerfiles into recipes).
//
// How a step changes the tree:
//
//   - RUN runs in a real sandbox (Runner; the worker's gVisor) whose root is
//     an overlay of the parent tree with its upper layer on a bounded tmpfs
//     (MountOverlay): the guest writes nowhere else, and the upper layer is
//     exactly what the step changed. The builder then clones the parent
//     (hard links: Clone) and applies the upper layer on the clone (Apply,
//     which trusts nothing in it).
//   - COPY clones the parent and writes the uploaded tar into the clone with
//     the image-layer applier's confinement (oci.CopyTar).
//   - WORKDIR creates its directory when the parent lacks it; ENV, USER,
//     CMD and ENTRYPOINT change only the template's config.
//
// The cache: step i's key is sha256 over step i-1's key and step i's
// canonical form, with a COPY's files by the sha256 of their content (not
// the name the client uploaded them under); the chain starts from the org,
// the parent template's SourceKey (what it is apart from its agent; its
// digest when it has none) and the format version. A forced step re-runs
// the steps after it too. A step whose key
// has an entry in <data>/build-cache/ is not run. Keys include the org, so
// one org's RUN output (which may hold what its egress credentials
// fetched) never serves another's. Entries unused for CacheTTL are
// removed (GC).
//
// The result is the last tree, cloned into the catalog with the worker's
// guest agent put back at /usr/local/bin/airlock-agent (a step may have
// replaced it), named by its content digest: the same inputs give the same
// digest, since digests leave out modification times.
package build

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/image"
	"github.com/airlock/airlock/internal/image/oci"
	"github.com/airlock/airlock/internal/model"
)

// Runner runs one RUN step: p in a sandbox whose root is rootfs, written in
// place, streaming each line of output to out; it returns the exit.
type Runner interface {
	Run(ctx context.Context, rootfs string, p agentapi.ProcessSpec, out func(stream string, line []byte)) (agentapi.Exit, error)
}

// Defaults.
const (
	// CacheTTL is how long a cache entry nobody used stays.
	CacheTTL = 7 * 24 * time.Hour
	// DefaultUpperMiB bounds what one RUN step writes.
	DefaultUpperMiB = 8192
	// DefaultCacheMaxBytes bounds the step cache by default.
	DefaultCacheMaxBytes = 20 << 30
	// errorTailLines of a failed RUN's output are in its error.
	errorTailLines = 15
	// StepTimeout bounds one RUN step.
	StepTimeout = 30 * time.Minute
)

// Builder builds templates into the catalog under Dir.
type Builder struct {
	Dir   string // the worker's data directory
	Agent string // the guest agent binary every result carries
	// UpperMiB bounds one RUN step's writes (0: DefaultUpperMiB).
	UpperMiB int
	// CacheMaxBytes bounds the step cache (0: DefaultCacheMaxBytes): GC
	// removes the least recently used entries beyond it.
	CacheMaxBytes int64
	Log           *slog.Logger

	mu sync.Mutex // one build at a time
}

// Request is one build.
type Request struct {
	ID    string
	OrgID string
	Spec  model.BuildSpec
	// FromDigest is Spec.From, resolved to a template in the catalog.
	FromDigest string
	// Files maps a COPY's FilesHash to the file holding its tar.
	Files map[string]string
	// Runner runs the RUN steps (nil: a recipe with RUN fails).
	Runner Runner
}

// Emit receives the build's progress events (Seq and Time are the
// caller's to set).
type Emit func(model.BuildEvent)

// state is the template config as the steps so far left it.
type state struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	// User is the USER in effect ("": the parent's command default; RUN
	// steps then run as root).
	User       string   `json:"user,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}

// cacheEntry is a cached step's tree and the config after it.
type cacheEntry struct {
	Key    string    `json:"key"`
	Step   string    `json:"step"`
	State  state     `json:"state"`
	Create time.Time `json:"created_at"`
	// Bytes is what the step wrote (its tree shares the rest with its
	// parent's by hard links): what removing the entry frees.
	Bytes int64 `json:"bytes"`
}

func (b *Builder) cacheDir() string           { return filepath.Join(b.Dir, "build-cache") }
func (b *Builder) entryDir(key string) string { return filepath.Join(b.cacheDir(), key) }
func (b *Builder) scratch() string            { return filepath.Join(b.Dir, "build-scratch") }

// FilesDir is where the worker keeps the files sent with build id while
// it runs (GC removes what a crash left there after a day).
func (b *Builder) FilesDir(id string) string { return filepath.Join(b.Dir, "build-files", id) }

func (b *Builder) log() *slog.Logger {
	if b.Log != nil {
		return b.Log
	}
	return slog.Default()
}

// Build runs req and returns the template it made (in the catalog) and
// the report of each step.
func (b *Builder) Build(ctx context.Context, req Request, emit Emit) (model.Template, []model.BuildStepReport, error) {
	if err := req.Spec.Validate(); err != nil {
		return model.Template{}, nil, err
	}
	if !b.mu.TryLock() {
		emit(model.BuildEvent{Type: "info", Text: "waiting for another build on this worker to finish"})
		b.mu.Lock()
	}
	defer b.mu.Unlock()
	// And across processes using the cache (the lock is in it: data
	// directories whose build-cache is one directory, as tests' are,
	// share it).
	unlock, err := lockFile(filepath.Join(b.cacheDir(), ".lock"), func() {
		emit(model.BuildEvent{Type: "info", Text: "waiting for a build of another process on this data directory"})
	})
	if err != nil {
		return model.Template{}, nil, err
	}
	defer unlock()
	b.GC(time.Now())
	parent, err := image.ReadTemplate(b.Dir, req.FromDigest)
	if err != nil || parent.Digest != req.FromDigest {
		return model.Template{}, nil, model.Errorf(model.ErrNotFound, "parent template %s (%s) is not on this worker", req.Spec.From, req.FromDigest)
	}
	st := state{}
	if c := parent.Config; c != nil {
		st = state{Env: slices.Clone(c.Env), WorkingDir: c.WorkingDir, User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd}
	}
	tree := image.TemplateRootFS(b.Dir, parent.Digest)
	h := sha256.New()
	fmt.Fprintf(h, "airlock build v1\norg %s\nfrom %s\n", req.OrgID, cmp.Or(parent.SourceKey, parent.Digest))
	key := hex.EncodeToString(h.Sum(nil))
	emit(model.BuildEvent{Type: "step", Step: &model.BuildStepReport{Index: -1, Text: "FROM " + req.Spec.From, Cached: true, Key: key}})
	var reports []model.BuildStepReport
	forced := false
	for i, step := range req.Spec.Steps {
		t0 := time.Now()
		canon, err := b.canonical(step, req.Files)
		if err != nil {
			return model.Template{}, reports, fmt.Errorf("step %d (%s): %w", i+1, stepText(step), err)
		}
		h := sha256.New()
		fmt.Fprintf(h, "%s\n%s\n", key, canon)
		key = hex.EncodeToString(h.Sum(nil))
		rep := model.BuildStepReport{Index: i, Text: stepText(step), Key: key}
		// A forced step re-runs every later one too: their cached trees
		// were made from its old output.
		forced = forced || step.Force
		force := req.Spec.Force || forced

		var next string
		switch step.Kind {
		case model.StepEnv:
			for j := 0; j+1 < len(step.Args); j += 2 {
				st.Env = setEnv(st.Env, step.Args[j], step.Args[j+1])
			}
		case model.StepUser:
			st.User = step.Args[0]
		case model.StepCmd:
			st.Cmd = commandOf(step)
		case model.StepEntrypoint:
			st.Entrypoint = commandOf(step)
		case model.StepWorkdir:
			if d := step.Args[0]; path.IsAbs(d) {
				st.WorkingDir = path.Clean(d)
			} else {
				st.WorkingDir = path.Join(absDir(st.WorkingDir), d)
			}
			if exists, _ := dirExists(tree, st.WorkingDir); !exists {
				next = "workdir"
			}
		default:
			next = "fs"
		}
		if next == "" {
			// Nothing to run: cached when this chain of steps was seen.
			rep.Cached = !force && b.seen(key)
			b.mark(key)
			rep.DurationMS = ms(time.Since(t0))
			emit(model.BuildEvent{Type: "step", Step: &rep})
			reports = append(reports, rep)
			continue
		}
		if !force {
			if e, ok := b.lookup(key); ok {
				rep.Cached = true
				rep.DurationMS = ms(time.Since(t0))
				emit(model.BuildEvent{Type: "step", Step: &rep})
				reports = append(reports, rep)
				tree, st = filepath.Join(b.entryDir(key), "rootfs"), e.State
				continue
			}
		}
		emit(model.BuildEvent{Type: "step", Step: &rep})
		out, written, err := b.runStep(ctx, req, i, step, tree, st, emit)
		if err != nil {
			return model.Template{}, reports, fmt.Errorf("step %d (%s): %w", i+1, rep.Text, err)
		}
		if err := b.store(key, rep.Text, out, st, written); err != nil {
			os.RemoveAll(out)
			return model.Template{}, reports, fmt.Errorf("step %d (%s): cache: %w", i+1, rep.Text, err)
		}
		rep.DurationMS = ms(time.Since(t0))
		emit(model.BuildEvent{Type: "step_done", Step: &rep, Text: fmt.Sprintf("step %d done in %.1f s", i+1, rep.DurationMS/1000)})
		reports = append(reports, rep)
		tree = filepath.Join(b.entryDir(key), "rootfs")
	}
	t, err := b.commit(ctx, req, key, tree, st, parent)
	if err != nil {
		return model.Template{}, reports, err
	}
	return t, reports, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func absDir(d string) string {
	if d == "" {
		return "/"
	}
	return d
}

// canonical is a step's cache input: its form, with a COPY's files by
// content digest.
func (b *Builder) canonical(step model.BuildStep, files map[string]string) (string, error) {
	c := step
	c.Text, c.Force = "", false
	if step.Kind == model.StepCopy {
		p, ok := files[step.FilesHash]
		if !ok {
			return "", model.Errorf(model.ErrInvalid, "the files %q were not sent with the build", step.FilesHash)
		}
		sum, err := fileSHA256(p)
		if err != nil {
			return "", err
		}
		c.FilesHash = "sha256:" + sum
	}
	j, err := json.Marshal(c)
	return string(j), err
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func stepText(s model.BuildStep) string {
	if s.Text != "" {
		return s.Text
	}
	if s.Exec {
		j, _ := json.Marshal(s.Args)
		return s.Kind + " " + string(j)
	}
	return s.Kind + " " + strings.Join(s.Args, " ")
}

func setEnv(env []string, k, v string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if name, _, _ := strings.Cut(kv, "="); name != k {
			out = append(out, kv)
		}
	}
	return append(out, k+"="+v)
}

func commandOf(s model.BuildStep) []string {
	if s.Exec {
		return slices.Clone(s.Args)
	}
	return []string{"/bin/sh", "-c", s.Args[0]}
}

// dirExists reports whether dir (absolute, in the guest) is a directory of
// tree, resolving nothing outside it.
func dirExists(tree, dir string) (bool, error) {
	r, err := os.OpenRoot(tree)
	if err != nil {
		return false, err
	}
	defer r.Close()
	fi, err := r.Stat(strings.TrimPrefix(path.Clean(dir), "/") + "/.")
	if err != nil {
		return false, nil
	}
	return fi.IsDir(), nil
}

// lookup returns the complete cache entry of key, marking it used.
func (b *Builder) lookup(key string) (cacheEntry, bool) {
	var e cacheEntry
	meta := filepath.Join(b.entryDir(key), "entry.json")
	raw, err := os.ReadFile(meta)
	if err != nil || json.Unmarshal(raw, &e) != nil || e.Key != key {
		return e, false
	}
	if _, err := os.Stat(filepath.Join(b.entryDir(key), "rootfs")); err != nil {
		return e, false
	}
	now := time.Now()
	os.Chtimes(meta, now, now)
	return e, true
}

// seen reports whether a config-only step's key was built before (its
// marker is there), marking it used.
func (b *Builder) seen(key string) bool {
	p := filepath.Join(b.cacheDir(), key+".seen")
	now := time.Now()
	return os.Chtimes(p, now, now) == nil
}

// mark records a config-only step's key.
func (b *Builder) mark(key string) {
	if os.MkdirAll(b.cacheDir(), 0o700) == nil {
		os.WriteFile(filepath.Join(b.cacheDir(), key+".seen"), nil, 0o600)
	}
}

// store moves tree out (a step's result) into the cache as key's entry.
func (b *Builder) store(key, text, out string, st state, bytes int64) error {
	dir := b.entryDir(key)
	if err := os.MkdirAll(b.cacheDir(), 0o700); err != nil {
		return err
	}
	tmp := dir + ".tmp"
	removeTree(tmp)
	removeTree(dir) // a forced rebuild replaces the entry
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return err
	}
	if err := os.Rename(out, filepath.Join(tmp, "rootfs")); err != nil {
		return err
	}
	j, _ := json.MarshalIndent(cacheEntry{Key: key, Step: text, State: st, Create: time.Now().UTC(), Bytes: bytes}, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "entry.json"), j, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}

// runStep makes step's tree from tree and returns it (a directory in the
// scratch area on the cache's file system).
func (b *Builder) runStep(ctx context.Context, req Request, i int, step model.BuildStep, tree string, st state, emit Emit) (string, int64, error) {
	if err := os.MkdirAll(b.scratch(), 0o700); err != nil {
		return "", 0, err
	}
	out := filepath.Join(b.scratch(), fmt.Sprintf("%s-%d", req.ID, i))
	removeTree(out)
	switch step.Kind {
	case model.StepRun:
		n, err := b.run(ctx, req, i, step, tree, out, st, emit)
		return out, n, err
	case model.StepCopy:
		if err := Clone(tree, out); err != nil {
			return "", 0, err
		}
		if err := b.copy(ctx, req, step, out, st); err != nil {
			removeTree(out)
			return "", 0, err
		}
		var n int64
		if fi, err := os.Stat(req.Files[step.FilesHash]); err == nil {
			n = fi.Size()
		}
		return out, n, nil
	case model.StepWorkdir:
		if err := Clone(tree, out); err != nil {
			return "", 0, err
		}
		r, err := os.OpenRoot(out)
		if err == nil {
			err = r.MkdirAll(strings.TrimPrefix(st.WorkingDir, "/"), 0o755)
			r.Close()
		}
		if err != nil {
			removeTree(out)
			return "", 0, fmt.Errorf("create %s: %w", st.WorkingDir, err)
		}
		return out, 0, nil
	}
	return "", 0, fmt.Errorf("no tree change for %s", step.Kind)
}

// run runs a RUN step in a sandbox over an overlay of tree and applies its
// changes to a clone of tree at out.
func (b *Builder) run(ctx context.Context, req Request, i int, step model.BuildStep, tree, out string, st state, emit Emit) (int64, error) {
	if req.Runner == nil {
		return 0, model.Errorf(model.ErrUnavailable, "this worker has no runtime that runs build steps")
	}
	upper := b.UpperMiB
	if upper <= 0 {
		upper = DefaultUpperMiB
	}
	ov, err := MountOverlay(out+".ov", tree, upper)
	if err != nil {
		return 0, err
	}
	defer func() {
		if rerr := ov.Release(); rerr != nil {
			b.log().Warn("build: release a step's overlay", "dir", out+".ov", "err", rerr)
		}
	}()
	argv := step.Args
	if !step.Exec {
		argv = []string{"/bin/sh", "-c", step.Args[0]}
	}
	env := map[string]string{}
	for _, kv := range st.Env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	user, _, _ := strings.Cut(st.User, ":")
	if user == "" {
		user = "0" // Docker's RUN: root unless USER
	}
	p := agentapi.ProcessSpec{ID: fmt.Sprintf("build-%d", i+1), Argv: argv, Env: env, Cwd: absDir(st.WorkingDir), User: user, TimeoutS: int(StepTimeout / time.Second)}
	var tail []string // the last lines, for the error of a failed command
	exit, err := req.Runner.Run(ctx, ov.Merged, p, func(stream string, line []byte) {
		emit(model.BuildEvent{Type: "output", Stream: stream, Text: string(line)})
		if tail = append(tail, string(line)); len(tail) > errorTailLines {
			tail = tail[1:]
		}
	})
	if err != nil {
		return 0, err
	}
	if exit.Error != "" {
		return 0, fmt.Errorf("the command did not run: %s", exit.Error)
	}
	if exit.TimedOut {
		return 0, fmt.Errorf("the command ran over %s", StepTimeout)
	}
	if exit.ExitCode != 0 {
		if len(tail) > 0 {
			return 0, fmt.Errorf("the command exited %d; its last output:\n%s", exit.ExitCode, strings.Join(tail, "\n"))
		}
		return 0, fmt.Errorf("the command exited %d", exit.ExitCode)
	}
	if err := ov.Unmount(); err != nil {
		return 0, err
	}
	if err := Clone(tree, out); err != nil {
		return 0, err
	}
	stats, err := Apply(ov.Upper, out)
	if err != nil {
		removeTree(out)
		return 0, err
	}
	emit(model.BuildEvent{Type: "info", Text: fmt.Sprintf("step %d changed %d files (%d bytes), %d directories, %d links, removed %d", i+1, stats.Files, stats.Bytes, stats.Dirs, stats.Symlinks, stats.Removed)})
	return stats.Bytes, nil
}

// copy writes a COPY step's tar into out.
func (b *Builder) copy(ctx context.Context, req Request, step model.BuildStep, out string, st state) error {
	dest := step.Args[0]
	if !path.IsAbs(dest) {
		dest = path.Join(absDir(st.WorkingDir), dest)
	}
	root, err := os.OpenRoot(out)
	if err != nil {
		return err
	}
	defer root.Close()
	rel := strings.TrimPrefix(path.Clean(dest), "/")
	if rel == "" {
		rel = "."
	}
	var rename map[string]string
	if step.ToFile && rel != "." {
		if isDir, _ := dirExists(out, dest); !isDir {
			// The one file becomes dest itself.
			name, err := singleEntry(req.Files[step.FilesHash])
			if err != nil {
				return err
			}
			rename = map[string]string{name: path.Base(rel)}
			rel = path.Dir(rel)
		}
	}
	if err := root.MkdirAll(rel, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dest, err)
	}
	sub, err := root.OpenRoot(rel)
	if err != nil {
		return fmt.Errorf("open %s: %w", dest, err)
	}
	defer sub.Close()
	o := oci.CopyOptions{Rename: rename}
	if step.Chown != "" {
		if o.UID, o.GID, err = lookupOwner(root, step.Chown); err != nil {
			return err
		}
	}
	if step.Chmod != "" {
		m, err := model.ParseMode(step.Chmod)
		if err != nil {
			return err
		}
		o.Mode = &m
	}
	f, err := os.Open(req.Files[step.FilesHash])
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := maybeGunzip(f)
	if err != nil {
		return err
	}
	if _, err := oci.CopyTar(ctx, sub, r, o); err != nil {
		return fmt.Errorf("copy into %s: %w", dest, err)
	}
	return nil
}

// commit puts tree, with the agent, into the catalog as req's template.
func (b *Builder) commit(ctx context.Context, req Request, key, tree string, st state, parent model.Template) (model.Template, error) {
	cfg := &model.TemplateConfig{Env: st.Env, WorkingDir: st.WorkingDir, User: st.User, Entrypoint: st.Entrypoint, Cmd: st.Cmd,
		StartCmd: req.Spec.StartCmd, ReadyCmd: req.Spec.ReadyCmd}
	if cfg.User == "" && parent.Config == nil {
		// Built on a template without a config (base): commands keep its
		// default user.
		cfg.User = agentapi.DefaultUser
	}
	tag := req.Spec.Tag
	if tag == "" {
		tag = "latest"
	}
	// The template apart from its agent: the last step's key and the config.
	cj, _ := json.Marshal(cfg)
	h := sha256.New()
	fmt.Fprintf(h, "%s\ncommit %s\n", key, cj)
	sourceKey := "build:" + hex.EncodeToString(h.Sum(nil))
	agentSum, err := fileSHA256(b.Agent)
	if err != nil {
		return model.Template{}, fmt.Errorf("the guest agent: %w", err)
	}
	// The same result with the same agent was committed before: its digest
	// is known, and the tree need not be cloned and hashed again.
	result := filepath.Join(b.cacheDir(), strings.TrimPrefix(sourceKey, "build:")+"-"+agentSum[:16]+".result")
	if raw, err := os.ReadFile(result); err == nil {
		if old, err := image.ReadTemplate(b.Dir, string(raw)); err == nil && old.Digest == string(raw) && !req.Spec.Force {
			if err := sameName(old, req.Spec.Name, tag); err != nil {
				return model.Template{}, err
			}
			t := old
			t.Name, t.Tag, t.CreatedAt = req.Spec.Name, tag, time.Now().UTC()
			unlock, err := image.Lock(b.Dir)
			if err != nil {
				return model.Template{}, err
			}
			defer unlock()
			now := time.Now()
			os.Chtimes(result, now, now)
			return t, image.RenameTemplate(b.Dir, t)
		}
	}
	work := filepath.Join(b.Dir, "templates", ".build-"+req.ID)
	removeTree(work)
	if err := os.MkdirAll(work, 0o755); err != nil {
		return model.Template{}, err
	}
	defer removeTree(work)
	rootfs := filepath.Join(work, "rootfs")
	if err := Clone(tree, rootfs); err != nil {
		return model.Template{}, err
	}
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return model.Template{}, err
	}
	err = oci.AddAgent(root, b.Agent)
	root.Close()
	if err != nil {
		return model.Template{}, err
	}
	treeDigest, size, err := image.Digest(rootfs)
	if err != nil {
		return model.Template{}, err
	}
	digest, err := oci.TemplateDigest(treeDigest, cfg)
	if err != nil {
		return model.Template{}, err
	}
	t := model.Template{Name: req.Spec.Name, Tag: tag, Digest: digest, SizeBytes: size, CreatedAt: time.Now().UTC(), Config: cfg, SourceKey: sourceKey}
	unlock, err := image.Lock(b.Dir)
	if err != nil {
		return model.Template{}, err
	}
	defer unlock()
	if old, err := image.ReadTemplate(b.Dir, digest); err == nil && old.Digest == digest {
		// The same content is there (sandboxes may be using its tree,
		// which stays): a rebuild of it, refreshed.
		if err := sameName(old, t.Name, t.Tag); err != nil {
			return model.Template{}, err
		}
		if err := image.RenameTemplate(b.Dir, t); err != nil {
			return model.Template{}, err
		}
	} else if err := image.AddTemplate(b.Dir, work, t); err != nil {
		return model.Template{}, err
	}
	if err := os.MkdirAll(b.cacheDir(), 0o700); err == nil {
		os.WriteFile(result, []byte(digest), 0o600)
	}
	return t, nil
}

// GC removes cache entries unused for CacheTTL and scratch left by
// crashed builds; a caller holding no build lock must not run it beside
// Build (Build runs it itself).
func (b *Builder) GC(now time.Time) (removed int) {
	if entries, err := os.ReadDir(b.scratch()); err == nil {
		for _, e := range entries {
			ReleaseStale(filepath.Join(b.scratch(), e.Name()))
		}
	}
	if entries, err := os.ReadDir(filepath.Join(b.Dir, "build-files")); err == nil {
		for _, e := range entries {
			if fi, err := e.Info(); err == nil && now.Sub(fi.ModTime()) > 24*time.Hour {
				removeTree(filepath.Join(b.Dir, "build-files", e.Name()))
			}
		}
	}
	entries, err := os.ReadDir(b.cacheDir())
	if err != nil {
		return 0
	}
	for _, e := range entries {
		dir := filepath.Join(b.cacheDir(), e.Name())
		if strings.HasPrefix(e.Name(), ".") {
			continue // the lock
		}
		if strings.HasSuffix(e.Name(), ".seen") || strings.HasSuffix(e.Name(), ".result") {
			if fi, err := e.Info(); err == nil && now.Sub(fi.ModTime()) >= CacheTTL {
				os.Remove(dir)
			}
			continue
		}
		fi, err := os.Stat(filepath.Join(dir, "entry.json"))
		if err == nil && now.Sub(fi.ModTime()) < CacheTTL {
			continue
		}
		if err != nil && !strings.HasSuffix(e.Name(), ".tmp") {
			if di, derr := e.Info(); derr == nil && now.Sub(di.ModTime()) < time.Hour {
				continue // being written
			}
		}
		removeTree(dir)
		removed++
	}
	return removed + b.gcSize()
}

// gcSize removes the least recently used cache entries while the cache
// holds more than CacheMaxBytes.
func (b *Builder) gcSize() (removed int) {
	max := b.CacheMaxBytes
	if max <= 0 {
		max = DefaultCacheMaxBytes
	}
	type use struct {
		dir   string
		used  time.Time
		bytes int64
	}
	var uses []use
	var total int64
	entries, _ := os.ReadDir(b.cacheDir())
	for _, e := range entries {
		meta := filepath.Join(b.cacheDir(), e.Name(), "entry.json")
		fi, err := os.Stat(meta)
		if err != nil {
			continue
		}
		var ce cacheEntry
		if raw, err := os.ReadFile(meta); err == nil {
			json.Unmarshal(raw, &ce)
		}
		uses = append(uses, use{filepath.Join(b.cacheDir(), e.Name()), fi.ModTime(), ce.Bytes})
		total += ce.Bytes
	}
	slices.SortFunc(uses, func(a, b use) int { return a.used.Compare(b.used) })
	for _, u := range uses {
		if total <= max {
			break
		}
		removeTree(u.dir)
		total -= u.bytes
		removed++
	}
	return removed
}

// removeTree removes dir, making read-only directories writable first
// when a plain removal fails.
func removeTree(dir string) {
	if err := os.RemoveAll(dir); err == nil || errors.Is(err, os.ErrNotExist) {
		return
	}
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o700)
		}
		return nil
	})
	os.RemoveAll(dir)
}

// lockFile takes an exclusive flock on p, calling waiting first when
// another process holds it.
func lockFile(p string, waiting func()) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("build lock: %w", err)
	}
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		waiting()
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
			f.Close()
			return nil, fmt.Errorf("build lock: %w", err)
		}
	}
	return func() { f.Close() }, nil
}

// sameName refuses a build whose result is content the catalog holds under
// another name:tag: one entry has one name, and moving it would take the
// template from the other name (a recipe that changes nothing of its
// parent, say).
func sameName(old model.Template, name, tag string) error {
	if old.Name == name && old.Tag == tag {
		return nil
	}
	return model.Errorf(model.ErrConflict, "the build made exactly the content of template %s:%s (%s); create sandboxes from that, or change the recipe", old.Name, old.Tag, old.Digest)
}
