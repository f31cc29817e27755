package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
)

// ssePage is how many events one store read returns.
const ssePage = 500

// DefaultMaxStreamsPerKey is how many SSE event streams one API key may
// hold open at once (Options.MaxStreamsPerKey changes it).
const DefaultMaxStreamsPerKey = 32

// streamCounter counts the open event streams per API key.
type streamCounter struct {
	max int
	mu  sync.Mutex
	n   map[string]int
}

// acquire takes one of key's streams; release gives it back.
func (c *streamCounter) acquire(key string) (release func(), err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[key] >= c.max {
		return nil, model.Errorf(model.ErrRateLimited,
			"API key %s already has %d event streams open, the most one key may hold; close one (a single /v1/events stream follows every sandbox of the org)", key, c.max)
	}
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[key]++
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.n[key]--; c.n[key] <= 0 {
				delete(c.n, key)
			}
		})
	}, nil
}

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
//
// The store is read only to catch up (from the resume point, and once more
// after subscribing); new events come from the Log's one fan-out
// (events.Log.Subscribe), so an event costs the store one read however many
// streams are open. A stream that falls behind the fan-out catches up from
// the store again. Each API key holds at most DefaultMaxStreamsPerKey
// streams (429 beyond).
func (s *server) stream(w http.ResponseWriter, r *http.Request, p service.Principal, sandboxID string) error {
	after, err := resumePoint(r)
	if err != nil {
		return err
	}
	key := p.KeyID
	if key == "" {
		key = "org " + p.OrgID
	}
	release, err := s.streams.acquire(key)
	if err != nil {
		return err
	}
	defer release()
	rc := http.NewResponseController(w)
	// The stream outlives any server write timeout.
	_ = rc.SetWriteDeadline(time.Time{})
	ctx := r.Context()

	// Read the first page before committing to a 200, so a store failure
	// is still an error response.
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

	// send writes the events after the stream's position, in order.
	send := func(evs []model.Event) bool {
		for _, ev := range evs {
			if ev.Seq <= after {
				continue // a duplicate of the catch-up and the fan-out
			}
			if err := writeEvent(w, ev); err != nil {
				return false
			}
			if err := rc.Flush(); err != nil {
				return false
			}
			after = ev.Seq
		}
		return true
	}
	// catchUp reads the store from the stream's position to its end.
	catchUp := func() bool {
		for {
			if !send(evs) {
				return false
			}
			if len(evs) < ssePage {
				return true
			}
			if evs, err = s.svc.ListEvents(ctx, p, sandboxID, after, ssePage); err != nil {
				if ctx.Err() == nil {
					s.log.Error("event stream: list events", "err", err)
				}
				return false // headers are sent; ending the stream lets the client resume
			}
		}
	}
	if !catchUp() {
		return nil
	}

	tick := time.NewTicker(s.keepAlive)
	defer tick.Stop()
	for {
		sub, err := s.subscribe(ctx, p, sandboxID)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Error("event stream: subscribe", "err", err)
			}
			return nil
		}
		// What was appended before the subscription began is in the store.
		if evs, err = s.svc.ListEvents(ctx, p, sandboxID, after, ssePage); err != nil || !catchUp() {
			sub.Close()
			if err != nil && ctx.Err() == nil {
				s.log.Error("event stream: list events", "err", err)
			}
			return nil
		}
		if !s.follow(ctx, w, rc, sub, send, tick.C) {
			sub.Close()
			return nil
		}
		sub.Close() // lagged: catch up from the store, then subscribe again
	}
}

// subscribe subscribes to the caller's events (p's org; one sandbox if set).
func (s *server) subscribe(ctx context.Context, p service.Principal, sandboxID string) (*events.Subscription, error) {
	return s.svc.Subscribe(ctx, p.OrgID, sandboxID)
}

// follow writes the subscription's events until the client goes away
// (false) or the subscription lags (true).
func (s *server) follow(ctx context.Context, w http.ResponseWriter, rc *http.ResponseController, sub *events.Subscription, send func([]model.Event) bool, tick <-chan time.Time) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case ev := <-sub.C:
			if !send([]model.Event{*ev}) {
				return false
			}
		case <-sub.Lagged:
			return true
		case <-tick:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return false
			}
			if err := rc.Flush(); err != nil {
				return false
			}
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
