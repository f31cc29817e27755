// Package httperr is the one place model errors become HTTP answers and
// HTTP answers become model errors again, for every internal HTTP surface:
// the worker API (internal/workerapi: server → worker), the worker's data
// plane (internal/worker → client and internal/service), and the
// agent API as the host reads it (internal/agentclient). A sentinel sent
// across any of them comes back as the same sentinel (errors.Is), with its
// message.
//
// Every surface answers an error with one body shape,
//
//	{"error": {"code": "<code>", "message": "<what happened and what to do>"}}
//
// and a reader decides by the code first and by the status only when the
// body carries no code (a proxy's page, an older peer). Internal is the
// table of the internal surfaces; Public is the public /v1 API's, which
// differs in one documented row (ErrInvalid is 422 "unprocessable" there,
// as users have always seen it). The E2B adapter keeps its own outward
// mapping, since E2B's SDKs expect E2B's statuses.
//
// What a caller does with an answer that names no sentinel (a 500
// "internal", a 502 from a proxy) is the caller's choice, and each says it
// where it calls FromResponse: the worker and the service treat it as
// model.ErrUnavailable (the peer failed; retry), the agent client keeps it
// a plain error.
package httperr

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/airlock/airlock/internal/model"
)

// Wire codes. They are the codes of the public API (apitypes.Code*) where
// both have one.
const (
	CodeNotFound      = "not_found"
	CodeGone          = "gone"
	CodeConflict      = "conflict"
	CodeInvalid       = "invalid"
	CodeUnprocessable = "unprocessable"
	CodeUnauthorized  = "unauthorized"
	CodeForbidden     = "forbidden"
	CodeTooLarge      = "too_large"
	CodeRateLimited   = "rate_limited"
	CodeQuotaExceeded = "quota_exceeded"
	CodeUnavailable   = "unavailable"
	CodeInternal      = "internal"
)

// Row maps one sentinel to its status and code.
type Row struct {
	Err    error
	Status int
	Code   string
}

// Table maps sentinels to answers, in order: an error takes the first row
// whose sentinel it matches (errors.Is), so a sentinel that wraps another
// (ErrQuotaExceeded is an ErrRateLimited, ErrGone an ErrNotFound) comes
// before it.
type Table []Row

// Internal is the table of every internal surface.
var Internal = Table{
	{model.ErrUnauthorized, http.StatusUnauthorized, CodeUnauthorized},
	{model.ErrForbidden, http.StatusForbidden, CodeForbidden},
	{model.ErrGone, http.StatusGone, CodeGone},
	{model.ErrNotFound, http.StatusNotFound, CodeNotFound},
	{model.ErrConflict, http.StatusConflict, CodeConflict},
	{model.ErrInvalid, http.StatusBadRequest, CodeInvalid},
	{model.ErrUnprocessable, http.StatusUnprocessableEntity, CodeUnprocessable},
	{model.ErrTooLarge, http.StatusRequestEntityTooLarge, CodeTooLarge},
	{model.ErrQuotaExceeded, http.StatusTooManyRequests, CodeQuotaExceeded},
	{model.ErrRateLimited, http.StatusTooManyRequests, CodeRateLimited},
	{model.ErrUnavailable, http.StatusServiceUnavailable, CodeUnavailable},
}

// Public is the /v1 API's table (internal/api; documented in
// api/openapi.yaml): ErrInvalid and ErrUnprocessable are both 422
// "unprocessable" (a malformed request, which the API tells apart, is 400
// "bad_request"), and ErrGone is a plain 404, since the public API has
// never answered 410.
var Public = Table{
	{model.ErrUnauthorized, http.StatusUnauthorized, CodeUnauthorized},
	{model.ErrForbidden, http.StatusForbidden, CodeForbidden},
	{model.ErrNotFound, http.StatusNotFound, CodeNotFound},
	{model.ErrConflict, http.StatusConflict, CodeConflict},
	{model.ErrUnprocessable, http.StatusUnprocessableEntity, CodeUnprocessable},
	{model.ErrInvalid, http.StatusUnprocessableEntity, CodeUnprocessable},
	{model.ErrTooLarge, http.StatusRequestEntityTooLarge, CodeTooLarge},
	{model.ErrQuotaExceeded, http.StatusTooManyRequests, CodeQuotaExceeded},
	{model.ErrRateLimited, http.StatusTooManyRequests, CodeRateLimited},
	{model.ErrUnavailable, http.StatusServiceUnavailable, CodeUnavailable},
}

// Lookup returns the row err matches, if any.
func (t Table) Lookup(err error) (Row, bool) {
	for _, r := range t {
		if errors.Is(err, r.Err) {
			return r, true
		}
	}
	return Row{}, false
}

// Status returns err's status and code: 500 "internal" when it matches no
// sentinel.
func (t Table) Status(err error) (int, string) {
	if r, ok := t.Lookup(err); ok {
		return r.Status, r.Code
	}
	return http.StatusInternalServerError, CodeInternal
}

// Kind returns the sentinel an answer stands for: the row of code, else
// (an answer without a code) the most general row of status; nil when
// neither names one ("internal", a 500, a 502).
func (t Table) Kind(status int, code string) error {
	if code != "" {
		for _, r := range t {
			if r.Code == code {
				return r.Err
			}
		}
		return nil
	}
	var kind error
	for _, r := range t {
		if r.Status == status {
			kind = r.Err // the last row of a status is its most general
		}
	}
	return kind
}

// Body is the error body of every surface (the same shape as
// agentapi.Error and apitypes.ErrorResponse).
type Body struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// Status returns err's status and code on the internal surfaces.
func Status(err error) (int, string) { return Internal.Status(err) }

// Write answers err on an internal surface: its status and the error body
// with err's message.
func Write(w http.ResponseWriter, err error) {
	status, code := Status(err)
	WriteCode(w, status, code, err.Error())
}

// WriteCode answers with status and an error body of code and msg.
func WriteCode(w http.ResponseWriter, status int, code, msg string) {
	var b Body
	b.Error.Code, b.Error.Message = code, msg
	out, _ := json.Marshal(b)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(out, '\n'))
}

// MaxBody bounds how much of an error answer FromResponse reads.
const MaxBody = 64 << 10

// Error is an error answer read back: Message is the peer's message (or
// the trimmed body, or the status line, when the body has none) and the
// error matches the sentinel the answer stands for (see Table.Kind).
type Error struct {
	Status int    // HTTP status code
	Code   string // the body's code; empty when the body had none
	// Message is what the peer said.
	Message string
	kind    error
}

func (e *Error) Error() string { return e.Message }
func (e *Error) Unwrap() error { return e.kind }

// FromResponse reads res's error answer (at most MaxBody bytes of its
// body; the caller closes it) as an *Error of the internal table.
func FromResponse(res *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(res.Body, MaxBody))
	return Decode(res.StatusCode, b)
}

// Decode is FromResponse of an answer already read.
func Decode(status int, body []byte) *Error {
	e := &Error{Status: status}
	var b Body
	if json.Unmarshal(body, &b) == nil && (b.Error.Code != "" || b.Error.Message != "") {
		e.Code, e.Message = b.Error.Code, b.Error.Message
	} else {
		e.Message = strings.TrimSpace(string(body))
	}
	if e.Message == "" {
		e.Message = fmt.Sprintf("%d %s", status, http.StatusText(status))
	}
	e.kind = Internal.Kind(status, e.Code)
	return e
}

// Kind returns the sentinel of the internal table that err matches, or
// nil.
func Kind(err error) error {
	if r, ok := Internal.Lookup(err); ok {
		return r.Err
	}
	return nil
}
