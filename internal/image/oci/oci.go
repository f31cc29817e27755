// Package oci imports OCI images into a worker's template catalog
// (internal/image): an OCI image layout (a directory, or a tar of one) or a
// `docker save` archive becomes a template, its layers applied in order into
// one root filesystem with whiteouts and opaque directories, owners, modes,
// hard links, symbolic links and the kept extended attributes, plus the
// guest agent every template carries. Paths are confined to the root: an
// entry naming an absolute path or a .. component, writing through a
// symbolic link, or hard-linking outside is refused, and the import stops
// with nothing written outside its scratch directory. Device nodes are
// never created (see Report.Devices).
//
// Reading the image formats (layouts, indexes, docker archives, gzip and
// zstd layers) is go-containerregistry's; applying layers is this
// package's own, because the library's flattening (mutate.Extract) writes
// a tar stream, leaving confinement and ownership to whoever unpacks it.
//
// The template's digest is content-addressed: a hash of its tree's
// image.Digest and its config (TemplateDigest), so two imports of the same
// image with the same agent give the same template.
package oci

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/image"
	"github.com/airlock/airlock/internal/model"
)

// AgentPath is where every template carries the guest agent (the runtimes
// start it as PID 1).
const AgentPath = "usr/local/bin/airlock-agent"

// Limits bound what one import reads and writes. Zero fields take the
// defaults.
type Limits struct {
	// MaxBytes bounds the uncompressed layer streams, all layers together
	// (and an OCI layout tar's blobs). Default 16 GiB.
	MaxBytes int64
	// MaxEntries bounds the tar entries of all layers. Default 1,000,000.
	MaxEntries int
	// MaxLayers bounds the layers of the image. Default 128 (Docker's own
	// limit is 127).
	MaxLayers int
}

func (l Limits) withDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = 16 << 30
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = 1_000_000
	}
	if l.MaxLayers <= 0 {
		l.MaxLayers = 128
	}
	return l
}

// Options configure Import.
type Options struct {
	Name string // template name: lower-case letters, digits, '.', '_', '-'
	Tag  string // default "latest"
	// Agent is the guest agent binary copied into the template (AgentPath).
	Agent string
	// Ref picks one image of a layout or archive with several: an OCI
	// layout's org.opencontainers.image.ref.name (or
	// io.containerd.image.name) annotation, a docker archive's repo:tag.
	Ref string
	// OS and Arch pick the image of a multi-platform index; default linux
	// and this machine's architecture.
	OS, Arch string
	Limits   Limits
	// NoOwners leaves every entry owned by the importing user instead of
	// the layer's uid/gid: for an import without root (tests), whose
	// template is then not the image's.
	NoOwners bool
	Progress io.Writer // progress lines; nil discards them
}

func (o Options) platform() string { return o.OS + "/" + o.Arch }

func (o Options) platformMatches(os, arch string) bool { return os == o.OS && arch == o.Arch }

// Report is what Import did.
type Report struct {
	Template model.Template
	Source   string // "oci-layout" or "docker-archive"
	Image    string // the image's manifest digest
	Layers   int
	Entries  int
	Bytes    int64 // uncompressed layer bytes read
	// Existing: the catalog already had this template (same name, tag and
	// content); nothing was added.
	Existing bool
	// Devices are device nodes the layers held (the first few, of
	// DevicesSkipped); none is created.
	Devices        []string
	DevicesSkipped int
	// Xattrs were restored; XattrsSkipped were not (not a kept namespace,
	// on a symbolic link, or refused by the file system).
	Xattrs, XattrsSkipped int
}

const maxReportedDevices = 16

func (r *Report) skipDevice(name string) {
	r.DevicesSkipped++
	if len(r.Devices) < maxReportedDevices {
		r.Devices = append(r.Devices, "/"+name)
	}
}

// maxConfigBytes bounds the template config (it travels with the template
// in every worker report).
const maxConfigBytes = 64 << 10

var (
	nameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	tagRe  = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)
)

// Validate checks the options before anything is read.
func (o *Options) Validate() error {
	if o.Tag == "" {
		o.Tag = "latest"
	}
	if o.OS == "" {
		o.OS = "linux"
	}
	if o.Arch == "" {
		o.Arch = runtime.GOARCH
	}
	o.Limits = o.Limits.withDefaults()
	if !nameRe.MatchString(o.Name) {
		return fmt.Errorf("template name %q: use 1 to 63 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit: %w", o.Name, model.ErrInvalid)
	}
	if !tagRe.MatchString(o.Tag) {
		return fmt.Errorf("template tag %q: use 1 to 128 letters, digits, '.', '_' or '-', not starting with '.' or '-': %w", o.Tag, model.ErrInvalid)
	}
	if o.Agent == "" {
		return fmt.Errorf("the guest agent binary to put in the template is required: %w", model.ErrInvalid)
	}
	fi, err := os.Stat(o.Agent)
	if err != nil {
		return fmt.Errorf("guest agent: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("guest agent %s is not a regular file: %w", o.Agent, model.ErrInvalid)
	}
	if !o.NoOwners && os.Geteuid() != 0 {
		return fmt.Errorf("importing an image keeps its files' owners, which needs root: run as root: %w", model.ErrForbidden)
	}
	return nil
}

// Import imports the image at src (an OCI layout directory, or a tar of an
// OCI layout or a docker save archive) into the template catalog under
// dataDir as o.Name:o.Tag. Scratch space is a directory under
// dataDir/templates, removed at the end.
func Import(ctx context.Context, dataDir, src string, o Options) (Report, error) {
	var rep Report
	if err := o.Validate(); err != nil {
		return rep, err
	}
	build, err := newBuild(dataDir)
	if err != nil {
		return rep, err
	}
	defer removeTree(build)

	src = filepath.Clean(src)
	s, err := open(src, build, o)
	if err != nil {
		return rep, fmt.Errorf("import %s: %w", src, err)
	}
	return add(ctx, dataDir, build, src, s, o)
}

// newBuild makes the scratch directory of one import under
// dataDir/templates.
func newBuild(dataDir string) (string, error) {
	tdir := filepath.Join(dataDir, "templates")
	if err := os.MkdirAll(tdir, 0o755); err != nil {
		return "", fmt.Errorf("import: %w", err)
	}
	// 0700: the tree may hold setuid programs of any owner; no host user
	// but root may reach them (the catalog entry keeps this mode).
	build, err := os.MkdirTemp(tdir, ".import-")
	if err != nil {
		return "", fmt.Errorf("import: %w", err)
	}
	return build, nil
}

// add assembles s's image in build and adds it to dataDir's catalog.
func add(ctx context.Context, dataDir, build, src string, s source, o Options) (Report, error) {
	rep := Report{Source: s.kind}
	t, err := assemble(ctx, s.image, build, o, &rep)
	if err != nil {
		return rep, fmt.Errorf("import %s: %w", src, err)
	}
	if err := os.RemoveAll(filepath.Join(build, "layout")); err != nil {
		return rep, fmt.Errorf("import %s: %w", src, err)
	}

	unlock, err := image.Lock(dataDir)
	if err != nil {
		return rep, fmt.Errorf("import %s: %w", src, err)
	}
	defer unlock()
	if have, err := image.ReadTemplate(dataDir, t.Digest); err == nil && have.Digest == t.Digest {
		if have.Name != t.Name || have.Tag != t.Tag {
			return rep, fmt.Errorf("import %s: this image is already template %s:%s (%s); a template has one name for now: use that one, or remove it first: %w",
				src, have.Name, have.Tag, have.Digest, model.ErrConflict)
		}
		rep.Template, rep.Existing = have, true
		progressf(o.Progress, "template %s:%s is already %s", t.Name, t.Tag, t.Digest)
		return rep, nil
	}
	if err := image.AddTemplate(dataDir, build, t); err != nil {
		return rep, fmt.Errorf("import %s: %w", src, err)
	}
	rep.Template = t
	progressf(o.Progress, "template %s:%s is %s (%d MiB)", t.Name, t.Tag, t.Digest, t.SizeBytes>>20)
	return rep, nil
}

// assemble applies img's layers into build/rootfs, adds the agent and
// returns the template (not yet in the catalog).
func assemble(ctx context.Context, img v1.Image, build string, o Options, rep *Report) (model.Template, error) {
	var t model.Template
	dg, err := img.Digest()
	if err != nil {
		return t, fmt.Errorf("image digest: %w", err)
	}
	rep.Image = dg.String()
	m, err := img.Manifest()
	if err != nil {
		return t, fmt.Errorf("manifest: %w", err)
	}
	cf, err := configFile(img)
	if err != nil {
		return t, fmt.Errorf("image config: %w", err)
	}
	if raw, err := img.RawConfigFile(); err != nil {
		return t, fmt.Errorf("image config: %w", err)
	} else if h, _, _ := v1.SHA256(bytes.NewReader(raw)); h != m.Config.Digest {
		return t, fmt.Errorf("image config: its content is %s, the manifest says %s (a corrupt or altered archive): %w", h, m.Config.Digest, model.ErrInvalid)
	}
	if cf.OS != o.OS || cf.Architecture != o.Arch {
		return t, fmt.Errorf("the image is for %s/%s; this machine runs %s images: %w", cf.OS, cf.Architecture, o.platform(), model.ErrInvalid)
	}
	layers, err := img.Layers()
	if err != nil {
		return t, fmt.Errorf("layers: %w", err)
	}
	if len(layers) > o.Limits.MaxLayers {
		return t, fmt.Errorf("the image has %d layers (at most %d, Limits.MaxLayers): %w", len(layers), o.Limits.MaxLayers, model.ErrInvalid)
	}
	diffIDs := cf.RootFS.DiffIDs
	if len(diffIDs) != len(layers) {
		return t, fmt.Errorf("the image config lists %d layers, the manifest %d: %w", len(diffIDs), len(layers), model.ErrInvalid)
	}
	cfg, err := templateConfig(cf.Config)
	if err != nil {
		return t, err
	}

	rootfs := filepath.Join(build, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return t, err
	}
	if err := os.Chmod(rootfs, 0o755); err != nil {
		return t, err
	}
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return t, err
	}
	defer root.Close()
	a := &applier{root: root, owners: !o.NoOwners, limits: o.Limits, report: rep}
	for i, l := range layers {
		if err := ctx.Err(); err != nil {
			return t, err
		}
		progressf(o.Progress, "import: layer %d/%d", i+1, len(layers))
		if err := applyLayer(ctx, a, l, i+1, diffIDs[i]); err != nil {
			return t, err
		}
	}
	rep.Layers, rep.Entries, rep.Bytes = len(layers), a.entries, a.bytes
	if err := addAgent(a, o.Agent); err != nil {
		return t, err
	}
	progressf(o.Progress, "import: computing the content digest")
	tree, size, err := image.Digest(rootfs)
	if err != nil {
		return t, err
	}
	digest, err := TemplateDigest(tree, cfg)
	if err != nil {
		return t, err
	}
	return model.Template{Name: o.Name, Tag: o.Tag, Digest: digest, SizeBytes: size, CreatedAt: time.Now().UTC(), Config: cfg}, nil
}

// applyLayer applies one layer and checks its content against the config's
// diff_id.
func applyLayer(ctx context.Context, a *applier, l v1.Layer, n int, diffID v1.Hash) error {
	rc, err := l.Uncompressed()
	if err != nil {
		return fmt.Errorf("layer %d: %w", n, err)
	}
	defer rc.Close()
	if diffID.Algorithm != "sha256" {
		return fmt.Errorf("layer %d: diff_id %s: only sha256 is supported: %w", n, diffID, model.ErrInvalid)
	}
	h := sha256.New()
	if err := a.apply(ctx, io.TeeReader(rc, h), n); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != diffID.Hex {
		return fmt.Errorf("layer %d: its content is sha256:%s, the image config says %s (a corrupt or altered archive): %w", n, got, diffID, model.ErrInvalid)
	}
	return nil
}

// addAgent copies the agent to AgentPath (root, 0755), replacing whatever
// the image had there.
func addAgent(a *applier, agent string) error {
	a.layer = 0
	a.written, a.ancestors = map[string]bool{}, map[string]bool{}
	if err := a.parents(AgentPath, "/"+AgentPath, true); err != nil {
		return fmt.Errorf("add the guest agent: %w", err)
	}
	if err := a.replace(AgentPath, false); err != nil {
		return fmt.Errorf("add the guest agent: %w", err)
	}
	in, err := os.Open(agent)
	if err != nil {
		return fmt.Errorf("add the guest agent: %w", err)
	}
	defer in.Close()
	out, err := a.root.OpenFile(AgentPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o700)
	if err != nil {
		return fmt.Errorf("add the guest agent: %w", err)
	}
	_, err = io.Copy(out, in)
	if err == nil && a.owners {
		err = out.Chown(0, 0)
	}
	if err == nil {
		err = out.Chmod(0o755)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("add the guest agent: %w", err)
	}
	return nil
}

// templateConfig maps the image config onto the template's command
// defaults, bounded; nil when the image says nothing.
func templateConfig(c v1.Config) (*model.TemplateConfig, error) {
	tc := &model.TemplateConfig{User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd}
	for _, kv := range c.Env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsRune(kv, 0) {
			return nil, fmt.Errorf("image config: Env entry %q is not NAME=value: %w", kv, model.ErrInvalid)
		}
		tc.Env = append(tc.Env, kv)
	}
	if wd := c.WorkingDir; wd != "" {
		if strings.ContainsRune(wd, 0) {
			return nil, fmt.Errorf("image config: WorkingDir %q: %w", wd, model.ErrInvalid)
		}
		tc.WorkingDir = path.Clean("/" + wd) // relative to / as Docker takes it
	}
	if strings.ContainsRune(c.User, 0) {
		return nil, fmt.Errorf("image config: User %q: %w", c.User, model.ErrInvalid)
	}
	b, _ := json.Marshal(tc)
	if len(b) > maxConfigBytes {
		return nil, fmt.Errorf("image config: Env, User, WorkingDir, Entrypoint and Cmd take %d bytes (at most %d): %w", len(b), maxConfigBytes, model.ErrInvalid)
	}
	return tc, nil
}

// TemplateDigest is an imported template's digest: the sha256 of its
// tree's image.Digest and its config (canonical JSON), so that two images
// with one tree and different defaults are different templates.
func TemplateDigest(tree string, cfg *model.TemplateConfig) (string, error) {
	b, err := json.Marshal(cfg)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "airlock template v1\ntree %s\nconfig %s\n", tree, b)
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// removeTree removes dir; without root, read-only directories of the
// image (0555) are made writable first.
func removeTree(dir string) {
	if os.RemoveAll(dir) == nil {
		return
	}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o700)
		}
		return nil
	})
	os.RemoveAll(dir)
}

// progressf writes one progress line; a nil writer discards it.
func progressf(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}

// BaseAgent returns the guest agent of the newest base template in
// dataDir's catalog: the agent the worker there installed (and checked to
// be static), which an imported template should carry too.
func BaseAgent(dataDir string) (string, error) {
	ts, err := image.ListTemplates(dataDir)
	if err != nil {
		return "", err
	}
	for i := len(ts) - 1; i >= 0; i-- {
		if ts[i].Name != "base" {
			continue
		}
		p := filepath.Join(image.TemplateRootFS(dataDir, ts[i].Digest), AgentPath)
		if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("no base template in %s to take the guest agent from: start `airlock up` (or `airlock worker`) with --data-dir %s once, or pass --agent: %w", dataDir, dataDir, model.ErrNotFound)
}
