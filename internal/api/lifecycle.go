package api

import (
	"context"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"strconv"

	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
)

// lifecycle serves POST /v1/sandboxes/{id}/pause|resume|suspend|wake: an
// empty body (or {}), 202 {operation}.
func (s *server) lifecycle(w http.ResponseWriter, r *http.Request, p service.Principal,
	call func(context.Context, service.Principal, string) (model.Operation, error)) error {
	var req struct{}
	if err := decode(w, r, &req, true); err != nil {
		return err
	}
	op, err := call(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/operations/"+op.ID)
	return writeJSON(w, http.StatusAccepted, apitypes.OperationResponse{Operation: op})
}

func (s *server) pauseSandbox(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	return s.lifecycle(w, r, p, s.svc.PauseSandbox)
}

func (s *server) resumeSandbox(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	return s.lifecycle(w, r, p, s.svc.ResumeSandbox)
}

func (s *server) suspendSandbox(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	return s.lifecycle(w, r, p, s.svc.SuspendSandbox)
}

func (s *server) wakeSandbox(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	return s.lifecycle(w, r, p, s.svc.WakeSandbox)
}

func (s *server) getOrg(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	org, err := s.svc.GetOrg(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	usage, err := s.svc.OrgUsage(r.Context(), org.ID)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, apitypes.Org{Org: org, Usage: apitypes.OrgUsage(usage)})
}

func (s *server) updateOrg(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req apitypes.UpdateOrgRequest
	if err := decode(w, r, &req, false); err != nil {
		return err
	}
	org, err := s.svc.UpdateOrg(r.Context(), p, r.PathValue("id"), orgUpdate(req))
	if err != nil {
		return err
	}
	usage, err := s.svc.OrgUsage(r.Context(), org.ID)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, apitypes.Org{Org: org, Usage: apitypes.OrgUsage(usage)})
}

// createCheckpoint serves POST /v1/sandboxes/{id}/checkpoints {name}: 202
// {operation}.
func (s *server) createCheckpoint(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req apitypes.CreateCheckpointRequest
	if err := decode(w, r, &req, false); err != nil {
		return err
	}
	op, err := s.svc.CreateCheckpoint(r.Context(), p, r.PathValue("id"), req.Name)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/operations/"+op.ID)
	return writeJSON(w, http.StatusAccepted, apitypes.OperationResponse{Operation: op})
}

func (s *server) listCheckpoints(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	cps, err := s.svc.ListCheckpoints(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, apitypes.ListCheckpointsResponse{Checkpoints: cps})
}

// rollbackSandbox serves POST /v1/sandboxes/{id}/rollback {checkpoint}: 202
// {operation}.
func (s *server) rollbackSandbox(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req apitypes.RollbackRequest
	if err := decode(w, r, &req, false); err != nil {
		return err
	}
	op, err := s.svc.RollbackSandbox(r.Context(), p, r.PathValue("id"), req.Checkpoint)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/operations/"+op.ID)
	return writeJSON(w, http.StatusAccepted, apitypes.OperationResponse{Operation: op})
}

// deleteCheckpoint serves DELETE /v1/sandboxes/{id}/checkpoints/{name}: 204.
func (s *server) deleteCheckpoint(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	if err := s.svc.DeleteCheckpoint(r.Context(), p, r.PathValue("id"), r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// exportCheckpoint serves GET /v1/sandboxes/{id}/checkpoints/{name}/export:
// the checkpoint's portable archive (application/x-tar), streamed from the
// sandbox's worker. A failure after the first byte can only cut the stream
// short; the archive's manifest lets the importer detect that.
func (s *server) exportCheckpoint(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	ex, err := s.svc.ExportCheckpoint(r.Context(), p, r.PathValue("id"), r.PathValue("name"))
	if err != nil {
		return err
	}
	defer ex.Body.Close()
	h := w.Header()
	h.Set("Content-Type", "application/x-tar")
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": ex.Filename}))
	if ex.Size >= 0 {
		h.Set("Content-Length", strconv.FormatInt(ex.Size, 10))
	}
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, ex.Body); err != nil {
		s.log.Warn("export cut short", "sandbox", r.PathValue("id"), "checkpoint", r.PathValue("name"), "err", err)
	}
	return nil
}

// importSandbox serves POST /v1/sandboxes as multipart/form-data: the part
// "request" (a CreateSandboxRequest naming the archive part in "import"),
// then that part with a checkpoint archive, streamed to a worker.
func (s *server) importSandbox(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	mr, err := r.MultipartReader()
	if err != nil {
		return badRequest("multipart request: %v", err)
	}
	part, err := mr.NextPart()
	if err != nil {
		return badRequest("multipart request: read the first part: %v", err)
	}
	if part.FormName() != "request" {
		return badRequest("the first part of a multipart create is %q; it must be \"request\" (the JSON create request with \"import\")", part.FormName())
	}
	var req apitypes.CreateSandboxRequest
	dec := json.NewDecoder(io.LimitReader(part, MaxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return badRequest("the \"request\" part is not a valid create request: %v", err)
	}
	if req.Import == "" {
		return model.Errorf(model.ErrUnprocessable, "a multipart create imports an archive: set \"import\" in the request part to the name of the part holding it")
	}
	archive, err := mr.NextPart()
	if err != nil {
		return badRequest("multipart request: no part %q after \"request\": %v", req.Import, err)
	}
	if archive.FormName() != req.Import {
		return badRequest("the part after \"request\" is %q; \"import\" names %q", archive.FormName(), req.Import)
	}
	sb, op, err := s.svc.ImportSandbox(r.Context(), p, createParams(req), archive, r.Header.Get("Idempotency-Key"))
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/operations/"+op.ID)
	return writeJSON(w, http.StatusAccepted, apitypes.CreateSandboxResponse{Sandbox: sb, Operation: op})
}
