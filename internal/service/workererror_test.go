package service

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/httperr"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/workerapi"
)

// TestWorkerError: what a worker's data plane answers (through httperr and
// workerapi.DataPlane) keeps its meaning when the user's request caused it;
// anything else, the worker refusing the server's own credentials
// included, is the worker failing: unavailable.
func TestWorkerError(t *testing.T) {
	var sent error
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if sent == nil {
			http.Error(w, "bad gateway", http.StatusBadGateway)
			return
		}
		httperr.Write(w, model.Errorf(sent, "the worker says %v", sent))
	}))
	defer srv.Close()
	dp := &workerapi.DataPlane{}
	call := func() error {
		return workerError(dp.DropSnapshots(context.Background(), workerapi.Target{Worker: "w1", URL: srv.URL}, "sb1"), "w1", "exporting")
	}
	for s, want := range map[error]error{
		model.ErrInvalid: model.ErrInvalid, model.ErrUnprocessable: model.ErrUnprocessable,
		model.ErrNotFound: model.ErrNotFound, model.ErrConflict: model.ErrConflict, model.ErrTooLarge: model.ErrTooLarge,
		model.ErrUnauthorized: model.ErrUnavailable, model.ErrForbidden: model.ErrUnavailable,
		model.ErrGone: model.ErrUnavailable, model.ErrRateLimited: model.ErrUnavailable,
		model.ErrQuotaExceeded: model.ErrUnavailable, model.ErrUnavailable: model.ErrUnavailable,
		errors.New("disk on fire"): model.ErrUnavailable,
	} {
		sent = s
		err := call()
		if httperr.Kind(err) != want || !strings.Contains(err.Error(), "the worker says") {
			t.Errorf("%v: got %v (kind %v), want %v", s, err, httperr.Kind(err), want)
		}
		if want == model.ErrUnavailable && !strings.Contains(err.Error(), "worker w1 answered") {
			t.Errorf("%v: %q does not name the worker", s, err)
		}
	}
	sent = nil
	if err := call(); !errors.Is(err, model.ErrUnavailable) {
		t.Errorf("a 502: %v", err)
	}
	srv.Close()
	if err := call(); !errors.Is(err, model.ErrUnavailable) || !strings.Contains(err.Error(), "worker w1 did not answer") {
		t.Errorf("a worker that is gone: %v", err)
	}
}
