package client

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/airlock/airlock/internal/httperr"
	"github.com/airlock/airlock/internal/model"
)

// TestDataPlaneErrorsDecode: every sentinel a data plane answers (through
// httperr, as internal/worker does) comes back as that sentinel.
func TestDataPlaneErrorsDecode(t *testing.T) {
	var next func(http.ResponseWriter)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { next(w) }))
	defer srv.Close()
	get := func() error {
		res, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		return dataPlaneResponseError(res)
	}
	for _, sent := range []error{
		model.ErrNotFound, model.ErrGone, model.ErrConflict, model.ErrInvalid, model.ErrUnprocessable,
		model.ErrUnauthorized, model.ErrForbidden, model.ErrTooLarge, model.ErrRateLimited,
		model.ErrQuotaExceeded, model.ErrUnavailable,
	} {
		msg := fmt.Sprintf("it is %v", sent)
		next = func(w http.ResponseWriter) { httperr.Write(w, model.Errorf(sent, "%s", msg)) }
		if err := get(); !errors.Is(err, sent) || err.Error() != msg {
			t.Errorf("%v: got %v", sent, err)
		}
	}
	if !errors.Is(ErrGone, model.ErrNotFound) {
		t.Error("ErrGone is not a not-found")
	}
	next = func(w http.ResponseWriter) { http.Error(w, "bad gateway", http.StatusBadGateway) }
	if err := get(); !errors.Is(err, model.ErrUnavailable) || err.Error() != "bad gateway" {
		t.Errorf("a proxy's 502: %v", err)
	}
	next = func(w http.ResponseWriter) { httperr.Write(w, errors.New("disk on fire")) }
	if err := get(); httperr.Kind(err) != nil || err.Error() != "disk on fire" {
		t.Errorf("a 500: %v (kind %v)", err, httperr.Kind(err))
	}
}
