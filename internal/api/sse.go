package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
)

// ssePage is how many events one store read returns.
const ssePage = 500

func (s *server) allEvents(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	return s.stream(w, r, p, "")
}

func (s *server) sandboxEvents(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	id := r.PathValue("id")
	if _, err := s.svc.GetSandbox(r.Context(), p, id); err != nil {
		return err
	}
	return s.stream(w, r, p, id)
}

// stream serves the caller's events as Server-Sent Events: "id: <seq>",
// "event: <type>", "data: <event JSON>", one flush per event, and a comment
// every keepAlive. It resumes after Last-Event-ID (or ?after=N) and runs
// until the client goes away.
func (s *server) stream(w http.ResponseWriter, r *http.Request, p service.Principal, sandboxID string) error {
	after, err := resumePoint(r)
	if err != nil {
		return err
	}
	rc := http.NewResponseController(w)
	// The stream outlives any server write timeout.
	_ = rc.SetWriteDeadline(time.Time{})
	ctx := r.Context()

	// Read the first page before committing to a 200, so a store failure
	// is still an error response.
	changed := s.svc.EventsChanged()
	evs, err := s.svc.ListEvents(ctx, p, sandboxID, after, ssePage)
	if err != nil {
		return err
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if _, err := fmt.Fprint(w, ": airlock events\n\n"); err != nil {
		return nil
	}
	if err := rc.Flush(); err != nil {
		return nil
	}

	tick := time.NewTicker(s.keepAlive)
	defer tick.Stop()
	for {
		for _, ev := range evs {
			if err := writeEvent(w, ev); err != nil {
				return nil
			}
			if err := rc.Flush(); err != nil {
				return nil
			}
			after = ev.Seq
		}
		if len(evs) < ssePage { // caught up: wait for a change
		wait:
			for {
				select {
				case <-ctx.Done():
					return nil
				case <-changed:
					break wait
				case <-tick.C:
					if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
						return nil
					}
					if err := rc.Flush(); err != nil {
						return nil
					}
				}
			}
		}
		changed = s.svc.EventsChanged()
		evs, err = s.svc.ListEvents(ctx, p, sandboxID, after, ssePage)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Error("event stream: list events", "err", err)
			}
			return nil // headers are sent; ending the stream lets the client resume
		}
	}
}

func writeEvent(w http.ResponseWriter, ev model.Event) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", ev.Seq, ev.Type, b)
	return err
}

func resumePoint(r *http.Request) (int64, error) {
	v := r.Header.Get("Last-Event-ID")
	src := "Last-Event-ID"
	if q := r.URL.Query().Get("after"); q != "" && v == "" {
		v, src = q, "after"
	}
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, badRequest("%s %q is not an event sequence number", src, v)
	}
	return n, nil
}
