package workerapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/httperr"
	"github.com/airlock/airlock/internal/model"
)

// Client is a worker's side of the worker API. Its fields may be changed
// before first use.
type Client struct {
	// URL is the server's base URL, e.g. http://127.0.0.1:8080.
	URL string
	// HTTP sends the requests (default http.DefaultClient); Sync's long
	// poll needs it without a short timeout.
	HTTP *http.Client
	// JoinToken is the server's --worker-token, presented by Register (and
	// by Sync and Wake while Secret returns "").
	JoinToken string
	// Secret returns the worker's own credential from its first
	// registration, or "" (nil: none).
	Secret func() string
}

// Error is an error answer of the server (Client) or of a worker
// (DataPlane). It matches the model sentinel the answer stands for
// (internal/httperr); an answer that names none (a 500, a proxy's 502) is
// model.ErrUnavailable: the other side failed, retry.
type Error struct {
	Path    string // the call's path
	Status  string // the HTTP status line, e.g. "409 Conflict"
	Message string // the answer's message
	kind    error
	from    string // who answered ("": the server)
}

func (e *Error) Error() string {
	from := e.from
	if from == "" {
		from = "server"
	}
	return "call " + e.Path + ": " + from + " answered " + e.Status + ": " + e.Message
}

// Unwrap returns the sentinel the answer stands for.
func (e *Error) Unwrap() error { return e.kind }

// Register announces the worker with the join token (and req.Secret, once
// it has one).
func (c *Client) Register(ctx context.Context, req RegisterRequest) (RegisterResponse, error) {
	var resp RegisterResponse
	err := c.call(ctx, PathRegister, c.JoinToken, req, &resp)
	return resp, err
}

// Sync reports the worker's observations and long-polls (up to wait) for
// assignments that differ from version.
func (c *Client) Sync(ctx context.Context, id string, req SyncRequest, wait time.Duration, version int64) (SyncResponse, error) {
	q := url.Values{"wait": {wait.String()}, "version": {fmt.Sprint(version)}}
	var resp SyncResponse
	err := c.call(ctx, SyncPath(id)+"?"+q.Encode(), c.credential(), req, &resp)
	return resp, err
}

// Wake asks the server to wake (or resume) a sandbox a data-plane request
// arrived for; model.ErrConflict when it will not (see WakeRequest).
func (c *Client) Wake(ctx context.Context, id string, req WakeRequest) (model.Operation, error) {
	var resp WakeResponse
	err := c.call(ctx, WakePath(id), c.credential(), req, &resp)
	return resp.Operation, err
}

// credential is what Sync and Wake present: the worker's own secret, or
// the join token before it has one.
func (c *Client) credential() string {
	if c.Secret != nil {
		if s := c.Secret(); s != "" {
			return s
		}
	}
	return c.JoinToken
}

// call POSTs body as JSON with bearer and decodes the answer into out.
func (c *Client) call(ctx context.Context, path, bearer string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("encode request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.URL, "/")+path, bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+bearer)
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	res, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("call %s: %w", path, err)
	}
	defer res.Body.Close()
	if res.StatusCode/100 != 2 {
		var he *httperr.Error
		errors.As(httperr.FromResponse(res), &he)
		kind := httperr.Kind(he)
		if kind == nil {
			kind = model.ErrUnavailable
		}
		return &Error{Path: path, Status: res.Status, Message: he.Message, kind: kind}
	}
	if err := json.NewDecoder(res.Body).Decode(out); err != nil {
		return fmt.Errorf("decode answer of %s: %w", path, err)
	}
	return nil
}
