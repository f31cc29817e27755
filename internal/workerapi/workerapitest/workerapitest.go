// Package workerapitest is an in-memory server side of the worker API
// (internal/workerapi) for worker tests: it speaks the real protocol
// through workerapi.NewHandler over httptest, holds assignments the test
// sets, and records what the worker registers, observes and asks to wake.
// It behaves like the controller where a worker can tell (a deleted
// sandbox stops being assigned, a wake sets desired running, an opted-out
// sandbox's wake is a conflict) and nothing more: no store, no placement.
package workerapitest

import (
	"context"
	"encoding/base64"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

// JoinToken is the join token the server accepts (and, as this server
// issues no worker secrets, every later call's credential too).
const JoinToken = "worker-secret"

// Server is an in-memory worker API server. Its methods are safe for
// concurrent use.
type Server struct {
	// URL is the server's base URL (an httptest server, closed at the
	// test's end).
	URL string
	// Key is the data-plane signing key it hands workers.
	Key []byte

	t     testing.TB
	order workerapi.SyncOrder
	mu    sync.Mutex
	// changed is closed and replaced on any change.
	changed     chan struct{}
	version     int64
	assignments map[string]workerapi.Assignment
	observed    map[string]workerapi.Observed
	history     map[string][]model.SandboxState
	noAutoWake  map[string]bool
	registered  int
	syncedSince bool // a sync arrived since the last registration
	dataPlane   string
	wakes       int
	fail        map[string]error
}

var _ workerapi.Server = (*Server)(nil)

// New starts a server for the test t.
func New(t testing.TB) *Server {
	s := &Server{
		t: t, Key: token.NewKey(), changed: make(chan struct{}),
		assignments: map[string]workerapi.Assignment{}, observed: map[string]workerapi.Observed{},
		history: map[string][]model.SandboxState{}, noAutoWake: map[string]bool{}, fail: map[string]error{},
	}
	srv := httptest.NewServer(workerapi.NewHandler(s, workerapi.HandlerConfig{JoinToken: JoinToken}))
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

// Client returns a worker API client of s.
func (s *Server) Client() *workerapi.Client {
	return &workerapi.Client{URL: s.URL, JoinToken: JoinToken}
}

// Fail makes every later call named call ("register", "sync", "wake")
// fail with err (nil: succeed again).
func (s *Server) Fail(call string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail[call] = err
}

func (s *Server) bump() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Authenticate accepts the join token (this server issues no secrets).
func (s *Server) Authenticate(_ context.Context, id, secret string) error {
	if secret != JoinToken {
		return model.Errorf(model.ErrUnauthorized, "wrong credential for worker %s", id)
	}
	return nil
}

// Register records a registration and hands out Key.
func (s *Server) Register(_ context.Context, req workerapi.RegisterRequest) (workerapi.RegisterResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.fail["register"]; err != nil {
		return workerapi.RegisterResponse{}, err
	}
	s.registered++
	s.syncedSince = false
	s.dataPlane = req.DataPlaneURL
	s.bump()
	return workerapi.RegisterResponse{WorkerID: req.ID, SigningKey: base64.StdEncoding.EncodeToString(s.Key)}, nil
}

// Heartbeat does nothing: this server does not track liveness.
func (s *Server) Heartbeat(context.Context, string) error { return nil }

// Sync records the observations (a deleted sandbox whose desired state is
// deleted stops being assigned) and long-polls like the controller.
func (s *Server) Sync(ctx context.Context, _ string, req workerapi.SyncRequest, poll workerapi.Poll) (workerapi.SyncResponse, error) {
	s.mu.Lock()
	if err := s.fail["sync"]; err != nil {
		s.mu.Unlock()
		return workerapi.SyncResponse{}, err
	}
	changed := !s.syncedSince
	s.syncedSince = true
	if s.order.Stale("", req) {
		req = workerapi.SyncRequest{} // overtaken by a later Sync (as the controller does)
	}
	for _, o := range req.Observed {
		if prev, ok := s.observed[o.SandboxID]; !ok || !sameObserved(prev, o) {
			if !ok || prev.State != o.State {
				s.history[o.SandboxID] = append(s.history[o.SandboxID], o.State)
			}
			s.observed[o.SandboxID] = o
			changed = true
		}
		if a, ok := s.assignments[o.SandboxID]; ok && o.State != model.StateDeleted {
			a.Sandbox.State = o.State
			if o.SnapshotID != "" {
				a.Sandbox.SnapshotID = o.SnapshotID
			}
			s.assignments[o.SandboxID] = a
		}
		if a, ok := s.assignments[o.SandboxID]; ok && o.State == model.StateDeleted && a.Desired == model.StateDeleted {
			delete(s.assignments, o.SandboxID)
			s.version++
		}
	}
	if changed {
		s.bump()
	}
	ch, cur := s.changed, s.version
	s.mu.Unlock()
	if !changed && poll.HasVersion && cur == poll.Version && poll.Wait > 0 {
		t := time.NewTimer(poll.Wait)
		defer t.Stop()
		select {
		case <-ch:
		case <-t.C:
		case <-ctx.Done():
			return workerapi.SyncResponse{}, ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := workerapi.SyncResponse{Version: s.version, Assignments: []workerapi.Assignment{}}
	for _, a := range s.assignments {
		resp.Assignments = append(resp.Assignments, a)
	}
	return resp, nil
}

func sameObserved(a, b workerapi.Observed) bool {
	if (a.Task == nil) != (b.Task == nil) || a.Task != nil && *a.Task != *b.Task {
		return false
	}
	if (a.Action == nil) != (b.Action == nil) || a.Action != nil && *a.Action != *b.Action {
		return false
	}
	a.Task, b.Task, a.Action, b.Action = nil, nil, nil, nil
	return a == b
}

// Wake sets a sandbox's desired state to running, or refuses (conflict)
// when it opted out of auto-wake.
func (s *Server) Wake(_ context.Context, _ string, req workerapi.WakeRequest) (model.Operation, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.fail["wake"]; err != nil {
		return model.Operation{}, err
	}
	a, ok := s.assignments[req.SandboxID]
	switch {
	case !ok:
		return model.Operation{}, model.Errorf(model.ErrNotFound, "no such sandbox %s", req.SandboxID)
	case s.noAutoWake[req.SandboxID]:
		return model.Operation{}, model.Errorf(model.ErrConflict, "sandbox %s opted out of auto-wake; wake it explicitly", req.SandboxID)
	}
	s.wakes++
	a.Desired = model.StateRunning
	s.assignments[req.SandboxID] = a
	s.version++
	s.bump()
	return model.Operation{ID: "op-wake-" + req.SandboxID, SandboxID: req.SandboxID, Kind: model.OpWake}, nil
}

// Assign sets the desired state of sandbox id (template "base" at digest,
// 1 vCPU, 512 MiB), replacing its assignment but for the state and
// snapshot the worker reported; a new sandbox is starting, as the
// controller places it.
func (s *Server) Assign(id, digest string, desired model.SandboxState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	state, snap := model.StateStarting, ""
	if a, ok := s.assignments[id]; ok {
		state, snap = a.Sandbox.State, a.Sandbox.SnapshotID
	}
	s.assignments[id] = workerapi.Assignment{
		Sandbox: workerapi.SandboxSpec{ID: id, Template: "base", TemplateDigest: digest, State: state, SnapshotID: snap,
			Resources: model.Resources{VCPUs: 1, MemoryMiB: 512}},
		Desired: desired,
	}
	s.version++
	s.bump()
}

// Set replaces sandbox id's assignment with a.
func (s *Server) Set(a workerapi.Assignment) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.assignments[a.Sandbox.ID] = a
	s.version++
	s.bump()
}

// Update changes sandbox id's assignment (the zero one if it has none)
// and bumps the version.
func (s *Server) Update(id string, f func(*workerapi.Assignment)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.assignments[id]
	f(&a)
	s.assignments[id] = a
	s.version++
	s.bump()
}

// Unassign drops sandbox id's assignment without a word to the worker,
// as when the server forgets it.
func (s *Server) Unassign(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.assignments, id)
	s.version++
}

// Observed returns the last observation of sandbox id.
func (s *Server) Observed(id string) (workerapi.Observed, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.observed[id]
	return o, ok
}

// Assignment returns sandbox id's assignment.
func (s *Server) Assignment(id string) (workerapi.Assignment, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.assignments[id]
	return a, ok
}

// SetNoAutoWake opts sandbox id out of auto-wake (or back in).
func (s *Server) SetNoAutoWake(id string, v bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noAutoWake[id] = v
}

// Wakes returns how many wakes were accepted.
func (s *Server) Wakes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.wakes
}

// DataPlaneURL is the data-plane URL of the last registration.
func (s *Server) DataPlaneURL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dataPlane
}

// WaitFor waits until cond holds for what the worker reported of id (its
// last observation and the history of its states); it fails the test
// when ctx ends first.
func (s *Server) WaitFor(ctx context.Context, id string, cond func(workerapi.Observed, []model.SandboxState) bool) workerapi.Observed {
	s.t.Helper()
	for {
		s.mu.Lock()
		o := s.observed[id]
		h := append([]model.SandboxState(nil), s.history[id]...)
		ch := s.changed
		s.mu.Unlock()
		if cond(o, h) {
			return o
		}
		select {
		case <-ch:
		case <-ctx.Done():
			s.t.Fatalf("sandbox %s: condition never held (last: %+v, history %v)", id, o, h)
		}
	}
}

// WaitObserved waits until the worker reported sandbox id in state st.
func (s *Server) WaitObserved(ctx context.Context, id string, st model.SandboxState) workerapi.Observed {
	s.t.Helper()
	seen := false
	return s.WaitFor(ctx, id, func(o workerapi.Observed, h []model.SandboxState) bool {
		seen = len(h) > 0
		return seen && o.State == st
	})
}

// WaitRegistered waits until the worker registered n times and synced
// after that (so it holds the signing key and has adopted its sandboxes).
func (s *Server) WaitRegistered(ctx context.Context, n int) {
	s.t.Helper()
	for {
		s.mu.Lock()
		got, synced, ch := s.registered, s.syncedSince, s.changed
		s.mu.Unlock()
		if got >= n && synced {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			s.t.Fatalf("worker registered %d times, want %d", got, n)
		}
	}
}

// Sign returns a data-plane token of c signed with Key (an hour by
// default).
func (s *Server) Sign(c token.Claims) string {
	s.t.Helper()
	if c.Expires == 0 {
		c.Expires = time.Now().Add(time.Hour).Unix()
	}
	tok, err := token.Sign(s.Key, c)
	if err != nil {
		s.t.Fatal(err)
	}
	return tok
}
