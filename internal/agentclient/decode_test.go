package agentclient

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/httperr"
	"github.com/airlock/airlock/internal/model"
)

// TestDecodeError: the agent's codes (agentapi.Error) decode to model
// sentinels through httperr; an internal error stays a plain error.
func TestDecodeError(t *testing.T) {
	answer := func(status int, body string) error {
		rec := httptest.NewRecorder()
		rec.WriteHeader(status)
		rec.WriteString(body)
		return decodeError(rec.Result())
	}
	for code, want := range map[string]error{
		"not_found": model.ErrNotFound, "invalid": model.ErrInvalid, "conflict": model.ErrConflict, "gone": ErrGone,
	} {
		var b agentapi.Error
		b.Error.Code, b.Error.Message = code, "the agent says "+code
		status, _ := httperr.Status(want)
		rec := httptest.NewRecorder()
		writeAgentError(rec, status, b)
		err := decodeError(rec.Result())
		if !errors.Is(err, want) || err.Error() != "the agent says "+code {
			t.Errorf("%s: %v", code, err)
		}
	}
	err := answer(http.StatusInternalServerError, `{"error":{"code":"internal","message":"boom"}}`)
	if httperr.Kind(err) != nil || err.Error() != "agent: boom (500 Internal Server Error)" {
		t.Errorf("internal: %v", err)
	}
	err = answer(http.StatusNotFound, "no such route\n")
	if !errors.Is(err, model.ErrNotFound) || !strings.Contains(err.Error(), "agent answered 404 Not Found: no such route") {
		t.Errorf("a 404 without a body: %v", err)
	}
}

// writeAgentError answers as the agent's writeError does.
func writeAgentError(rec *httptest.ResponseRecorder, status int, b agentapi.Error) {
	rec.Header().Set("Content-Type", "application/json")
	rec.WriteHeader(status)
	json.NewEncoder(rec).Encode(b)
}
