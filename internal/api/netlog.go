package api

import (
	"net/http"
	"strconv"

	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/service"
)

// networkLog serves GET /v1/sandboxes/{id}/network/log?after=SEQ&limit=N.
func (s *server) networkLog(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	q := r.URL.Query()
	var after int64
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return badRequest("after %q is not a sequence number", v)
		}
		after = n
	}
	limit := 0
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return badRequest("limit %q is not a number", v)
		}
		limit = n
	}
	lg, err := s.svc.NetworkLog(r.Context(), p, r.PathValue("id"), after, limit)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, apitypes.NetworkLogResponse{Entries: lg.Entries, Next: lg.Next, Missed: lg.Missed, Reset: lg.Reset, Note: lg.Note})
}
