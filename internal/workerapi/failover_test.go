package workerapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/workerapi"
)

// TestClientFailsOver: with several server URLs, a call that cannot reach
// one (refused, or a proxy's 502/503/504) goes to the next; the client
// stays with the one that answered; a real error answer is not retried.
func TestClientFailsOver(t *testing.T) {
	var hits [2]atomic.Int32
	var status [2]atomic.Int32
	servers := make([]*httptest.Server, 2)
	for i := range servers {
		servers[i] = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits[i].Add(1)
			if st := int(status[i].Load()); st != 0 {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(st)
				fmt.Fprintf(w, `{"code":"conflict","message":"server %d says no"}`, i)
				return
			}
			fmt.Fprintf(w, `{"operation":{"id":"op-from-%d"}}`, i)
		}))
		t.Cleanup(servers[i].Close)
	}
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close() // connection refused from now on

	c := &workerapi.Client{URL: deadURL + ", " + servers[0].URL + "," + servers[1].URL + "/", JoinToken: "j"}
	ctx := context.Background()
	wake := func() (model.Operation, error) { return c.Wake(ctx, "w1", workerapi.WakeRequest{SandboxID: "sb-1"}) }

	if op, err := wake(); err != nil || op.ID != "op-from-0" {
		t.Fatalf("with the first server down: %+v %v; want server 0's answer", op, err)
	}
	if c.Current() != servers[0].URL {
		t.Fatalf("current = %s; want %s", c.Current(), servers[0].URL)
	}
	// A proxy in front of server 0 answers 502: on to server 1, which stays.
	status[0].Store(http.StatusBadGateway)
	if op, err := wake(); err != nil || op.ID != "op-from-1" {
		t.Fatalf("with server 0 behind a failing proxy: %+v %v; want server 1's answer", op, err)
	}
	status[0].Store(0)
	before := hits[0].Load()
	if op, err := wake(); err != nil || op.ID != "op-from-1" || hits[0].Load() != before {
		t.Fatalf("the client did not stay with server 1: %+v %v (server 0 hit %d more times)", op, err, hits[0].Load()-before)
	}
	// A real refusal is the answer: no other server is asked.
	status[1].Store(http.StatusConflict)
	before = hits[0].Load()
	if _, err := wake(); !errors.Is(err, model.ErrConflict) || hits[0].Load() != before {
		t.Fatalf("a 409: %v (server 0 hit %d more times); want the conflict, no failover", err, hits[0].Load()-before)
	}
	// Every server unreachable: one error naming them.
	status[0].Store(http.StatusServiceUnavailable)
	status[1].Store(http.StatusServiceUnavailable)
	if _, err := wake(); err == nil {
		t.Fatal("every server unavailable, yet the call succeeded")
	}
}
