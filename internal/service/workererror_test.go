package service

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/httperr"
	"github.com/airlock/airlock/internal/model"
)

// TestWorkerError: what a worker's data plane answers (through httperr)
// keeps its meaning when the user's request caused it; anything else,
// the worker refusing the server's own credentials included, is the
// worker failing: unavailable.
func TestWorkerError(t *testing.T) {
	for sent, want := range map[error]error{
		model.ErrInvalid: model.ErrInvalid, model.ErrUnprocessable: model.ErrUnprocessable,
		model.ErrNotFound: model.ErrNotFound, model.ErrConflict: model.ErrConflict, model.ErrTooLarge: model.ErrTooLarge,
		model.ErrUnauthorized: model.ErrUnavailable, model.ErrForbidden: model.ErrUnavailable,
		model.ErrGone: model.ErrUnavailable, model.ErrRateLimited: model.ErrUnavailable,
		model.ErrQuotaExceeded: model.ErrUnavailable, model.ErrUnavailable: model.ErrUnavailable,
		errors.New("disk on fire"): model.ErrUnavailable,
	} {
		rec := httptest.NewRecorder()
		httperr.Write(rec, model.Errorf(sent, "the worker says %v", sent))
		err := workerError(rec.Result(), "w1", "exporting")
		if httperr.Kind(err) != want || !strings.Contains(err.Error(), "the worker says") {
			t.Errorf("%v: got %v (kind %v), want %v", sent, err, httperr.Kind(err), want)
		}
		if want == model.ErrUnavailable && !strings.Contains(err.Error(), "worker w1 answered") {
			t.Errorf("%v: %q does not name the worker", sent, err)
		}
	}
	rec := httptest.NewRecorder()
	http.Error(rec, "bad gateway", http.StatusBadGateway)
	if err := workerError(rec.Result(), "w1", "importing"); !errors.Is(err, model.ErrUnavailable) {
		t.Errorf("a 502: %v", err)
	}
}
