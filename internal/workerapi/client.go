package workerapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/airlock/airlock/internal/httperr"
	"github.com/airlock/airlock/internal/model"
)

// Client is a worker's side of the worker API. Its fields may be changed
// before first use.
type Client struct {
	// URL is the server's base URL, e.g. http://127.0.0.1:8080, or several
	// servers' base URLs separated by commas (replicas on one store): a
	// call that cannot reach one, or that a proxy in front of it answers
	// 502, 503 or 504, goes to the next, and the client stays with the one
	// that answered.
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

	current atomic.Int32 // index into URLs of the server that last answered
}

// URLs returns the servers' base URLs, in the order URL lists them.
func (c *Client) URLs() []string {
	var out []string
	for _, u := range strings.Split(c.URL, ",") {
		if u = strings.TrimRight(strings.TrimSpace(u), "/"); u != "" {
			out = append(out, u)
		}
	}
	return out
}

// Current returns the base URL of the server the client uses now.
func (c *Client) Current() string {
	urls := c.URLs()
	if len(urls) == 0 {
		return ""
	}
	return urls[int(c.current.Load())%len(urls)]
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

// unreachable reports a status a proxy (or load balancer) answers for a
// server it cannot reach: try the next server.
func unreachable(status int) bool {
	return status == http.StatusBadGateway || status == http.StatusServiceUnavailable || status == http.StatusGatewayTimeout
}

// call POSTs body as JSON with bearer to the server last used (failing
// over to the others, see Client.URL) and decodes the answer into out.
func (c *Client) call(ctx context.Context, path, bearer string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("encode request: %w", err)
	}
	urls := c.URLs()
	if len(urls) == 0 {
		return fmt.Errorf("call %s: no server URL", path)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	start := int(c.current.Load()) % len(urls)
	var res *http.Response
	var errs []error
	for i := range urls {
		n := (start + i) % len(urls)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, urls[n]+path, bytes.NewReader(b))
		if err != nil {
			return fmt.Errorf("build request: %w", err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+bearer)
		r, err := hc.Do(req)
		if err == nil && !unreachable(r.StatusCode) {
			c.current.Store(int32(n))
			res = r
			break
		}
		if err == nil {
			err = fmt.Errorf("%s answered %s", urls[n], r.Status)
			if i == len(urls)-1 {
				res = r // the last one's answer stands
				break
			}
			io.Copy(io.Discard, io.LimitReader(r.Body, 64<<10))
			r.Body.Close()
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	if res == nil {
		return fmt.Errorf("call %s: %w", path, errors.Join(errs...))
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
