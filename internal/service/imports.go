package service

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/scheduler"
	"github.com/airlock/airlock/internal/store"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

// Template imports over the API (POST /v1/templates): the archive streams
// through this server to one worker, which imports it into its catalog
// (what `airlock template import` does on the worker's own machine); the
// call answers once the store lists the template, so a create right after
// works. Operators only: templates are installation-wide.

// TemplateImporter is the data plane's import call.
type TemplateImporter interface {
	ImportTemplate(ctx context.Context, t workerapi.Target, id, name, tag, ref string, archive io.Reader) (model.Template, error)
}

// importReportWait bounds the wait for the worker to report an import.
const importReportWait = 2 * time.Minute

// ImportTemplate imports the image archive (an OCI layout tar or a docker
// save archive) as name:tag on a live worker.
func (s *Service) ImportTemplate(ctx context.Context, p Principal, name, tag, ref string, archive io.Reader) (model.Template, error) {
	if err := s.requireOperator(p, "importing templates"); err != nil {
		return model.Template{}, err
	}
	if tag == "" {
		tag = defaultTemplateTag
	}
	if !templateNameRe.MatchString(name) {
		return model.Template{}, model.Errorf(model.ErrUnprocessable, "template name %.80q is invalid: use 1 to 63 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	if !templateTagRe.MatchString(tag) {
		return model.Template{}, model.Errorf(model.ErrUnprocessable, "template tag %.80q is invalid: use 1 to 128 letters, digits, '.', '_' or '-', not starting with '.' or '-'", tag)
	}
	if name == BaseTemplate {
		return model.Template{}, model.Errorf(model.ErrConflict, "template %s is the built-in base template; import under another name", BaseTemplate)
	}
	// The archive's first header, before a worker is chosen: what is not
	// a tar is the caller's to fix (422), whatever the workers' state.
	br := bufio.NewReaderSize(archive, 4096)
	head, _ := br.Peek(512)
	if len(head) >= 2 && head[0] == 0x1f && head[1] == 0x8b {
		return model.Template{}, model.Errorf(model.ErrUnprocessable, "the image archive is gzip-compressed; send the uncompressed tar (gunzip it first)")
	}
	if _, err := tar.NewReader(bytes.NewReader(head)).Next(); err != nil {
		return model.Template{}, model.Errorf(model.ErrUnprocessable, "the body is not a tar archive (%v): send an OCI image layout tar or a docker save archive", err)
	}
	archive = br
	imp, ok := s.dataPlane().(TemplateImporter)
	if !ok {
		return model.Template{}, model.Errorf(model.ErrUnavailable, "this server cannot send imports to workers")
	}
	workers, err := s.st.ListWorkers(ctx)
	if err != nil {
		return model.Template{}, fmt.Errorf("list workers: %w", err)
	}
	sbs, err := store.ListAllSandboxes(ctx, s.st, store.SandboxFilter{})
	if err != nil {
		return model.Template{}, fmt.Errorf("list sandboxes: %w", err)
	}
	// Any live worker with room; the template stays on that worker (as an
	// import on its machine would).
	wid, err := s.placer().Place(scheduler.Cluster{Workers: workers, Load: scheduler.LoadOf(sbs), Now: s.now()},
		scheduler.Request{Runtime: s.runtime(), Resources: model.Resources{VCPUs: DefaultVCPUs, MemoryMiB: DefaultMemoryMiB}})
	if err != nil {
		return model.Template{}, model.Errorf(model.ErrUnavailable, "no worker can take the import: %v", err)
	}
	var w model.Worker
	for _, x := range workers {
		if x.ID == wid {
			w = x
		}
	}
	id := model.NewID("imp")
	t, err := s.target(ctx, w, model.Sandbox{ID: id, OrgID: p.OrgID}, token.Claims{Scope: token.ScopeTemplateImport})
	if err != nil {
		return model.Template{}, err
	}
	// The token is checked when the worker reads the request's head; the
	// body may take longer than the token's minute.
	tm, err := imp.ImportTemplate(ctx, t, id, name, tag, ref, archive)
	if err != nil {
		return model.Template{}, workerError(err, w.ID, "importing")
	}
	wctx, cancel := context.WithTimeout(ctx, importReportWait)
	defer cancel()
	for {
		got, err := s.st.GetTemplate(wctx, tm.Name, tm.Tag)
		if err == nil && got.Digest == tm.Digest {
			return got, nil
		}
		select {
		case <-wctx.Done():
			return tm, model.Errorf(model.ErrUnavailable, "worker %s imported %s but has not reported it as %s:%s within %s", w.ID, tm.Digest, tm.Name, tm.Tag, importReportWait)
		case <-time.After(250 * time.Millisecond):
		}
	}
}
