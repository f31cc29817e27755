package api

import (
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
)

func (s *server) createSandbox(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt == "multipart/form-data" {
		return s.importSandbox(w, r, p)
	}
	var req apitypes.CreateSandboxRequest
	if err := decode(w, r, &req, true); err != nil {
		return err
	}
	if req.FromCheckpoint != nil {
		forks, err := s.svc.ForkSandboxes(r.Context(), p, createParams(req), r.Header.Get("Idempotency-Key"))
		if err != nil {
			return err
		}
		w.Header().Set("Location", "/v1/operations/"+forks[0].Operation.ID)
		return writeJSON(w, http.StatusAccepted, forksResponse(forks))
	}
	if req.Import != "" {
		return model.Errorf(model.ErrUnprocessable, "import needs a multipart/form-data request: a first part \"request\" with this JSON, then the part %q with the archive", req.Import)
	}
	if req.Count != 0 {
		return model.Errorf(model.ErrUnprocessable, "count applies to forks; set from_checkpoint too")
	}
	sb, op, err := s.svc.CreateSandbox(r.Context(), p, createParams(req), r.Header.Get("Idempotency-Key"))
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/operations/"+op.ID)
	return writeJSON(w, http.StatusAccepted, apitypes.CreateSandboxResponse{Sandbox: sb, Operation: op})
}

func (s *server) listSandboxes(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	q := r.URL.Query()
	f := service.ListParams{Cursor: q.Get("cursor")}
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			if st != "" {
				f.States = append(f.States, model.SandboxState(st))
			}
		}
	}
	for _, kv := range q["metadata"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return badRequest("metadata filter %q is not key=value", kv)
		}
		if f.Metadata == nil {
			f.Metadata = map[string]string{}
		}
		f.Metadata[k] = v
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil {
			return badRequest("limit %q is not a number", l)
		}
		f.Limit = n
	}
	sbs, next, err := s.svc.ListSandboxes(r.Context(), p, f)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, apitypes.ListSandboxesResponse{Sandboxes: sbs, NextCursor: next})
}

func (s *server) getSandbox(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	sb, err := s.svc.GetSandbox(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	tok, err := s.svc.SandboxTrafficToken(r.Context(), p, sb)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, apitypes.SandboxResponse{Sandbox: sb, TrafficToken: tok})
}

func (s *server) deleteSandbox(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	op, err := s.svc.DeleteSandbox(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/operations/"+op.ID)
	return writeJSON(w, http.StatusAccepted, apitypes.OperationResponse{Operation: op})
}

func (s *server) getOperation(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	id := r.PathValue("id")
	var (
		op  model.Operation
		err error
	)
	if v := r.URL.Query().Get("wait"); v != "" {
		d, perr := parseWait(v)
		if perr != nil {
			return perr
		}
		// The long poll may outlive a server-wide write timeout.
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d + 30*time.Second))
		op, err = s.svc.WaitOperation(r.Context(), p, id, d)
	} else {
		op, err = s.svc.GetOperation(r.Context(), p, id)
	}
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, op)
}

// parseWait accepts a Go duration ("30s") or a number of seconds ("30").
func parseWait(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		n, nerr := strconv.Atoi(v)
		if nerr != nil {
			return 0, badRequest("wait %q is not a duration like 30s", v)
		}
		d = time.Duration(n) * time.Second
	}
	if d < 0 {
		return 0, badRequest("wait %q is negative", v)
	}
	return min(d, service.MaxWait), nil
}

func (s *server) createCommand(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req apitypes.CreateCommandRequest
	if err := decode(w, r, &req, false); err != nil {
		return err
	}
	cs, err := s.svc.CreateCommand(r.Context(), p, r.PathValue("id"), service.CommandParams(req))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, apitypes.CommandSession(cs))
}

func (s *server) listCommands(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	q := r.URL.Query()
	limit := 0
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil {
			return badRequest("limit %q is not a number", l)
		}
		limit = n
	}
	cmds, next, err := s.svc.ListCommands(r.Context(), p, r.PathValue("id"), limit, q.Get("cursor"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, apitypes.ListCommandsResponse{Commands: cmds, NextCursor: next})
}

func (s *server) filesSession(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req struct{}
	if err := decode(w, r, &req, true); err != nil {
		return err
	}
	fs, err := s.svc.FilesSession(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, apitypes.FilesSession(fs))
}

func (s *server) listTemplates(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	ts, err := s.svc.ListTemplates(r.Context(), p)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, apitypes.ListTemplatesResponse{Templates: ts})
}

func (s *server) getTemplate(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	t, err := s.svc.GetTemplate(r.Context(), p, r.PathValue("ref"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, apitypes.Template(t))
}

func (s *server) deleteTemplate(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	t, err := s.svc.DeleteTemplate(r.Context(), p, r.PathValue("ref"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusAccepted, apitypes.Template(t))
}

func (s *server) createOrg(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req apitypes.CreateOrgRequest
	if err := decode(w, r, &req, false); err != nil {
		return err
	}
	org, err := s.svc.CreateOrg(r.Context(), p, req.Name)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, org)
}

func (s *server) listOrgs(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	orgs, err := s.svc.ListOrgs(r.Context(), p)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, apitypes.ListOrgsResponse{Orgs: orgs})
}

func (s *server) createKey(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req apitypes.CreateKeyRequest
	if err := decode(w, r, &req, true); err != nil {
		return err
	}
	key, secret, err := s.svc.CreateKeyWith(r.Context(), p, r.PathValue("id"), service.KeyOptions{Name: req.Name, Admin: req.Admin, E2B: req.E2B, ExpiresAt: req.ExpiresAt})
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, apitypes.CreateKeyResponse{Key: key, Secret: secret})
}

func (s *server) listKeys(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	keys, err := s.svc.ListKeys(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, apitypes.ListKeysResponse{Keys: keys})
}

func (s *server) revokeKey(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	key, err := s.svc.RevokeKey(r.Context(), p, r.PathValue("id"), r.PathValue("key"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, key)
}
