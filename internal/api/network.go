package api

import (
	"net/http"

	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
)

// Egress endpoints (docs/network.md).

// getSandboxNetwork serves GET /v1/sandboxes/{id}/network: the sandbox's
// policy and the profile it came from (null for records older than egress
// policies: the worker's default applies).
func (s *server) getSandboxNetwork(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	sb, err := s.svc.GetSandbox(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sandboxNetwork(sb))
}

func sandboxNetwork(sb model.Sandbox) *model.SandboxNetwork { return sb.Network }

// setSandboxNetwork serves PUT /v1/sandboxes/{id}/network {profile|policy}:
// 200 with the sandbox's new network. New connections follow it within a
// second; open ones it denies are cut.
func (s *server) setSandboxNetwork(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req apitypes.NetworkRequest
	if err := decode(w, r, &req, false); err != nil {
		return err
	}
	sb, err := s.svc.SetSandboxNetwork(r.Context(), p, r.PathValue("id"), service.NetworkParams{Profile: req.Profile, Policy: req.Policy})
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sandboxNetwork(sb))
}

func (s *server) listNetworkProfiles(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	ps, err := s.svc.ListNetworkProfiles(r.Context(), p)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, apitypes.NetworkProfilesResponse{Profiles: ps})
}

func (s *server) getNetworkProfile(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	prof, err := s.svc.GetNetworkProfile(r.Context(), p, r.PathValue("name"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, prof)
}

// putNetworkProfile serves PUT /v1/network-profiles/{name}
// {description, policy}: operators only.
func (s *server) putNetworkProfile(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req apitypes.NetworkProfileRequest
	if err := decode(w, r, &req, false); err != nil {
		return err
	}
	prof, err := s.svc.PutNetworkProfile(r.Context(), p, r.PathValue("name"), req.Description, req.Policy)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, prof)
}

func (s *server) deleteNetworkProfile(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	if err := s.svc.DeleteNetworkProfile(r.Context(), p, r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// putSecret serves PUT /v1/secrets/{name} {"value": "..."}: admin keys
// of the org; 200 with the secret's name and times (never its value).
func (s *server) putSecret(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req apitypes.SecretRequest
	if err := decode(w, r, &req, false); err != nil {
		return err
	}
	sec, err := s.svc.PutSecret(r.Context(), p, r.PathValue("name"), req.Value)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sec)
}

func (s *server) listSecrets(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	list, err := s.svc.ListSecrets(r.Context(), p)
	if err != nil {
		return err
	}
	if list == nil {
		list = []model.Secret{}
	}
	return writeJSON(w, http.StatusOK, apitypes.SecretsResponse{Secrets: list})
}

func (s *server) deleteSecret(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	if err := s.svc.DeleteSecret(r.Context(), p, r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// getOrgCA serves GET /v1/network/ca: the PEM certificate of the org's
// Airlock CA, which its sandboxes trust (application/x-pem-file).
func (s *server) getOrgCA(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	cert, err := s.svc.OrgCACert(r.Context(), p)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/x-pem-file")
	w.WriteHeader(http.StatusOK)
	_, err = w.Write([]byte(cert))
	return err
}
