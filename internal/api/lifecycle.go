package api

import (
	"context"
	"net/http"

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
	return writeJSON(w, http.StatusOK, org)
}

func (s *server) updateOrg(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req apitypes.UpdateOrgRequest
	if err := decode(w, r, &req, false); err != nil {
		return err
	}
	org, err := s.svc.UpdateOrg(r.Context(), p, r.PathValue("id"), req)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, org)
}
