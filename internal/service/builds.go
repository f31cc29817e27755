package service

// Template builds (issue "Templates", items 2 and 4): a recipe
// (model.BuildSpec) is validated here, sent to a worker that holds its
// parent (workerapi.DataPlane.Build, with the files its COPY steps name),
// and followed to the end: every event the worker streams is kept
// (bounded), the step report is kept current, and once the worker says
// "done" the build waits until the worker's sync has told the store of the
// new template under name:tag, so that a create from it right after works.
//
// Build files are the inputs of COPY steps: tars (optionally gzip'ed) an
// org uploads under a key — the native API's key is the sha256 of the
// body, which the server checks; E2B's is its SDK's own opaque hash — and
// the store keeps, chunked, so that API servers stay stateless.
//
// A build runs in a goroutine of the server that started it, bounded by
// the operation deadline. A build left unfinished past that deadline (its
// server stopped) is marked failed when it is next read.

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/scheduler"
	"github.com/airlock/airlock/internal/store"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

// Bounds and defaults of builds.
const (
	// BuildRuntime is the runtime whose workers run builds (RUN steps run
	// in a gVisor sandbox of the parent); it must declare Caps.Build.
	BuildRuntime = "gvisor"
	// MaxBuildEventsPage bounds one answer of BuildEvents.
	MaxBuildEventsPage = 1000
	// buildReportWait bounds how long a build that is done waits for the
	// worker's sync to report the new template.
	buildReportWait = 2 * time.Minute
	// buildPoll is how often waits re-read the store (other servers'
	// writes are seen no later than this).
	buildPoll = time.Second
)

// ErrBuildFileHash is what PutBuildFile wraps when the content's sha256
// is not the key it was uploaded under (the native API says 400).
var ErrBuildFileHash = fmt.Errorf("build file hash mismatch: %w", model.ErrInvalid)

// Template names and tags, as imports take them (internal/image/oci).
var (
	templateNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	templateTagRe  = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)
	buildFileKeyRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	sha256HexRe    = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// BuildBuilder is the optional power of a DataPlane that sends builds
// (workerapi.DataPlane has it).
type BuildBuilder interface {
	Build(ctx context.Context, t workerapi.Target, req workerapi.BuildRequest, files []workerapi.BuildFile, onEvent func(model.BuildEvent)) error
}

// buildWaiters wakes BuildEvents long polls of this server when a build's
// events or state change.
type buildWaiters struct {
	mu sync.Mutex
	ch map[string]chan struct{}
}

func (w *buildWaiters) wait(id string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = map[string]chan struct{}{}
	}
	c, ok := w.ch[id]
	if !ok {
		c = make(chan struct{})
		w.ch[id] = c
	}
	return c
}

func (w *buildWaiters) wake(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if c, ok := w.ch[id]; ok {
		close(c)
		delete(w.ch, id)
	}
}

// ValidBuildFileKey reports whether key may name a build file.
func ValidBuildFileKey(key string) error {
	if !buildFileKeyRe.MatchString(key) {
		return model.Errorf(model.ErrInvalid, "build file key %.80q is invalid: use 1 to 128 letters, digits, '.', '_' or '-' (the native API's is the lowercase hex sha256 of the file)", key)
	}
	return nil
}

// PutBuildFile stores the build file read from r under key for org: a tar,
// optionally gzip'ed, of at most model.MaxBuildFileBytes (ErrTooLarge
// beyond). With verify, key must be the lowercase hex sha256 of the
// content (ErrBuildFileHash otherwise). A key the org has already is
// accepted again without storing anything (created false).
func (s *Service) PutBuildFile(ctx context.Context, orgID, key string, r io.Reader, verify bool) (store.BuildFile, bool, error) {
	if err := ValidBuildFileKey(key); err != nil {
		return store.BuildFile{}, false, err
	}
	if verify && !sha256HexRe.MatchString(key) {
		return store.BuildFile{}, false, model.Errorf(ErrBuildFileHash, "build file key %.80q is not a sha256: upload the file under the lowercase hex sha256 of its bytes", key)
	}
	tmp, err := os.CreateTemp("", "airlock-build-file-*")
	if err != nil {
		return store.BuildFile{}, false, fmt.Errorf("spool build file: %w", err)
	}
	defer func() {
		tmp.Close()
		os.Remove(tmp.Name())
	}()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(r, model.MaxBuildFileBytes+1))
	if err != nil {
		return store.BuildFile{}, false, fmt.Errorf("read build file: %w", err)
	}
	if n > model.MaxBuildFileBytes {
		return store.BuildFile{}, false, model.Errorf(model.ErrTooLarge, "the build file is larger than %d bytes (%d MiB); copy fewer or smaller files in one step", int64(model.MaxBuildFileBytes), model.MaxBuildFileBytes>>20)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if verify && sum != key {
		return store.BuildFile{}, false, model.Errorf(ErrBuildFileHash, "the body's sha256 is %s, not %s as the path says: upload the file to /v1/templates/files/%s (the sha256 of exactly the bytes sent)", sum, key, sum)
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return store.BuildFile{}, false, fmt.Errorf("spool build file: %w", err)
	}
	if err := checkBuildTar(tmp); err != nil {
		return store.BuildFile{}, false, err
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return store.BuildFile{}, false, fmt.Errorf("spool build file: %w", err)
	}
	f := store.BuildFile{OrgID: orgID, Key: key, Size: n, SHA256: sum, CreatedAt: s.now()}
	created, err := s.st.PutBuildFile(ctx, f, tmp)
	if err != nil {
		return store.BuildFile{}, false, fmt.Errorf("store build file %s: %w", key, err)
	}
	if !created {
		if f, err = s.st.GetBuildFile(ctx, orgID, key); err != nil {
			return store.BuildFile{}, false, fmt.Errorf("get build file %s: %w", key, err)
		}
	}
	return f, created, nil
}

// checkBuildTar checks that r starts as a tar, plain or gzip'ed.
func checkBuildTar(r io.Reader) error {
	br := bufio.NewReader(r)
	var tr *tar.Reader
	if head, _ := br.Peek(2); len(head) == 2 && head[0] == 0x1f && head[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return model.Errorf(model.ErrUnprocessable, "the build file is not a gzip'ed tar: %v", err)
		}
		tr = tar.NewReader(zr)
	} else {
		tr = tar.NewReader(br)
	}
	if _, err := tr.Next(); err != nil && !errors.Is(err, io.EOF) {
		return model.Errorf(model.ErrUnprocessable, "the build file is not a tar (optionally gzip'ed) of the files to copy: %v", err)
	}
	return nil
}

// HasBuildFile reports whether org has uploaded key.
func (s *Service) HasBuildFile(ctx context.Context, orgID, key string) (bool, error) {
	if ValidBuildFileKey(key) != nil {
		return false, nil
	}
	_, err := s.st.GetBuildFile(ctx, orgID, key)
	if errors.Is(err, model.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get build file %s: %w", key, err)
	}
	return true, nil
}

// OpenBuildFile returns org's file key as a build sends it: its size and
// an opener of its content, read from the store chunk by chunk.
func (s *Service) OpenBuildFile(ctx context.Context, orgID, key string) (workerapi.BuildFile, error) {
	f, err := s.st.GetBuildFile(ctx, orgID, key)
	if err != nil {
		return workerapi.BuildFile{}, err
	}
	return workerapi.BuildFile{Hash: key, Size: f.Size, Open: func() (io.ReadCloser, error) {
		return &chunkReader{ctx: ctx, st: s.st, org: orgID, key: key, left: f.Size}, nil
	}}, nil
}

// chunkReader reads a build file's chunks in order.
type chunkReader struct {
	ctx      context.Context
	st       store.Builds
	org, key string
	n        int
	buf      []byte
	left     int64
}

func (c *chunkReader) Read(p []byte) (int, error) {
	for len(c.buf) == 0 {
		if c.left <= 0 {
			return 0, io.EOF
		}
		b, err := c.st.ReadBuildFileChunk(c.ctx, c.org, c.key, c.n)
		if err != nil {
			return 0, fmt.Errorf("read build file %s chunk %d: %w", c.key, c.n, err)
		}
		if len(b) == 0 {
			return 0, fmt.Errorf("build file %s: chunk %d is empty", c.key, c.n)
		}
		c.n++
		c.buf = b
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	c.left -= int64(n)
	return n, nil
}

func (c *chunkReader) Close() error { return nil }

// ---- upload tokens (E2B's SDKs upload to a URL, without the API key)

const uploadTokenDomain = "airlock build file upload\x00"

// SignBuildFileUpload returns a token that lets its holder upload org's
// build file key until ttl from now (VerifyBuildFileUpload).
func (s *Service) SignBuildFileUpload(ctx context.Context, orgID, key string, ttl time.Duration) (string, error) {
	k, err := s.signingKey(ctx)
	if err != nil {
		return "", err
	}
	payload := orgID + "\x00" + key + "\x00" + strconv.FormatInt(s.now().Add(ttl).Unix(), 10)
	m := hmac.New(sha256.New, k)
	m.Write([]byte(uploadTokenDomain + payload))
	enc := base64.RawURLEncoding
	return enc.EncodeToString([]byte(payload)) + "." + enc.EncodeToString(m.Sum(nil)), nil
}

// VerifyBuildFileUpload returns the org and key an upload token names
// (ErrUnauthorized for a forged or expired one).
func (s *Service) VerifyBuildFileUpload(ctx context.Context, tok string) (orgID, key string, err error) {
	bad := model.Errorf(model.ErrUnauthorized, "the upload URL is invalid or has expired; ask for a new one (GET /templates/{templateID}/files/{hash})")
	p64, m64, ok := strings.Cut(tok, ".")
	enc := base64.RawURLEncoding
	payload, err1 := enc.DecodeString(p64)
	mac, err2 := enc.DecodeString(m64)
	if !ok || err1 != nil || err2 != nil {
		return "", "", bad
	}
	k, err := s.signingKey(ctx)
	if err != nil {
		return "", "", err
	}
	m := hmac.New(sha256.New, k)
	m.Write([]byte(uploadTokenDomain))
	m.Write(payload)
	if !hmac.Equal(mac, m.Sum(nil)) {
		return "", "", bad
	}
	parts := strings.Split(string(payload), "\x00")
	if len(parts) != 3 {
		return "", "", bad
	}
	exp, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil || s.now().Unix() > exp {
		return "", "", bad
	}
	return parts[0], parts[1], nil
}

// ---- builds

// normalizeBuildSpec checks spec's own fields and fills in defaults.
func (s *Service) normalizeBuildSpec(p Principal, spec *model.BuildSpec) error {
	if spec.Tag == "" {
		spec.Tag = defaultTemplateTag
	}
	if !templateNameRe.MatchString(spec.Name) {
		return model.Errorf(model.ErrUnprocessable, "template name %.80q is invalid: use 1 to 63 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit", spec.Name)
	}
	if !templateTagRe.MatchString(spec.Tag) {
		return model.Errorf(model.ErrUnprocessable, "template tag %.80q is invalid: use 1 to 128 letters, digits, '.', '_' or '-', not starting with '.' or '-'", spec.Tag)
	}
	if spec.Name == BaseTemplate && !p.Operator() {
		return model.Errorf(model.ErrForbidden, "template %s is the built-in base template; only operators (admin keys of the %q org) may build it", BaseTemplate, DefaultOrgName)
	}
	return nil
}

// validateSteps checks spec's steps (model.BuildSpec.Validate: known
// kinds, bounds, arguments) and the form of their file keys.
func validateSteps(spec model.BuildSpec) error {
	if spec.From == "" {
		return model.Errorf(model.ErrUnprocessable, "the recipe names no parent template (from); use base, a template name[:tag] or sha256:<digest>")
	}
	if err := spec.Validate(); err != nil {
		return model.Errorf(model.ErrUnprocessable, "%s", strings.TrimSuffix(err.Error(), ": "+model.ErrInvalid.Error()))
	}
	for i, st := range spec.Steps {
		if st.Kind == model.StepCopy {
			if err := ValidBuildFileKey(st.FilesHash); err != nil {
				return model.Errorf(model.ErrUnprocessable, "step %d (COPY): %v", i+1, strings.TrimSuffix(err.Error(), ": "+model.ErrInvalid.Error()))
			}
		}
	}
	return nil
}

// checkBuildName refuses a build whose name:tag points at content p's
// org did not build: templates are installation-wide, so one org's build
// must not move another's (or an operator's import) to new content.
// Operators may build over any name.
func (s *Service) checkBuildName(ctx context.Context, p Principal, spec model.BuildSpec) error {
	if p.Operator() {
		return nil
	}
	cur, err := s.st.GetTemplate(ctx, spec.Name, spec.Tag)
	if errors.Is(err, model.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get template %s:%s: %w", spec.Name, spec.Tag, err)
	}
	owned, err := s.orgBuilt(ctx, p.OrgID, cur.Digest)
	if err != nil || owned {
		return err
	}
	return model.Errorf(model.ErrConflict, "template %s:%s exists and was not built by org %s; build under another name or tag", spec.Name, spec.Tag, p.OrgID)
}

// orgBuilt reports whether one of org's (recent) builds made digest.
func (s *Service) orgBuilt(ctx context.Context, orgID, digest string) (bool, error) {
	bs, err := s.st.ListBuilds(ctx, orgID, MaxListLimit)
	if err != nil {
		return false, fmt.Errorf("list builds: %w", err)
	}
	return slices.ContainsFunc(bs, func(b model.Build) bool { return b.State == model.BuildReady && b.Digest == digest }), nil
}

// buildFrom resolves the parent of a recipe.
func (s *Service) buildFrom(ctx context.Context, from string) (model.Template, error) {
	if from == "" {
		return model.Template{}, model.Errorf(model.ErrUnprocessable, "the recipe names no parent template (from); use base, a template name[:tag] or sha256:<digest>")
	}
	tpl, _, err := s.resolveTemplate(ctx, from)
	if errors.Is(err, errTemplateNotFound) {
		return model.Template{}, withHint(model.Errorf(model.ErrUnprocessable, "the parent template %q (from) does not exist here; import or pull it first (`airlock template import`, `airlock template pull`)", from), Hint{Kind: HintListTemplates})
	}
	return tpl, err
}

// prepared is a validated build, ready to send.
type prepared struct {
	req    workerapi.BuildRequest
	files  []workerapi.BuildFile
	worker model.Worker
}

// prepareBuild validates spec for p and picks its worker.
func (s *Service) prepareBuild(ctx context.Context, p Principal, id string, spec *model.BuildSpec) (prepared, error) {
	if err := s.normalizeBuildSpec(p, spec); err != nil {
		return prepared{}, err
	}
	if err := validateSteps(*spec); err != nil {
		return prepared{}, err
	}
	if err := s.checkBuildName(ctx, p, *spec); err != nil {
		return prepared{}, err
	}
	from, err := s.buildFrom(ctx, spec.From)
	if err != nil {
		return prepared{}, err
	}
	var files []workerapi.BuildFile
	var missing []string
	for _, st := range spec.Steps {
		if st.Kind != model.StepCopy || slices.ContainsFunc(files, func(f workerapi.BuildFile) bool { return f.Hash == st.FilesHash }) || slices.Contains(missing, st.FilesHash) {
			continue
		}
		f, err := s.OpenBuildFile(context.WithoutCancel(ctx), p.OrgID, st.FilesHash)
		if errors.Is(err, model.ErrNotFound) {
			missing = append(missing, st.FilesHash)
			continue
		}
		if err != nil {
			return prepared{}, fmt.Errorf("get build file %s: %w", st.FilesHash, err)
		}
		files = append(files, f)
	}
	if len(missing) > 0 {
		return prepared{}, model.Errorf(model.ErrUnprocessable, "the files of COPY steps were not uploaded: %s; upload each with PUT /v1/templates/files/{hash} first", strings.Join(missing, ", "))
	}
	org, err := s.st.GetOrg(ctx, p.OrgID)
	if err != nil {
		return prepared{}, fmt.Errorf("get org %s: %w", p.OrgID, err)
	}
	network, err := s.resolveNetwork(ctx, p, org, nil)
	if err != nil {
		return prepared{}, err
	}
	egress, err := EgressOf(ctx, s.st, &s.cas, model.Sandbox{ID: id, OrgID: p.OrgID, Network: network})
	if err != nil {
		return prepared{}, fmt.Errorf("egress material of org %s: %w", p.OrgID, err)
	}
	workers, err := s.st.ListWorkers(ctx)
	if err != nil {
		return prepared{}, fmt.Errorf("list workers: %w", err)
	}
	sbs, err := store.ListAllSandboxes(ctx, s.st, store.SandboxFilter{})
	if err != nil {
		return prepared{}, fmt.Errorf("list sandboxes: %w", err)
	}
	req := scheduler.Request{Runtime: BuildRuntime, Needs: model.RuntimeCaps{Build: true}, TemplateDigest: from.Digest,
		Resources: model.Resources{VCPUs: DefaultVCPUs, MemoryMiB: DefaultMemoryMiB}}
	wid, err := s.placer().Place(scheduler.Cluster{Workers: workers, Load: scheduler.LoadOf(sbs), Now: s.now()}, req)
	if err != nil {
		return prepared{}, model.Errorf(model.ErrUnavailable, "no worker can build from %s: %v", spec.From, err)
	}
	var w model.Worker
	for _, x := range workers {
		if x.ID == wid {
			w = x
		}
	}
	return prepared{
		req:    workerapi.BuildRequest{ID: id, OrgID: p.OrgID, Spec: *spec, FromDigest: from.Digest, Network: network, Egress: egress},
		files:  files,
		worker: w,
	}, nil
}

// StartBuild validates spec, records a build of it and starts it on a
// worker that holds its parent. The build runs on after the call returns;
// follow it with GetBuild or BuildEvents.
func (s *Service) StartBuild(ctx context.Context, p Principal, spec model.BuildSpec) (model.Build, error) {
	if _, ok := s.dataPlane().(BuildBuilder); !ok {
		return model.Build{}, model.Errorf(model.ErrUnavailable, "this server cannot send builds to workers")
	}
	id := model.NewID("bld")
	pr, err := s.prepareBuild(ctx, p, id, &spec)
	if err != nil {
		return model.Build{}, err
	}
	b := model.Build{ID: id, OrgID: p.OrgID, State: model.BuildBuilding, Spec: spec, Worker: pr.worker.ID, CreatedAt: s.now()}
	if err := s.st.CreateBuild(ctx, b); err != nil {
		return model.Build{}, fmt.Errorf("create build: %w", err)
	}
	s.launchBuild(b, pr)
	return b, nil
}

// CreateWaitingBuild records a build of name:tag whose recipe comes later
// (StartWaitingBuild): E2B's SDKs ask for a build id first, upload files,
// then send the steps.
func (s *Service) CreateWaitingBuild(ctx context.Context, p Principal, name, tag string) (model.Build, error) {
	spec := model.BuildSpec{Name: name, Tag: tag}
	if err := s.normalizeBuildSpec(p, &spec); err != nil {
		return model.Build{}, err
	}
	b := model.Build{ID: model.NewID("bld"), OrgID: p.OrgID, State: model.BuildWaiting, Spec: spec, CreatedAt: s.now()}
	if err := s.st.CreateBuild(ctx, b); err != nil {
		return model.Build{}, fmt.Errorf("create build: %w", err)
	}
	return b, nil
}

// StartWaitingBuild starts waiting build id with spec (its name and tag
// are the build's own: spec's are ignored). ErrConflict if it started
// already.
func (s *Service) StartWaitingBuild(ctx context.Context, p Principal, id string, spec model.BuildSpec) (model.Build, error) {
	if _, ok := s.dataPlane().(BuildBuilder); !ok {
		return model.Build{}, model.Errorf(model.ErrUnavailable, "this server cannot send builds to workers")
	}
	b, err := s.GetBuild(ctx, p, id)
	if err != nil {
		return model.Build{}, err
	}
	if b.State != model.BuildWaiting {
		return model.Build{}, model.Errorf(model.ErrConflict, "build %s is %s already; request a new build", id, b.State)
	}
	spec.Name, spec.Tag = b.Spec.Name, b.Spec.Tag
	pr, err := s.prepareBuild(ctx, p, id, &spec)
	if err != nil {
		return model.Build{}, err
	}
	b.State, b.Spec, b.Worker = model.BuildBuilding, spec, pr.worker.ID
	if err := s.st.UpdateBuild(ctx, b); err != nil {
		if errors.Is(err, model.ErrConflict) {
			return model.Build{}, model.Errorf(model.ErrConflict, "build %s started or ended already; request a new build", id)
		}
		return model.Build{}, fmt.Errorf("start build %s: %w", id, err)
	}
	s.builds.wake(id)
	s.launchBuild(b, pr)
	return b, nil
}

// GetBuild returns p's org's build id (ErrNotFound for another org's).
func (s *Service) GetBuild(ctx context.Context, p Principal, id string) (model.Build, error) {
	b, err := s.st.GetBuild(ctx, id)
	if errors.Is(err, model.ErrNotFound) || (err == nil && b.OrgID != p.OrgID) {
		return model.Build{}, model.Errorf(model.ErrNotFound, "build %.80q not found", id)
	}
	if err != nil {
		return model.Build{}, fmt.Errorf("get build %s: %w", id, err)
	}
	return s.expireBuild(ctx, b), nil
}

// ListBuilds returns p's org's builds, newest first, at most limit (0:
// DefaultListLimit; at most MaxListLimit).
func (s *Service) ListBuilds(ctx context.Context, p Principal, limit int) ([]model.Build, error) {
	if limit <= 0 {
		limit = DefaultListLimit
	}
	if limit > MaxListLimit {
		return nil, model.Errorf(model.ErrUnprocessable, "limit %d is over %d", limit, MaxListLimit)
	}
	bs, err := s.st.ListBuilds(ctx, p.OrgID, limit)
	if err != nil {
		return nil, fmt.Errorf("list builds: %w", err)
	}
	for i := range bs {
		bs[i] = s.expireBuild(ctx, bs[i])
	}
	return bs, nil
}

// expireBuild marks b failed when it is unfinished past its deadline (its
// server stopped while it ran) and returns it as stored.
func (s *Service) expireBuild(ctx context.Context, b model.Build) model.Build {
	if b.State != model.BuildWaiting && b.State != model.BuildBuilding {
		return b
	}
	if s.now().Before(b.CreatedAt.Add(s.deadline())) {
		return b
	}
	at := s.now()
	b.State, b.FinishedAt = model.BuildFailed, &at
	b.Error = fmt.Sprintf("the build did not finish within its deadline (%s): it took too long, or the server running it stopped; start it again", s.deadline())
	if err := s.st.UpdateBuild(ctx, b); err != nil {
		if cur, gerr := s.st.GetBuild(ctx, b.ID); gerr == nil {
			return cur
		}
		s.logger().Warn("expire build", "build", b.ID, "err", err)
	}
	s.builds.wake(b.ID)
	return b
}

// BuildEvents returns p's org's build id's events after seq after, oldest
// first (at most MaxBuildEventsPage), and the build's state. When there
// are none and the build is not finished, it waits up to wait (at most
// MaxWait) for one.
func (s *Service) BuildEvents(ctx context.Context, p Principal, id string, after int, wait time.Duration) ([]model.BuildEvent, model.Build, error) {
	return s.buildEvents(ctx, p, id, after, MaxBuildEventsPage, wait)
}

func (s *Service) buildEvents(ctx context.Context, p Principal, id string, after, limit int, wait time.Duration) ([]model.BuildEvent, model.Build, error) {
	if after < 0 {
		return nil, model.Build{}, model.Errorf(model.ErrUnprocessable, "after %d is negative", after)
	}
	wait = min(max(wait, 0), MaxWait)
	end := time.NewTimer(wait)
	defer end.Stop()
	for {
		woken := s.builds.wait(id)
		b, err := s.GetBuild(ctx, p, id)
		if err != nil {
			return nil, model.Build{}, err
		}
		evs, err := s.st.ListBuildEvents(ctx, id, after, limit)
		if err != nil {
			return nil, model.Build{}, fmt.Errorf("list build events: %w", err)
		}
		if len(evs) > 0 || b.State == model.BuildReady || b.State == model.BuildFailed || wait == 0 {
			if evs == nil {
				evs = []model.BuildEvent{}
			}
			return evs, b, nil
		}
		poll := time.NewTimer(buildPoll)
		select {
		case <-ctx.Done():
			poll.Stop()
			return nil, model.Build{}, ctx.Err()
		case <-end.C:
			wait = 0 // one last read
		case <-woken:
		case <-poll.C:
		}
		poll.Stop()
	}
}

// launchBuild runs b on its worker in the background.
func (s *Service) launchBuild(b model.Build, pr prepared) {
	go s.runBuild(b, pr)
}

// buildRun is one build being followed.
type buildRun struct {
	s  *Service
	b  model.Build
	mu sync.Mutex
	// seq is the last Seq given; pending are events not stored yet.
	seq      int
	pending  []model.BuildEvent
	dropped  int
	failText string
	digest   string
	flushing sync.Mutex
	signal   chan struct{}
}

func (s *Service) runBuild(b model.Build, pr prepared) {
	ctx, cancel := context.WithDeadline(context.Background(), b.CreatedAt.Add(s.deadline()))
	defer cancel()
	r := &buildRun{s: s, b: b, signal: make(chan struct{}, 1)}
	flushDone := make(chan struct{})
	stopFlush := make(chan struct{})
	go func() {
		defer close(flushDone)
		for {
			select {
			case <-r.signal:
				r.flush(ctx)
			case <-stopFlush:
				return
			}
		}
	}()
	err := r.build(ctx, pr)
	close(stopFlush)
	<-flushDone
	r.flush(ctx)
	r.finish(ctx, err)
}

func (r *buildRun) build(ctx context.Context, pr prepared) error {
	s := r.s
	bp, ok := s.dataPlane().(BuildBuilder)
	if !ok {
		return model.Errorf(model.ErrUnavailable, "this server cannot send builds to workers")
	}
	t, err := s.target(ctx, pr.worker, model.Sandbox{ID: r.b.ID, OrgID: r.b.OrgID}, token.Claims{Scope: token.ScopeBuild})
	if err != nil {
		return err
	}
	err = bp.Build(ctx, t, pr.req, pr.files, r.onEvent)
	if err != nil {
		r.mu.Lock()
		text := r.failText
		r.mu.Unlock()
		if text != "" {
			return errors.New(text)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("the build did not finish within its deadline (%s)", s.deadline())
		}
		return workerError(err, pr.worker.ID, "building")
	}
	return nil
}

// onEvent keeps one event of the worker's stream (numbered anew: the
// server's Seq has no gaps) and wakes the flusher.
func (r *buildRun) onEvent(ev model.BuildEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(ev.Text) > model.MaxBuildLineBytes {
		ev.Text = ev.Text[:model.MaxBuildLineBytes] + "…"
	}
	if ev.Time.IsZero() {
		ev.Time = r.s.now()
	}
	switch ev.Type {
	case "error":
		r.failText = ev.Text
		if r.failText == "" {
			r.failText = "the build failed"
		}
	case "done":
		r.digest = ev.Digest
	case "step", "step_done":
		if ev.Step != nil {
			r.b.Steps = upsertStep(r.b.Steps, *ev.Step)
		}
	default:
		// Output and info are bounded; steps and the end always are kept.
		if r.seq >= model.MaxBuildEvents-1 {
			if r.dropped == 0 {
				r.seq++
				r.pending = append(r.pending, model.BuildEvent{Seq: r.seq, Time: ev.Time, Type: "info",
					Text: fmt.Sprintf("the build has more than %d events; later output is dropped (its steps and result are still reported)", model.MaxBuildEvents)})
			}
			r.dropped++
			r.poke()
			return
		}
	}
	r.seq++
	ev.Seq = r.seq
	r.pending = append(r.pending, ev)
	r.poke()
}

func (r *buildRun) poke() {
	select {
	case r.signal <- struct{}{}:
	default:
	}
}

func upsertStep(steps []model.BuildStepReport, st model.BuildStepReport) []model.BuildStepReport {
	for i := range steps {
		if steps[i].Index == st.Index {
			steps[i] = st
			return steps
		}
	}
	return append(steps, st)
}

// flush stores the pending events and the step report.
func (r *buildRun) flush(ctx context.Context) {
	r.flushing.Lock()
	defer r.flushing.Unlock()
	r.mu.Lock()
	evs := r.pending
	r.pending = nil
	b := r.b
	b.Steps = slices.Clone(r.b.Steps)
	r.mu.Unlock()
	if len(evs) == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx)
	if err := r.s.st.AppendBuildEvents(ctx, b.ID, evs); err != nil {
		r.s.logger().Warn("store build events", "build", b.ID, "err", err)
	}
	if slices.ContainsFunc(evs, func(ev model.BuildEvent) bool { return ev.Type == "step" }) {
		if err := r.s.st.UpdateBuild(ctx, b); err != nil {
			r.s.logger().Warn("store build steps", "build", b.ID, "err", err)
		}
	}
	r.s.builds.wake(b.ID)
}

// finish records how the build ended: ready once the store knows the new
// template under the build's name:tag, failed otherwise.
func (r *buildRun) finish(ctx context.Context, err error) {
	s := r.s
	r.mu.Lock()
	b, digest := r.b, r.digest
	b.Steps = slices.Clone(r.b.Steps)
	r.mu.Unlock()
	if err == nil {
		err = r.awaitTemplate(ctx, digest)
	}
	at := s.now()
	b.FinishedAt = &at
	if err != nil {
		b.State, b.Error = model.BuildFailed, err.Error()
	} else {
		b.State, b.Digest = model.BuildReady, digest
	}
	if uerr := s.st.UpdateBuild(context.WithoutCancel(ctx), b); uerr != nil {
		s.logger().Warn("finish build", "build", b.ID, "err", uerr)
	}
	s.builds.wake(b.ID)
}

// awaitTemplate waits until the store has the build's name:tag at digest
// (the worker reports its catalog at its next sync).
func (r *buildRun) awaitTemplate(ctx context.Context, digest string) error {
	name, tag := r.b.Spec.Name, r.b.Spec.Tag
	if digest == "" {
		return fmt.Errorf("worker %s finished the build without naming the template it made", r.b.Worker)
	}
	ctx, cancel := context.WithTimeout(ctx, buildReportWait)
	defer cancel()
	tick := time.NewTicker(buildPoll / 4)
	defer tick.Stop()
	for {
		t, err := r.s.st.GetTemplate(ctx, name, tag)
		if err == nil && t.Digest == digest {
			return nil
		}
		select {
		case <-ctx.Done():
			got := "nothing"
			if err == nil {
				got = t.Digest
			}
			return fmt.Errorf("worker %s built %s but has not reported it as %s:%s (the store has %s) within %s; is the worker syncing?", r.b.Worker, digest, name, tag, got, buildReportWait)
		case <-tick.C:
		}
	}
}

// TagTemplate points tags of target's name (name:tag) at target's
// content too, and returns its digest. Operators may tag any template;
// others the templates their org built.
func (s *Service) TagTemplate(ctx context.Context, p Principal, target string, tags []string) (string, error) {
	if !strings.Contains(target, ":") || strings.HasPrefix(target, digestPrefix) {
		return "", model.Errorf(model.ErrUnprocessable, "target %.80q is not name:tag", target)
	}
	tpl, _, err := s.resolveTemplate(ctx, target)
	if errors.Is(err, errTemplateNotFound) {
		return "", model.Errorf(model.ErrNotFound, "template %.80q not found", target)
	}
	if err != nil {
		return "", err
	}
	if !p.Operator() {
		owned, err := s.orgBuilt(ctx, p.OrgID, tpl.Digest)
		if err != nil {
			return "", err
		}
		if !owned {
			return "", model.Errorf(model.ErrForbidden, "template %s was not built by org %s; only operators may tag it", target, p.OrgID)
		}
	}
	for _, tag := range tags {
		if !templateTagRe.MatchString(tag) {
			return "", model.Errorf(model.ErrUnprocessable, "template tag %.80q is invalid: use 1 to 128 letters, digits, '.', '_' or '-', not starting with '.' or '-'", tag)
		}
		if err := s.checkBuildName(ctx, p, model.BuildSpec{Name: tpl.Name, Tag: tag}); err != nil {
			return "", err
		}
	}
	for _, tag := range tags {
		t := tpl
		t.Tag, t.CreatedAt = tag, s.now()
		if err := s.st.PutTemplate(ctx, t); err != nil {
			return "", fmt.Errorf("tag %s:%s: %w", tpl.Name, tag, err)
		}
	}
	return tpl.Digest, nil
}
