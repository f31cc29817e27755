package e2bcompat

// E2B's template build API, mapped onto Airlock's builds (service
// builds.go), so that the SDKs' Template() builder builds Airlock
// templates unmodified (docs/e2b.md "Template builds"):
//
//	POST /v3/templates (/v2/templates)           → a waiting build of name:tag; templateID is the name
//	GET  /templates/{templateID}/files/{hash}    → {present, url}: url is PUT /e2b-upload/{token} here
//	PUT  /e2b-upload/{token}                     → stores the SDK's tar as the org's build file {hash}
//	POST /v2/templates/{templateID}/builds/{buildID} → the steps, translated to a BuildSpec, started
//	GET  /templates/{templateID}/builds/{buildID}/status → status, logEntries from logsOffset, reason
//	GET  /templates/aliases/{alias}              → 200, or 404 when no template has the name
//	GET  /templates/{templateID}/tags, POST /templates/tags → the name's tags; point more tags at one
//
// E2B's file hash is its SDK's own (over the COPY's source, destination
// and file metadata), opaque here: the upload is not checked against it.
// E2B's tar holds the source path as it is in the context directory
// ("src/app.py"), where Airlock's COPY wants paths relative to the
// destination: at the build's start each COPY's tar is rewritten once
// (copyTar) into a build file of its own.

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
)

// uploadTTL is how long an upload URL is good for (the SDKs upload at
// once; big archives take a while).
const uploadTTL = time.Hour

// uploadPath is where the SDKs PUT build files (no API key: the token in
// the path is the credential).
const uploadPath = "/e2b-upload/"

// e2bBaseImages are the images E2B's SDKs name for fromBaseImage() (and a
// Dockerfile without FROM): Airlock's base template.
var e2bBaseImages = map[string]bool{"e2bdev/base": true, "e2bdev/base:latest": true, "docker.io/e2bdev/base": true, "docker.io/e2bdev/base:latest": true}

type templateRequest struct {
	Name     string   `json:"name"`
	Alias    string   `json:"alias"`
	Tags     []string `json:"tags"`
	CPUCount int      `json:"cpuCount"`
	MemoryMB int      `json:"memoryMB"`
}

type templateRequestResponse struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Public     bool     `json:"public"`
	Aliases    []string `json:"aliases"`
	Names      []string `json:"names"`
	Tags       []string `json:"tags"`
}

// requestTemplate is POST /v3/templates and /v2/templates: a build id for
// name[:tag] (the first of tags when name has none; else latest).
func (s *server) requestTemplate(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req templateRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	name := req.Name
	if name == "" {
		name = req.Alias
	}
	if name == "" {
		return badRequest("name is required: the template's name, optionally name:tag")
	}
	name, tag, _ := strings.Cut(name, ":")
	if tag == "" && len(req.Tags) > 0 {
		tag = req.Tags[0]
	}
	b, err := s.svc.CreateWaitingBuild(r.Context(), p, name, tag)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, templateRequestResponse{
		TemplateID: b.Spec.Name, BuildID: b.ID, Aliases: []string{b.Spec.Name}, Names: []string{b.Spec.Name + ":" + b.Spec.Tag}, Tags: []string{b.Spec.Tag},
	})
	return nil
}

// templateGet is GET /templates/{a}/{b}: aliases/{alias}, or
// {templateID}/tags. (One pattern: /templates/aliases/tags would match
// two.)
func (s *server) templateGet(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	a, b := r.PathValue("a"), r.PathValue("b")
	if a == "aliases" {
		return s.alias(w, r, p, b)
	}
	if b == "tags" {
		return s.templateTags(w, r, p, a)
	}
	return model.Errorf(model.ErrNotFound, "no such endpoint: %s %s (Airlock's E2B-compatible API)", r.Method, r.URL.Path)
}

func (s *server) alias(w http.ResponseWriter, r *http.Request, p service.Principal, alias string) error {
	ts, err := s.svc.GetTemplate(r.Context(), p, alias)
	if errors.Is(err, model.ErrNotFound) || errors.Is(err, model.ErrUnprocessable) {
		return model.Errorf(model.ErrNotFound, "template %.80q not found", alias)
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"templateID": ts.Name, "public": false})
	return nil
}

type templateTag struct {
	Tag       string    `json:"tag"`
	BuildID   string    `json:"buildID"`
	CreatedAt time.Time `json:"createdAt"`
}

func (s *server) templateTags(w http.ResponseWriter, r *http.Request, p service.Principal, name string) error {
	tpls, err := s.svc.ListTemplates(r.Context(), p)
	if err != nil {
		return err
	}
	builds, err := s.svc.ListBuilds(r.Context(), p, service.MaxListLimit)
	if err != nil {
		return err
	}
	out := []templateTag{}
	for _, t := range tpls {
		if t.Name == name {
			out = append(out, templateTag{Tag: t.Tag, BuildID: buildOf(builds, t.Digest), CreatedAt: t.CreatedAt})
		}
	}
	if len(out) == 0 {
		return model.Errorf(model.ErrNotFound, "template %.80q not found", name)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// buildOf returns the newest ready build that made digest ("" if none).
func buildOf(builds []model.Build, digest string) string {
	for _, b := range builds {
		if b.State == model.BuildReady && b.Digest == digest {
			return b.ID
		}
	}
	return ""
}

// assignTags is POST /templates/tags {target: "name:tag", tags}: each tag
// of the target's name points at the target's content too.
func (s *server) assignTags(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req struct {
		Target string   `json:"target"`
		Tags   []string `json:"tags"`
	}
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Target == "" || len(req.Tags) == 0 {
		return badRequest("target (name:tag) and tags are required")
	}
	digest, err := s.svc.TagTemplate(r.Context(), p, req.Target, req.Tags)
	if err != nil {
		return err
	}
	builds, err := s.svc.ListBuilds(r.Context(), p, service.MaxListLimit)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, map[string]any{"tags": req.Tags, "buildID": buildOf(builds, digest)})
	return nil
}

// fileUpload is GET /templates/{templateID}/files/{hash}.
func (s *server) fileUpload(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	hash := r.PathValue("hash")
	if err := service.ValidBuildFileKey(hash); err != nil {
		return err
	}
	present, err := s.svc.HasBuildFile(r.Context(), p.OrgID, hash)
	if err != nil {
		return err
	}
	tok, err := s.svc.SignBuildFileUpload(r.Context(), p.OrgID, hash, uploadTTL)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, map[string]any{"present": present, "url": baseURL(r) + uploadPath + tok})
	return nil
}

// baseURL is the URL the client reached this server at.
func baseURL(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if fp := r.Header.Get("X-Forwarded-Proto"); fp == "https" || fp == "http" {
		scheme = fp
	}
	return scheme + "://" + r.Host
}

// upload is PUT /e2b-upload/{token}: the SDK's tar of one COPY's files.
func (s *server) upload(w http.ResponseWriter, r *http.Request) {
	org, key, err := s.svc.VerifyBuildFileUpload(r.Context(), r.PathValue("token"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if r.ContentLength > model.MaxBuildFileBytes {
		s.writeError(w, r, model.Errorf(model.ErrTooLarge, "the archive is %d bytes; at most %d MiB are allowed", r.ContentLength, model.MaxBuildFileBytes>>20))
		return
	}
	if _, _, err := s.svc.PutBuildFile(r.Context(), org, key, r.Body, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// templateBuildStart is E2B's TemplateBuildStartV2.
type templateBuildStart struct {
	FromImage         string         `json:"fromImage"`
	FromTemplate      string         `json:"fromTemplate"`
	FromImageRegistry map[string]any `json:"fromImageRegistry"`
	Force             bool           `json:"force"`
	Steps             []templateStep `json:"steps"`
	StartCmd          string         `json:"startCmd"`
	ReadyCmd          string         `json:"readyCmd"`
}

type templateStep struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash"`
	Force     bool     `json:"force"`
}

// startTemplateBuild is POST /v2/templates/{templateID}/builds/{buildID}.
func (s *server) startTemplateBuild(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	ctx := r.Context()
	b, err := s.e2bBuild(ctx, p, r.PathValue("templateID"), r.PathValue("buildID"))
	if err != nil {
		return err
	}
	var req templateBuildStart
	if err := decode(r, &req); err != nil {
		return err
	}
	spec, err := s.translate(ctx, p, req)
	if err != nil {
		return err
	}
	if _, err := s.svc.StartWaitingBuild(ctx, p, b.ID, spec); err != nil {
		return err
	}
	w.WriteHeader(http.StatusAccepted)
	return nil
}

// e2bBuild returns p's build id of template templateID (its name).
func (s *server) e2bBuild(ctx context.Context, p service.Principal, templateID, id string) (model.Build, error) {
	b, err := s.svc.GetBuild(ctx, p, id)
	if err != nil {
		return model.Build{}, err
	}
	if b.Spec.Name != templateID {
		return model.Build{}, model.Errorf(model.ErrNotFound, "template %.80q has no build %.80q", templateID, id)
	}
	return b, nil
}

// fromOf maps E2B's base to an Airlock template reference.
func (s *server) fromOf(ctx context.Context, p service.Principal, req templateBuildStart) (string, error) {
	switch {
	case req.FromTemplate != "" && req.FromImage != "":
		return "", badRequest("set fromTemplate or fromImage, not both")
	case req.FromTemplate != "":
		return req.FromTemplate, nil
	case req.FromImage == "":
		return service.BaseTemplate, nil
	case e2bBaseImages[req.FromImage]:
		return service.BaseTemplate, nil
	}
	// Another image: the template `airlock template pull` makes of it
	// (the reference's last path component and tag).
	ref := req.FromImage
	if i := strings.Index(ref, "@"); i >= 0 {
		return "", model.Errorf(model.ErrUnprocessable, "image %.200q is named by digest; pull it with `airlock template pull %s --name NAME:TAG` and build fromTemplate('NAME:TAG')", ref, ref)
	}
	name := ref[strings.LastIndex(ref, "/")+1:]
	if !strings.Contains(name, ":") {
		name += ":latest"
	}
	if _, err := s.svc.GetTemplate(ctx, p, name); err != nil {
		if errors.Is(err, model.ErrNotFound) || errors.Is(err, model.ErrUnprocessable) {
			return "", model.Errorf(model.ErrUnprocessable, "Airlock builds from templates, and there is no template %s for image %.200q: pull it first with `airlock template pull %s` (or import it with `airlock template import`), then build again", name, ref, ref)
		}
		return "", err
	}
	return name, nil
}

// translate turns E2B's steps into a BuildSpec. RUN with a user becomes
// USER, RUN, USER back; COPY's owner defaults to the current user, as in
// E2B; each COPY's tar is rewritten relative to its destination.
func (s *server) translate(ctx context.Context, p service.Principal, req templateBuildStart) (model.BuildSpec, error) {
	from, err := s.fromOf(ctx, p, req)
	if err != nil {
		return model.BuildSpec{}, err
	}
	spec := model.BuildSpec{From: from, StartCmd: req.StartCmd, ReadyCmd: req.ReadyCmd, Force: req.Force}
	user := "user" // a template without config (base) runs as the agent's user
	if ts, err := s.svc.GetTemplate(ctx, p, from); err == nil && ts.Config != nil {
		user = ts.Config.User
		if user == "" {
			user = "root"
		}
	}
	for i, st := range req.Steps {
		what := fmt.Sprintf("step %d (%s)", i+1, st.Type)
		args := st.Args
		switch strings.ToUpper(st.Type) {
		case "RUN":
			if len(args) == 0 || args[0] == "" {
				return model.BuildSpec{}, badRequest("%s has no command", what)
			}
			run := model.BuildStep{Kind: model.StepRun, Args: []string{args[0]}, Force: st.Force, Text: "RUN " + args[0]}
			if len(args) > 1 && args[1] != "" && args[1] != user {
				spec.Steps = append(spec.Steps,
					model.BuildStep{Kind: model.StepUser, Args: []string{args[1]}, Force: st.Force, Text: "USER " + args[1]},
					run,
					model.BuildStep{Kind: model.StepUser, Args: []string{user}, Force: st.Force, Text: "USER " + user})
				continue
			}
			spec.Steps = append(spec.Steps, run)
		case "COPY":
			if len(args) < 2 {
				return model.BuildSpec{}, badRequest("%s needs a source and a destination", what)
			}
			if st.FilesHash == "" {
				return model.BuildSpec{}, badRequest("%s has no filesHash", what)
			}
			key, single, err := s.copyTar(ctx, p.OrgID, st.FilesHash, args[0])
			if err != nil {
				return model.BuildSpec{}, fmt.Errorf("%s: %w", what, err)
			}
			owner := user
			if len(args) > 2 && args[2] != "" {
				owner = args[2]
			}
			cp := model.BuildStep{Kind: model.StepCopy, Args: []string{args[1]}, FilesHash: key, Chown: owner, Force: st.Force,
				ToFile: single && !strings.HasSuffix(args[1], "/"), Text: "COPY " + args[0] + " " + args[1]}
			if len(args) > 3 && args[3] != "" {
				cp.Chmod = args[3]
			}
			spec.Steps = append(spec.Steps, cp)
		case "ENV":
			spec.Steps = append(spec.Steps, model.BuildStep{Kind: model.StepEnv, Args: args, Force: st.Force, Text: "ENV " + strings.Join(args, " ")})
		case "WORKDIR":
			spec.Steps = append(spec.Steps, model.BuildStep{Kind: model.StepWorkdir, Args: args, Force: st.Force, Text: "WORKDIR " + strings.Join(args, " ")})
		case "USER":
			if len(args) == 1 {
				user = args[0]
			}
			spec.Steps = append(spec.Steps, model.BuildStep{Kind: model.StepUser, Args: args, Force: st.Force, Text: "USER " + strings.Join(args, " ")})
		default:
			return model.BuildSpec{}, model.Errorf(model.ErrUnprocessable, "%s: Airlock builds RUN, COPY, ENV, WORKDIR and USER steps, not %.40q", what, st.Type)
		}
	}
	return spec, nil
}

// copyTar rewrites the SDK's tar of one COPY (uploaded as hash; paths as
// in the context directory) into a build file whose paths are relative to
// the destination, as Docker's COPY places them: a file by its base
// name, a directory's contents under it; and returns its key and whether
// src is one file (the destination then names the file, unless it ends
// in "/": model.BuildStep.ToFile). The key follows from hash and src, so
// a build started again reuses it.
func (s *server) copyTar(ctx context.Context, orgID, hash, src string) (string, bool, error) {
	sum := sha256.Sum256([]byte(hash + "\x00" + src))
	key := "e2b-" + hex.EncodeToString(sum[:20])
	f, err := s.svc.OpenBuildFile(ctx, orgID, hash)
	if errors.Is(err, model.ErrNotFound) {
		return "", false, model.Errorf(model.ErrUnprocessable, "the files of %s (hash %s) were not uploaded; upload them first", src, hash)
	}
	if err != nil {
		return "", false, err
	}
	in, err := f.Open()
	if err != nil {
		return "", false, err
	}
	defer in.Close()
	if ok, err := s.svc.HasBuildFile(ctx, orgID, key); err != nil {
		return "", false, err
	} else if ok {
		single, err := rewriteCopyTar(in, io.Discard, src)
		return key, single, err
	}
	pr, pw := io.Pipe()
	var single bool
	go func() {
		var err error
		single, err = rewriteCopyTar(in, pw, src)
		pw.CloseWithError(err)
	}()
	_, _, err = s.svc.PutBuildFile(ctx, orgID, key, pr, false)
	pr.Close()
	if err != nil {
		return "", false, fmt.Errorf("rewrite the files of %s: %w", src, err)
	}
	return key, single, nil
}

// rewriteCopyTar copies the entries of the tar (gzip'ed or not) r under
// src to w, gzip'ed, renamed relative to the COPY's destination, and
// reports whether src is one regular file.
func rewriteCopyTar(r io.Reader, w io.Writer, src string) (bool, error) {
	br, err := maybeGunzip(r)
	if err != nil {
		return false, err
	}
	src = strings.TrimSuffix(path.Clean(strings.TrimPrefix(src, "./")), "/")
	zw, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
	tw := tar.NewWriter(zw)
	tr := tar.NewReader(br)
	n, single := 0, false
	for {
		hd, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return false, fmt.Errorf("read the uploaded tar: %w", err)
		}
		clean := path.Clean(strings.TrimPrefix(hd.Name, "./"))
		name, ok := copyName(clean, src, hd.Typeflag == tar.TypeDir)
		if !ok {
			continue
		}
		single = n == 0 && clean == src && (hd.Typeflag == tar.TypeReg || hd.Typeflag == tar.TypeSymlink)
		hd.Name = name
		if hd.Typeflag == tar.TypeDir {
			hd.Name += "/"
		}
		if hd.Typeflag == tar.TypeLink {
			ln, ok := copyName(path.Clean(strings.TrimPrefix(hd.Linkname, "./")), src, false)
			if !ok {
				continue
			}
			hd.Linkname = ln
		}
		if err := tw.WriteHeader(hd); err != nil {
			return false, err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return false, err
		}
		n++
	}
	if n == 0 {
		return false, model.Errorf(model.ErrUnprocessable, "the uploaded files hold nothing under %q", src)
	}
	if err := tw.Close(); err != nil {
		return false, err
	}
	return single && n == 1, zw.Close()
}

// copyName places name (a path in the context) for a COPY of src: the
// file src itself by its base name, what is under a directory src (or
// under a directory a glob src matches) relative to it, a file a glob
// matches by its base name. Entries outside src (its parents) are left
// out, and so is a directory src (or one a glob matches) itself: its
// contents go to the destination, not the directory.
func copyName(name, src string, dir bool) (string, bool) {
	if name == src {
		return path.Base(name), !dir
	}
	if rest, ok := strings.CutPrefix(name, src+"/"); ok {
		return rest, true
	}
	if src == "." {
		return name, name != "." && name != ".."
	}
	parts := strings.Split(name, "/")
	for i := 1; i <= len(parts); i++ {
		prefix := strings.Join(parts[:i], "/")
		if ok, _ := path.Match(src, prefix); ok {
			if i == len(parts) {
				return path.Base(name), !dir
			}
			return strings.Join(parts[i:], "/"), true
		}
	}
	return "", false
}

func maybeGunzip(r io.Reader) (io.Reader, error) {
	pr := &peeked{r: r}
	head := make([]byte, 2)
	n, _ := io.ReadFull(r, head)
	pr.head = head[:n]
	if n == 2 && head[0] == 0x1f && head[1] == 0x8b {
		return gzip.NewReader(pr)
	}
	return pr, nil
}

type peeked struct {
	r    io.Reader
	head []byte
}

func (p *peeked) Read(b []byte) (int, error) {
	if len(p.head) > 0 {
		n := copy(b, p.head)
		p.head = p.head[n:]
		return n, nil
	}
	return p.r.Read(b)
}

type buildLogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Message   string    `json:"message"`
	Level     string    `json:"level"`
	Step      string    `json:"step,omitempty"`
}

type buildStatusReason struct {
	Message    string          `json:"message"`
	Step       string          `json:"step,omitempty"`
	LogEntries []buildLogEntry `json:"logEntries"`
}

type templateBuildInfo struct {
	TemplateID string             `json:"templateID"`
	BuildID    string             `json:"buildID"`
	Status     string             `json:"status"`
	Logs       []string           `json:"logs"`
	LogEntries []buildLogEntry    `json:"logEntries"`
	Reason     *buildStatusReason `json:"reason,omitempty"`
}

// maxStatusLogs is how many log entries one status answer carries (as
// E2B's: the SDKs poll until an answer has none).
const maxStatusLogs = 100

// buildStatus is GET /templates/{templateID}/builds/{buildID}/status.
func (s *server) buildStatus(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	ctx := r.Context()
	b, err := s.e2bBuild(ctx, p, r.PathValue("templateID"), r.PathValue("buildID"))
	if err != nil {
		return err
	}
	q := r.URL.Query()
	offset, limit := 0, maxStatusLogs
	if v := q.Get("logsOffset"); v != "" {
		if offset, err = strconv.Atoi(v); err != nil || offset < 0 {
			return badRequest("logsOffset %q is not a non-negative integer", v)
		}
	}
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 0 {
			return badRequest("limit %q is not a non-negative integer", v)
		}
		limit = min(limit, maxStatusLogs)
	}
	evs, b, err := s.svc.BuildEvents(ctx, p, b.ID, offset, 0)
	if err != nil {
		return err
	}
	// The status is read with the events: a build that ended after them
	// still has events to give, so it answers building until they are out.
	info := templateBuildInfo{TemplateID: b.Spec.Name, BuildID: b.ID, Logs: []string{}, LogEntries: []buildLogEntry{}}
	n := len(b.Spec.Steps)
	for _, ev := range evs {
		if len(info.LogEntries) >= limit {
			break
		}
		// No level filter: the SDKs count logsOffset over what they get.
		e := logEntry(ev, n)
		info.LogEntries = append(info.LogEntries, e)
		info.Logs = append(info.Logs, e.Timestamp.Format(time.RFC3339)+" "+e.Message)
	}
	switch b.State {
	case model.BuildWaiting:
		info.Status = "waiting"
	case model.BuildBuilding:
		info.Status = "building"
	case model.BuildReady:
		info.Status = "ready"
	case model.BuildFailed:
		info.Status = "error"
		reason := &buildStatusReason{Message: b.Error, LogEntries: []buildLogEntry{}}
		if len(b.Steps) > 0 {
			last := b.Steps[len(b.Steps)-1]
			reason.Step = stepName(last.Index, n)
		}
		info.Reason = reason
	}
	writeJSON(w, http.StatusOK, info)
	return nil
}

// stepName is E2B's name of step index i (of n): "base" for FROM, else
// its number from 1 (the SDKs index their stack traces by it).
func stepName(i, n int) string {
	if i < 0 {
		return "base"
	}
	if i >= n {
		return "finalize"
	}
	return strconv.Itoa(i + 1)
}

func logEntry(ev model.BuildEvent, n int) buildLogEntry {
	e := buildLogEntry{Timestamp: ev.Time, Level: "info", Message: ev.Text}
	switch ev.Type {
	case "step":
		if ev.Step != nil {
			e.Step = stepName(ev.Step.Index, n)
			e.Message = ev.Step.Text
			if ev.Step.Cached {
				e.Message += " (cached)"
			}
			if e.Message == "" {
				e.Message = "step " + e.Step
			}
		}
	case "done":
		e.Message = "Build finished: " + ev.Digest
	case "error":
		e.Level = "error"
	}
	return e
}
