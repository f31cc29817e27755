package workerapi

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"

	"github.com/airlock/airlock/internal/model"
)

// Template imports on a worker: the server streams an image archive (an
// OCI layout tar or a `docker save` archive) it received on POST
// /v1/templates to the worker, which imports it into its catalog
// (internal/image/oci, the importer `airlock template import` runs) and
// answers the template (201), after starting the Sync that reports it.
//
//	POST /v1/imports/{id}?name=&tag=&ref=   (token: token.ScopeTemplateImport, SandboxID = the import's id)
const (
	RouteTemplateImport = "POST /v1/imports/{sid}"
	// MaxImportBytes bounds one imported archive.
	MaxImportBytes = 16 << 30
)

// TemplateImportPath is the data-plane path of import id.
func TemplateImportPath(id, name, tag, ref string) string {
	q := url.Values{"name": {name}, "tag": {tag}}
	if ref != "" {
		q.Set("ref", ref)
	}
	return "/v1/imports/" + url.PathEscape(id) + "?" + q.Encode()
}

// ImportTemplate streams archive to the worker t names as template
// name:tag (ref picks one image of several) and returns the template it
// made.
func (d *DataPlane) ImportTemplate(ctx context.Context, t Target, id, name, tag, ref string, archive io.Reader) (model.Template, error) {
	res, err := d.do(ctx, d.stream(), t, http.MethodPost, TemplateImportPath(id, name, tag, ref), archive, "application/x-tar")
	if err != nil {
		return model.Template{}, err
	}
	defer res.Body.Close()
	var tm model.Template
	if err := json.NewDecoder(io.LimitReader(res.Body, MaxManifestBytes)).Decode(&tm); err != nil {
		return model.Template{}, model.Errorf(model.ErrUnavailable, "decode the template from worker %s: %v", t.Worker, err)
	}
	return tm, nil
}
