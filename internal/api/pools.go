package api

import (
	"net/http"

	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/service"
)

// Warm-pool admin endpoints (operators only; see service.SetPool).

func (s *server) listPools(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	pools, err := s.svc.ListPools(r.Context(), p)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, apitypes.PoolList{Pools: poolsOut(pools)})
}

func (s *server) setPool(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req apitypes.SetPoolRequest
	if err := decode(w, r, &req, false); err != nil {
		return err
	}
	pool, err := s.svc.SetPool(r.Context(), p, r.PathValue("template"), service.PoolParams(req))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, apitypes.Pool(pool))
}

func (s *server) deletePool(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	if err := s.svc.DeletePool(r.Context(), p, r.PathValue("template")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
