package agent

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/airlock/airlock/internal/agentapi"
)

// Lists (GET /processes, GET /files/list) answer in pages: at most
// agentapi.MaxPageEntries entries (fewer with ?limit=N) and about
// agentapi.MaxPageBytes of JSON, in a stable order; the header
// agentapi.NextCursorHeader carries the cursor of the next page (?after=)
// when there is one. A host never has to hold more than one page of what
// the guest says.

// pageLimit reads ?limit= (default and most agentapi.MaxPageEntries).
func pageLimit(r *http.Request) (int, error) {
	s := r.URL.Query().Get("limit")
	if s == "" {
		return agentapi.MaxPageEntries, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, errorf(errInvalid, "limit %q is not a positive integer", s)
	}
	return min(n, agentapi.MaxPageEntries), nil
}

// writePage writes items[:k] as a JSON array, k bounded by limit and by
// agentapi.MaxPageBytes (at least one item), and the next cursor, made by
// cursor(items[k-1]), when items remain.
func writePage[T any](w http.ResponseWriter, items []T, limit int, cursor func(T) string) {
	out := make([]json.RawMessage, 0, min(len(items), limit))
	size := 0
	for _, it := range items {
		if len(out) >= limit {
			break
		}
		b, err := json.Marshal(it)
		if err != nil {
			continue
		}
		if len(out) > 0 && size+len(b)+1 > agentapi.MaxPageBytes {
			break
		}
		size += len(b) + 1
		out = append(out, b)
	}
	if len(out) < len(items) && len(out) > 0 {
		w.Header().Set(agentapi.NextCursorHeader, cursor(items[len(out)-1]))
	}
	writeJSON(w, http.StatusOK, out)
}
