// Package client is Airlock's Go SDK: the client of the native API that the
// airlock CLI, `airlock bench` and the end-to-end tests use, importable by
// any Go program (go get github.com/airlock/airlock/client). client.go
// speaks the REST + SSE control plane (/v1), dataplane.go the workers' data
// plane (command attach with stdin, signals and terminal resizes; files).
//
// Every type in its signatures is named here (types.go: aliases of the
// wire types the server encodes, so the two cannot disagree), and so are
// the states, operation kinds and the errors answers match with errors.Is
// (client.ErrNotFound, client.ErrConflict, …): a program outside the
// module needs nothing from internal/, which TestPublicSurfaceNeedsNoInternal
// checks.
//
// A sandbox, a command and a file:
//
//	c := client.New(os.Getenv("AIRLOCK_URL"), os.Getenv("AIRLOCK_API_KEY"))
//	sb, op, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base"}, "")
//	_, err = c.WaitOperation(ctx, op.ID)
//	cmd, err := c.CreateCommand(ctx, sb.ID, client.CreateCommandRequest{Cmd: "echo hi"})
//	exit, err := client.RunCommand(ctx, cmd.AttachURL, cmd.Token, nil, os.Stdout, os.Stderr)
//
// See the package's examples and docs/sdk-go.md.
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/httperr"
	"github.com/airlock/airlock/internal/model"
)

// Request and response shapes, shared with the server.
type (
	CreateSandboxRequest  = apitypes.CreateSandboxRequest
	CreateSandboxResponse = apitypes.CreateSandboxResponse
	CheckpointRef         = apitypes.CheckpointRef
	CreateCommandRequest  = apitypes.CreateCommandRequest
	Command               = apitypes.CommandSession
	FilesSession          = apitypes.FilesSession
	SandboxFilter         = apitypes.SandboxFilter
	SandboxPage           = apitypes.ListSandboxesResponse
	CreateKeyRequest      = apitypes.CreateKeyRequest
	CreateKeyResponse     = apitypes.CreateKeyResponse
	UpdateOrgRequest      = apitypes.UpdateOrgRequest
	Health                = apitypes.Health
	SetPoolRequest        = apitypes.SetPoolRequest
	Pool                  = apitypes.Pool
)

// Client calls one Airlock server. Its fields may be changed before first use.
type Client struct {
	BaseURL string // e.g. "http://127.0.0.1:8080"
	APIKey  string
	// HTTPClient sends requests (default: a client without a timeout, since
	// event streams and long polls are long; contexts bound calls).
	HTTPClient *http.Client
}

// New returns a client of the server at baseURL authenticating with apiKey.
func New(baseURL, apiKey string) *Client {
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), APIKey: apiKey, HTTPClient: &http.Client{}}
}

// APIError is an error response from the server.
type APIError struct {
	Status  int    // HTTP status
	Code    string // e.g. "not_found"
	Message string
	// RetryAfter is the server's Retry-After on 429 and 503 answers.
	RetryAfter time.Duration
}

func (e *APIError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("airlock: HTTP %d %s", e.Status, e.Code)
	}
	return fmt.Sprintf("airlock: %s (HTTP %d %s)", e.Message, e.Status, e.Code)
}

// Is lets errors.Is match model's sentinel errors by status (the /v1
// table, httperr.Public), so callers can write
// errors.Is(err, model.ErrNotFound).
func (e *APIError) Is(target error) bool {
	switch target {
	case model.ErrUnprocessable, model.ErrInvalid:
		// The API answers both 422, and a request it cannot parse 400.
		return e.Status == http.StatusUnprocessableEntity || e.Status == http.StatusBadRequest
	case model.ErrQuotaExceeded:
		return e.Status == http.StatusTooManyRequests && e.Code == httperr.CodeQuotaExceeded
	}
	r, ok := httperr.Public.Lookup(target)
	return ok && r.Err == target && e.Status == r.Status
}

// OperationError is returned by WaitOperation for an operation that ended
// without succeeding.
type OperationError struct {
	Operation model.Operation
}

func (e *OperationError) Error() string {
	op := e.Operation
	msg := fmt.Sprintf("operation %s (%s of %s) %s", op.ID, op.Kind, op.SandboxID, op.State)
	if op.Reason != "" {
		msg += ": " + op.Reason
	}
	return msg
}

func (c *Client) httpClient() *http.Client {
	if c.HTTPClient != nil {
		return c.HTTPClient
	}
	return http.DefaultClient
}

// do sends a request with an optional JSON body and decodes a 2xx JSON
// answer into out (when not nil).
func (c *Client) do(ctx context.Context, method, path string, hdr http.Header, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("airlock: encode %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	if in != nil {
		hdr = hdr.Clone()
		if hdr == nil {
			hdr = http.Header{}
		}
		hdr.Set("Content-Type", "application/json")
	}
	resp, err := c.send(ctx, method, path, hdr, body, "application/json")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("airlock: decode answer of %s %s: %w", method, path, err)
	}
	return nil
}

// send sends a request with the caller's headers, Accept and the API key,
// and returns the response of a 2xx answer, whose body the caller must
// close; any other answer is read into an *APIError.
func (c *Client) send(ctx context.Context, method, path string, hdr http.Header, body io.Reader, accept string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.url(path), body)
	if err != nil {
		return nil, fmt.Errorf("airlock: build %s %s: %w", method, path, err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	return c.sendRequest(req, accept)
}

func (c *Client) url(path string) string { return strings.TrimRight(c.BaseURL, "/") + path }

// sendRequest is send of a request the caller made (its body's length
// set, say).
func (c *Client) sendRequest(req *http.Request, accept string) (*http.Response, error) {
	method, path := req.Method, req.URL.Path
	req.Header.Set("Accept", accept)
	if c.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.APIKey)
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("airlock: %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, readAPIError(resp)
	}
	return resp, nil
}

func readAPIError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	e := &APIError{Status: resp.StatusCode}
	var body apitypes.ErrorResponse
	if json.Unmarshal(b, &body) == nil && body.Error.Code != "" {
		e.Code, e.Message = body.Error.Code, body.Error.Message
	} else {
		e.Code = strings.ToLower(strings.ReplaceAll(http.StatusText(resp.StatusCode), " ", "_"))
		e.Message = strings.TrimSpace(string(b))
	}
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		if n, err := strconv.Atoi(ra); err == nil {
			e.RetryAfter = time.Duration(n) * time.Second
		}
	}
	return e
}

// Health calls GET /healthz. It returns the health body and, when the
// server is not ready, an *APIError with status 503 carrying the reason.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	err := c.do(ctx, http.MethodGet, "/healthz", nil, nil, &h)
	var ae *APIError
	if errors.As(err, &ae) && ae.Status == http.StatusServiceUnavailable {
		_ = json.Unmarshal([]byte(ae.Message), &h)
		ae.Code = apitypes.CodeUnavailable
		if h.Reason != "" {
			ae.Message = h.Reason
		}
	}
	return h, err
}

// CreateSandbox asks for a new sandbox. The answer comes before the sandbox
// runs: wait for the returned operation (WaitOperation). A non-empty
// idempotencyKey makes retries of the same request return the same pair.
func (c *Client) CreateSandbox(ctx context.Context, req CreateSandboxRequest, idempotencyKey string) (model.Sandbox, model.Operation, error) {
	var hdr http.Header
	if idempotencyKey != "" {
		hdr = http.Header{"Idempotency-Key": {idempotencyKey}}
	}
	var out apitypes.CreateSandboxResponse
	if err := c.do(ctx, http.MethodPost, "/v1/sandboxes", hdr, req, &out); err != nil {
		return model.Sandbox{}, model.Operation{}, err
	}
	return out.Sandbox, out.Operation, nil
}

// GetSandbox returns one sandbox.
func (c *Client) GetSandbox(ctx context.Context, id string) (model.Sandbox, error) {
	var sb model.Sandbox
	err := c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id), nil, nil, &sb)
	return sb, err
}

// TrafficToken returns the token a sandbox's ports need through the
// server's sandbox router (header E2b-Traffic-Access-Token); "" for a
// sandbox created with PublicTraffic.
func (c *Client) TrafficToken(ctx context.Context, id string) (string, error) {
	var sb apitypes.SandboxResponse
	err := c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id), nil, nil, &sb)
	return sb.TrafficToken, err
}

// ListSandboxes returns one page of sandboxes; pass page.NextCursor as
// f.Cursor for the next one (empty on the last page).
func (c *Client) ListSandboxes(ctx context.Context, f SandboxFilter) (SandboxPage, error) {
	q := url.Values{}
	for _, st := range f.States {
		q.Add("state", string(st))
	}
	for k, v := range f.Metadata {
		q.Add("metadata", k+"="+v)
	}
	if f.Cursor != "" {
		q.Set("cursor", f.Cursor)
	}
	if f.Limit != 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	path := "/v1/sandboxes"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var page SandboxPage
	err := c.do(ctx, http.MethodGet, path, nil, nil, &page)
	return page, err
}

// DeleteSandbox asks for the sandbox to be deleted and returns the delete
// operation.
func (c *Client) DeleteSandbox(ctx context.Context, id string) (model.Operation, error) {
	var out apitypes.OperationResponse
	err := c.do(ctx, http.MethodDelete, "/v1/sandboxes/"+url.PathEscape(id), nil, nil, &out)
	return out.Operation, err
}

// PauseSandbox asks for a running sandbox to be paused and returns the
// pause operation (see WaitOperation).
func (c *Client) PauseSandbox(ctx context.Context, id string) (model.Operation, error) {
	return c.lifecycle(ctx, id, "pause")
}

// ResumeSandbox asks for a paused sandbox to be resumed.
func (c *Client) ResumeSandbox(ctx context.Context, id string) (model.Operation, error) {
	return c.lifecycle(ctx, id, "resume")
}

// SuspendSandbox asks for a running or paused sandbox to be suspended to a
// snapshot.
func (c *Client) SuspendSandbox(ctx context.Context, id string) (model.Operation, error) {
	return c.lifecycle(ctx, id, "suspend")
}

// WakeSandbox asks for a suspended sandbox to be restored (or a paused one
// resumed).
func (c *Client) WakeSandbox(ctx context.Context, id string) (model.Operation, error) {
	return c.lifecycle(ctx, id, "wake")
}

func (c *Client) lifecycle(ctx context.Context, id, verb string) (model.Operation, error) {
	var out apitypes.OperationResponse
	err := c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/"+verb, nil, struct{}{}, &out)
	return out.Operation, err
}

// GetOperation returns one operation.
func (c *Client) GetOperation(ctx context.Context, id string) (model.Operation, error) {
	var op model.Operation
	err := c.do(ctx, http.MethodGet, "/v1/operations/"+url.PathEscape(id), nil, nil, &op)
	return op, err
}

// WaitOperation long-polls the operation until it is done. It returns the
// operation, and an *OperationError (with the reason) if it failed or was
// cancelled; ctx bounds the wait.
func (c *Client) WaitOperation(ctx context.Context, id string) (model.Operation, error) {
	for {
		var op model.Operation
		err := c.do(ctx, http.MethodGet, "/v1/operations/"+url.PathEscape(id)+"?wait=30s", nil, nil, &op)
		if err != nil {
			var ae *APIError
			if errors.As(err, &ae) && (ae.Status == http.StatusTooManyRequests || ae.Status == http.StatusServiceUnavailable) {
				if werr := sleep(ctx, max(ae.RetryAfter, time.Second)); werr != nil {
					return op, werr
				}
				continue
			}
			return op, err
		}
		if op.State.Done() {
			if op.State != model.OpSucceeded {
				return op, &OperationError{Operation: op}
			}
			return op, nil
		}
		if err := ctx.Err(); err != nil {
			return op, err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// CreateCommand prepares a command in a running sandbox; attach to the
// returned session on the data plane to start it and read its output.
func (c *Client) CreateCommand(ctx context.Context, sandboxID string, req CreateCommandRequest) (Command, error) {
	var cs Command
	err := c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(sandboxID)+"/commands", nil, req, &cs)
	return cs, err
}

// ListCommands lists the processes started in a sandbox, following every
// page (see ListCommandsPage).
func (c *Client) ListCommands(ctx context.Context, sandboxID string) ([]agentapi.ProcessInfo, error) {
	var all []agentapi.ProcessInfo
	cursor := ""
	for {
		page, err := c.ListCommandsPage(ctx, sandboxID, 0, cursor)
		if err != nil {
			return all, err
		}
		all = append(all, page.Commands...)
		if page.NextCursor == "" || page.NextCursor == cursor {
			return all, nil
		}
		cursor = page.NextCursor
	}
}

// ListCommandsPage returns one page of a sandbox's commands: at most limit
// (0: the server's page size) from cursor ("" for the first page); the
// page's NextCursor is "" after the last.
func (c *Client) ListCommandsPage(ctx context.Context, sandboxID string, limit int, cursor string) (apitypes.ListCommandsResponse, error) {
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	path := "/v1/sandboxes/" + url.PathEscape(sandboxID) + "/commands"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out apitypes.ListCommandsResponse
	err := c.do(ctx, http.MethodGet, path, nil, nil, &out)
	return out, err
}

// FilesSession returns the data-plane URL and a token for the sandbox's files.
func (c *Client) FilesSession(ctx context.Context, sandboxID string) (FilesSession, error) {
	var fs FilesSession
	err := c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(sandboxID)+"/files/session", nil, struct{}{}, &fs)
	return fs, err
}

// Files opens a files session on a running sandbox and returns a data-plane
// client for it (see FilesClient).
func (c *Client) Files(ctx context.Context, sandboxID string) (*FilesClient, error) {
	fs, err := c.FilesSession(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	// fs.URL is ".../v1/sandboxes/{id}/files"; FilesClient wants the
	// sandbox's base and appends "/files" itself.
	return &FilesClient{URL: strings.TrimSuffix(fs.URL, "/files"), SandboxID: sandboxID, Token: fs.Token, HTTP: c.HTTPClient}, nil
}

// ListTemplates lists the templates sandboxes can be created from.
func (c *Client) ListTemplates(ctx context.Context) ([]model.Template, error) {
	var out apitypes.ListTemplatesResponse
	err := c.do(ctx, http.MethodGet, "/v1/templates", nil, nil, &out)
	return out.Templates, err
}

// GetTemplate returns one template (ref: name, name:tag or sha256:<hex>)
// with the workers that hold it.
func (c *Client) GetTemplate(ctx context.Context, ref string) (apitypes.Template, error) {
	var out apitypes.Template
	err := c.do(ctx, http.MethodGet, "/v1/templates/"+url.PathEscape(ref), nil, nil, &out)
	return out, err
}

// DeleteTemplate deletes a template (operators only) and returns it with
// the workers that remove it at their next sync; model.ErrConflict, naming
// them, while sandboxes or warm pools use it.
func (c *Client) DeleteTemplate(ctx context.Context, ref string) (apitypes.Template, error) {
	var out apitypes.Template
	err := c.do(ctx, http.MethodDelete, "/v1/templates/"+url.PathEscape(ref), nil, nil, &out)
	return out, err
}

// CreateOrg creates an org (needs an admin key of the default org).
func (c *Client) CreateOrg(ctx context.Context, name string) (model.Org, error) {
	var org model.Org
	err := c.do(ctx, http.MethodPost, "/v1/orgs", nil, apitypes.CreateOrgRequest{Name: name}, &org)
	return org, err
}

// ListOrgs lists the orgs the caller may see.
func (c *Client) ListOrgs(ctx context.Context) ([]model.Org, error) {
	var out apitypes.ListOrgsResponse
	err := c.do(ctx, http.MethodGet, "/v1/orgs", nil, nil, &out)
	return out.Orgs, err
}

// GetOrg returns one org with its quotas and usage.
func (c *Client) GetOrg(ctx context.Context, id string) (apitypes.Org, error) {
	var out apitypes.Org
	err := c.do(ctx, http.MethodGet, "/v1/orgs/"+url.PathEscape(id), nil, nil, &out)
	return out, err
}

// UpdateOrg changes an org's settings (absent fields are kept) and returns
// the org as stored, with its usage.
func (c *Client) UpdateOrg(ctx context.Context, id string, req UpdateOrgRequest) (apitypes.Org, error) {
	var out apitypes.Org
	err := c.do(ctx, http.MethodPatch, "/v1/orgs/"+url.PathEscape(id), nil, req, &out)
	return out, err
}

// ListWorkers returns every registered worker with its state, capacity
// and sandboxes (operators).
func (c *Client) ListWorkers(ctx context.Context) ([]Worker, error) {
	var out apitypes.ListWorkersResponse
	err := c.do(ctx, http.MethodGet, "/v1/workers", nil, nil, &out)
	return out.Workers, err
}

// GetWorker returns one worker (operators).
func (c *Client) GetWorker(ctx context.Context, id string) (Worker, error) {
	var out Worker
	err := c.do(ctx, http.MethodGet, "/v1/workers/"+url.PathEscape(id), nil, nil, &out)
	return out, err
}

// CordonWorker stops (cordoned true) or restarts placing new sandboxes on
// a worker (operators); its sandboxes stay where they are.
func (c *Client) CordonWorker(ctx context.Context, id string, cordoned bool) (Worker, error) {
	verb := "/uncordon"
	if cordoned {
		verb = "/cordon"
	}
	var out Worker
	err := c.do(ctx, http.MethodPost, "/v1/workers/"+url.PathEscape(id)+verb, nil, nil, &out)
	return out, err
}

// DrainWorker cordons a worker and moves its running sandboxes to others
// through the blob store (operators); the drain is over when the worker
// runs nothing (GetWorker).
func (c *Client) DrainWorker(ctx context.Context, id string) (Worker, error) {
	var out Worker
	err := c.do(ctx, http.MethodPost, "/v1/workers/"+url.PathEscape(id)+"/drain", nil, nil, &out)
	return out, err
}

// ListPools returns every warm pool with its member counts (operators).
func (c *Client) ListPools(ctx context.Context) ([]Pool, error) {
	var out apitypes.PoolList
	err := c.do(ctx, http.MethodGet, "/v1/pools", nil, nil, &out)
	return out.Pools, err
}

// SetPool configures the warm pool of template (name, name:tag or digest)
// (operators).
func (c *Client) SetPool(ctx context.Context, template string, req SetPoolRequest) (Pool, error) {
	var out Pool
	err := c.do(ctx, http.MethodPut, "/v1/pools/"+url.PathEscape(template), nil, req, &out)
	return out, err
}

// DeletePool removes the warm pool of template (operators).
func (c *Client) DeletePool(ctx context.Context, template string) error {
	return c.do(ctx, http.MethodDelete, "/v1/pools/"+url.PathEscape(template), nil, nil, nil)
}

// CreateKey creates an API key in an org and returns it with its secret,
// which the server shows only this once.
func (c *Client) CreateKey(ctx context.Context, orgID string, req CreateKeyRequest) (CreateKeyResponse, error) {
	var out CreateKeyResponse
	err := c.do(ctx, http.MethodPost, "/v1/orgs/"+url.PathEscape(orgID)+"/keys", nil, req, &out)
	return out, err
}

// ListKeys lists the keys of an org (revoked and expired ones included),
// without secrets.
func (c *Client) ListKeys(ctx context.Context, orgID string) ([]model.APIKey, error) {
	var out apitypes.ListKeysResponse
	err := c.do(ctx, http.MethodGet, "/v1/orgs/"+url.PathEscape(orgID)+"/keys", nil, nil, &out)
	return out.Keys, err
}

// RevokeKey revokes key keyID of an org at once and returns it.
func (c *Client) RevokeKey(ctx context.Context, orgID, keyID string) (model.APIKey, error) {
	var out model.APIKey
	err := c.do(ctx, http.MethodDelete, "/v1/orgs/"+url.PathEscape(orgID)+"/keys/"+url.PathEscape(keyID), nil, nil, &out)
	return out, err
}

// Events follows the event stream (Server-Sent Events) of one sandbox, or of
// the caller's whole org when sandboxID is empty, starting after sequence
// number after (0: from the beginning). It yields events in order until ctx
// ends or an error occurs; a dropped connection is re-opened from the last
// event received (Last-Event-ID), so no event is skipped or repeated. An
// API error (e.g. 404) is yielded once and ends the sequence.
func (c *Client) Events(ctx context.Context, sandboxID string, after int64) iter.Seq2[model.Event, error] {
	path := "/v1/events"
	if sandboxID != "" {
		path = "/v1/sandboxes/" + url.PathEscape(sandboxID) + "/events"
	}
	return func(yield func(model.Event, error) bool) {
		last := after
		backoff := 100 * time.Millisecond
		for {
			got, err := c.streamOnce(ctx, path, last, func(ev model.Event) bool {
				last = ev.Seq
				return yield(ev, nil)
			})
			if err == errStop || ctx.Err() != nil {
				return
			}
			var ae *APIError
			if errors.As(err, &ae) {
				yield(model.Event{}, err)
				return
			}
			if got {
				backoff = 100 * time.Millisecond
			}
			if sleep(ctx, backoff) != nil {
				return
			}
			backoff = min(2*backoff, 5*time.Second)
		}
	}
}

var errStop = errors.New("stop")

// streamOnce reads one SSE connection, calling fn per event. It reports
// whether any event arrived; errStop means fn asked to stop.
func (c *Client) streamOnce(ctx context.Context, path string, after int64, fn func(model.Event) bool) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(c.BaseURL, "/")+path, nil)
	if err != nil {
		return false, &APIError{Code: apitypes.CodeBadRequest, Message: err.Error()}
	}
	req.Header.Set("Accept", "text/event-stream")
	if c.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.APIKey)
	}
	if after > 0 {
		req.Header.Set("Last-Event-ID", strconv.FormatInt(after, 10))
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, readAPIError(resp)
	}
	got := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var data []byte
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case len(line) == 0: // end of one event
			if len(data) == 0 {
				continue
			}
			var ev model.Event
			err := json.Unmarshal(data, &ev)
			data = data[:0]
			if err != nil {
				return got, fmt.Errorf("airlock: decode event: %w", err)
			}
			got = true
			if !fn(ev) {
				return got, errStop
			}
		case line[0] == ':': // comment (keep-alive)
		default:
			field, value, _ := bytes.Cut(line, []byte(":"))
			value = bytes.TrimPrefix(value, []byte(" "))
			if string(field) == "data" {
				if len(data) > 0 {
					data = append(data, '\n')
				}
				data = append(data, value...)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return got, err
	}
	return got, io.ErrUnexpectedEOF
}

// SandboxNetwork returns a sandbox's egress policy (nil for sandboxes from
// before egress policies).
func (c *Client) SandboxNetwork(ctx context.Context, id string) (*model.SandboxNetwork, error) {
	var out *model.SandboxNetwork
	err := c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id)+"/network", nil, nil, &out)
	return out, err
}

// SetSandboxNetwork replaces a sandbox's egress policy: a profile or an
// inline NetworkPolicyV1.
func (c *Client) SetSandboxNetwork(ctx context.Context, id string, req apitypes.NetworkRequest) (*model.SandboxNetwork, error) {
	var out *model.SandboxNetwork
	err := c.do(ctx, http.MethodPut, "/v1/sandboxes/"+url.PathEscape(id)+"/network", nil, req, &out)
	return out, err
}

// ListNetworkProfiles lists the built-in and the operators' profiles.
func (c *Client) ListNetworkProfiles(ctx context.Context) ([]model.NetworkProfile, error) {
	var out apitypes.NetworkProfilesResponse
	err := c.do(ctx, http.MethodGet, "/v1/network-profiles", nil, nil, &out)
	return out.Profiles, err
}

// PutNetworkProfile creates or replaces an operator profile (operators).
func (c *Client) PutNetworkProfile(ctx context.Context, name string, req apitypes.NetworkProfileRequest) (model.NetworkProfile, error) {
	var out model.NetworkProfile
	err := c.do(ctx, http.MethodPut, "/v1/network-profiles/"+url.PathEscape(name), nil, req, &out)
	return out, err
}

// DeleteNetworkProfile removes an operator profile (operators).
func (c *Client) DeleteNetworkProfile(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/network-profiles/"+url.PathEscape(name), nil, nil, nil)
}

// PutSecret creates or replaces a secret of the key's org (admin keys);
// the value is never returned.
func (c *Client) PutSecret(ctx context.Context, name, value string) (model.Secret, error) {
	var out model.Secret
	err := c.do(ctx, http.MethodPut, "/v1/secrets/"+url.PathEscape(name), nil, apitypes.SecretRequest{Value: value}, &out)
	return out, err
}

// ListSecrets lists the org's secrets: names and times, never values.
func (c *Client) ListSecrets(ctx context.Context) ([]model.Secret, error) {
	var out apitypes.SecretsResponse
	err := c.do(ctx, http.MethodGet, "/v1/secrets", nil, nil, &out)
	return out.Secrets, err
}

// DeleteSecret removes a secret of the org (admin keys).
func (c *Client) DeleteSecret(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/secrets/"+url.PathEscape(name), nil, nil, nil)
}
