package api

import (
	"net/http"

	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/service"
)

func workerOut(w service.WorkerStatus) apitypes.Worker {
	return apitypes.Worker{Worker: w.Worker, State: w.State, Sandboxes: w.Sandboxes, UsedMiB: w.UsedMiB, UsedVCPUs: w.UsedVCPUs}
}

// listWorkers serves GET /v1/workers (operators): 200 {workers}.
func (s *server) listWorkers(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	ws, err := s.svc.ListWorkers(r.Context(), p)
	if err != nil {
		return err
	}
	out := make([]apitypes.Worker, 0, len(ws))
	for _, x := range ws {
		out = append(out, workerOut(x))
	}
	return writeJSON(w, http.StatusOK, apitypes.ListWorkersResponse{Workers: out})
}

// getWorker serves GET /v1/workers/{id} (operators): 200 {worker}.
func (s *server) getWorker(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	x, err := s.svc.GetWorker(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, workerOut(x))
}

// cordonWorker serves POST /v1/workers/{id}/cordon (operators): 200 {worker}.
func (s *server) cordonWorker(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	return s.setCordon(w, r, p, true)
}

// uncordonWorker serves POST /v1/workers/{id}/uncordon (operators): 200 {worker}.
func (s *server) uncordonWorker(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	return s.setCordon(w, r, p, false)
}

func (s *server) setCordon(w http.ResponseWriter, r *http.Request, p service.Principal, cordoned bool) error {
	x, err := s.svc.CordonWorker(r.Context(), p, r.PathValue("id"), cordoned)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, workerOut(x))
}

// drainWorker serves POST /v1/workers/{id}/drain (operators): 200 {worker};
// 409 when the worker uses no blob store.
func (s *server) drainWorker(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	x, err := s.svc.DrainWorker(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, workerOut(x))
}
