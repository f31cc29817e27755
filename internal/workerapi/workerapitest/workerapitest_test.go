package workerapitest_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
	"github.com/airlock/airlock/internal/workerapi/workerapitest"
)

// sentinels is every model sentinel.
var sentinels = []error{
	model.ErrNotFound, model.ErrGone, model.ErrConflict, model.ErrInvalid, model.ErrUnprocessable,
	model.ErrUnauthorized, model.ErrForbidden, model.ErrTooLarge, model.ErrRateLimited,
	model.ErrQuotaExceeded, model.ErrUnavailable,
}

// TestEverySentinelCrossesTheWorkerAPI: an error a Server returns from
// Register, Sync or Wake reaches the worker's Client as the same sentinel
// with its message, through the real handler over HTTP.
func TestEverySentinelCrossesTheWorkerAPI(t *testing.T) {
	ctx := t.Context()
	s := workerapitest.New(t)
	c := s.Client()
	calls := map[string]func() error{
		"register": func() error {
			_, err := c.Register(ctx, workerapi.RegisterRequest{ID: "w1", DataPlaneURL: "http://127.0.0.1:1"})
			return err
		},
		"sync": func() error { _, err := c.Sync(ctx, "w1", workerapi.SyncRequest{}, 0, -1); return err },
		"wake": func() error { _, err := c.Wake(ctx, "w1", workerapi.WakeRequest{SandboxID: "sb1"}); return err },
	}
	for name, call := range calls {
		for _, sent := range sentinels {
			msg := fmt.Sprintf("%s refused with %v: do this next", name, sent)
			s.Fail(name, fmt.Errorf("controller: %w", model.Errorf(sent, "%s", msg)))
			err := call()
			if !errors.Is(err, sent) {
				t.Errorf("%s: sent %v, got %v", name, sent, err)
			}
			var we *workerapi.Error
			if !errors.As(err, &we) || !strings.HasSuffix(we.Message, msg) {
				t.Errorf("%s: %v: message lost: %v", name, sent, err)
			}
			s.Fail(name, nil)
		}
		if err := call(); name != "wake" && err != nil {
			t.Errorf("%s after the failures: %v", name, err)
		}
	}
	// An error that is no sentinel is the server failing: unavailable.
	s.Fail("sync", errors.New("disk on fire"))
	if _, err := c.Sync(ctx, "w1", workerapi.SyncRequest{}, 0, -1); !errors.Is(err, model.ErrUnavailable) || !strings.Contains(err.Error(), "500") {
		t.Errorf("internal error: %v", err)
	}
}

func TestAuthentication(t *testing.T) {
	ctx := t.Context()
	s := workerapitest.New(t)
	bad := &workerapi.Client{URL: s.URL, JoinToken: "wrong"}
	if _, err := bad.Register(ctx, workerapi.RegisterRequest{ID: "w1"}); !errors.Is(err, model.ErrUnauthorized) {
		t.Fatalf("register with a wrong join token: %v", err)
	}
	bad.Secret = func() string { return "not-mine" }
	if _, err := bad.Sync(ctx, "w1", workerapi.SyncRequest{}, 0, -1); !errors.Is(err, model.ErrUnauthorized) {
		t.Fatalf("sync with a wrong secret: %v", err)
	}
	res, err := http.Post(s.URL+workerapi.SyncPath("w1"), "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized || !strings.Contains(res.Header.Get("WWW-Authenticate"), "airlock-worker") {
		t.Fatalf("sync without a credential: %s, WWW-Authenticate %q", res.Status, res.Header.Get("WWW-Authenticate"))
	}
}

// TestProtocol drives the in-memory server as a worker would.
func TestProtocol(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	s := workerapitest.New(t)
	c := s.Client()
	reg, err := c.Register(ctx, workerapi.RegisterRequest{ID: "w1", DataPlaneURL: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	if reg.WorkerID != "w1" || s.DataPlaneURL() != "http://127.0.0.1:1" {
		t.Fatalf("register: %+v, data plane %q", reg, s.DataPlaneURL())
	}
	first, err := c.Sync(ctx, "w1", workerapi.SyncRequest{}, 0, -1)
	if err != nil || len(first.Assignments) != 0 {
		t.Fatalf("first sync: %+v, %v", first, err)
	}
	s.WaitRegistered(ctx, 1)

	// A long poll returns when the assignments change.
	got := make(chan workerapi.SyncResponse, 1)
	go func() {
		resp, err := c.Sync(ctx, "w1", workerapi.SyncRequest{}, time.Minute, first.Version)
		if err != nil {
			t.Error(err)
		}
		got <- resp
	}()
	s.Assign("sb1", "sha256:x", model.StateRunning)
	resp := <-got
	if len(resp.Assignments) != 1 || resp.Assignments[0].Sandbox.ID != "sb1" || resp.Assignments[0].Desired != model.StateRunning {
		t.Fatalf("assignments after Assign: %+v", resp.Assignments)
	}

	if _, err := c.Sync(ctx, "w1", workerapi.SyncRequest{Observed: []workerapi.Observed{{SandboxID: "sb1", State: model.StateRunning}}}, 0, resp.Version); err != nil {
		t.Fatal(err)
	}
	if o := s.WaitObserved(ctx, "sb1", model.StateRunning); o.SandboxID != "sb1" {
		t.Fatalf("observed %+v", o)
	}

	// Wake: accepted, or a conflict once the sandbox opted out.
	if op, err := c.Wake(ctx, "w1", workerapi.WakeRequest{SandboxID: "sb1"}); err != nil || op.SandboxID != "sb1" || s.Wakes() != 1 {
		t.Fatalf("wake: %+v, %v (wakes %d)", op, err, s.Wakes())
	}
	s.SetNoAutoWake("sb1", true)
	if _, err := c.Wake(ctx, "w1", workerapi.WakeRequest{SandboxID: "sb1"}); !errors.Is(err, model.ErrConflict) {
		t.Fatalf("wake of an opted-out sandbox: %v", err)
	}
	if _, err := c.Wake(ctx, "w1", workerapi.WakeRequest{SandboxID: "nope"}); !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("wake of an unknown sandbox: %v", err)
	}

	// Deleting: once the worker reports it deleted, it is no longer assigned.
	s.Assign("sb1", "sha256:x", model.StateDeleted)
	resp, err = c.Sync(ctx, "w1", workerapi.SyncRequest{Observed: []workerapi.Observed{{SandboxID: "sb1", State: model.StateDeleted}}}, 0, -1)
	if err != nil || len(resp.Assignments) != 0 {
		t.Fatalf("after delete: %+v, %v", resp.Assignments, err)
	}

	if _, err := token.Verify(s.Key, s.Sign(token.Claims{SandboxID: "sb1", Scope: token.ScopeFiles}), time.Now()); err != nil {
		t.Fatalf("a token Sign made does not verify: %v", err)
	}
}
