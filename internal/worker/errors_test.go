package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/airlock/airlock/internal/httperr"
	"github.com/airlock/airlock/internal/model"
)

// TestDataPlaneErrorsRoundTrip: the data plane answers every model
// sentinel through httperr, so a reader gets the same sentinel back; a
// transport failure to the agent is unavailable; an error after the
// response started writes nothing.
func TestDataPlaneErrorsRoundTrip(t *testing.T) {
	for _, sent := range []error{
		model.ErrNotFound, model.ErrGone, model.ErrConflict, model.ErrInvalid, model.ErrUnprocessable,
		model.ErrUnauthorized, model.ErrForbidden, model.ErrTooLarge, model.ErrRateLimited,
		model.ErrQuotaExceeded, model.ErrUnavailable,
	} {
		rec := httptest.NewRecorder()
		writeError(rec, fmt.Errorf("files: %w", model.Errorf(sent, "sandbox sb1: %v", sent)))
		got := httperr.Decode(rec.Code, rec.Body.Bytes())
		if !errors.Is(got, sent) || httperr.Kind(got) != sent {
			t.Errorf("%v: read back %v (%d)", sent, got, rec.Code)
		}
	}
	rec := httptest.NewRecorder()
	writeError(rec, fmt.Errorf("agent: %w", io.ErrUnexpectedEOF))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("unreachable agent: %d", rec.Code)
	}
	rec = httptest.NewRecorder()
	writeError(rec, fmt.Errorf("agent: %w", context.Canceled))
	if rec.Code != http.StatusInternalServerError {
		t.Errorf("other error: %d", rec.Code)
	}
	rec = httptest.NewRecorder()
	writeError(rec, fmt.Errorf("copy: %w", errHeadersSent))
	if rec.Body.Len() != 0 {
		t.Errorf("after the headers: wrote %q", rec.Body.String())
	}
}
