package workerapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/httperr"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/snapshot"
)

// DataPlane is the server's side of the worker data-plane calls the
// service makes: a page of a sandbox's commands, a checkpoint's export, an
// archive's import and a sandbox's snapshots dropped. Each call goes to the
// worker a Target names, with the token the server signed for that call;
// the worker's routes are the Route* constants above. Its fields may be
// changed before first use; the zero value is ready.
//
// Errors: a worker's error answer is an *Error matching the model sentinel
// it stands for (internal/httperr; none: model.ErrUnavailable); a worker
// that does not answer is model.ErrUnavailable.
type DataPlane struct {
	// HTTP sends the short calls (nil: a client with a 30 s timeout).
	HTTP *http.Client
	// Stream sends archive transfers, bounded only by their context and
	// the body's reader (nil: the transport of HTTP, without a timeout).
	Stream *http.Client
}

// Target is one worker's data plane for one call.
type Target struct {
	Worker string // the worker's id (for messages)
	URL    string // its data-plane base URL, e.g. http://10.0.0.2:7172
	Token  string // the data-plane token authorizing the call (internal/token)
}

// CommandsPage is one page of a sandbox's commands:
//
//	GET /v1/sandboxes/{sid}/commands?limit=&cursor=  → CommandsPage
//
// NextCursor is "" after the last page. A cursor the worker did not hand
// out is model.ErrInvalid.
type CommandsPage struct {
	Commands   []agentapi.ProcessInfo `json:"commands"`
	NextCursor string                 `json:"next_cursor"`
}

// Bounds of the answers read from a worker (the worker is trusted less than
// the server: a sandbox's guest feeds some of what it says).
const (
	MaxCommandsPageBytes = 16 << 20
	MaxManifestBytes     = 4 << 20
)

var defaultDataPlaneHTTP = &http.Client{Timeout: 30 * time.Second}

func (d *DataPlane) http() *http.Client {
	if d.HTTP != nil {
		return d.HTTP
	}
	return defaultDataPlaneHTTP
}

func (d *DataPlane) stream() *http.Client {
	if d.Stream != nil {
		return d.Stream
	}
	return &http.Client{Transport: d.http().Transport}
}

// ListCommands returns one page of sandbox sid's commands: at most limit
// (0: the worker's page size, agentapi.MaxPageEntries) from cursor ("" for
// the first page).
func (d *DataPlane) ListCommands(ctx context.Context, t Target, sid string, limit int, cursor string) (CommandsPage, error) {
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	path := CommandsPath(sid)
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	res, err := d.do(ctx, d.http(), t, http.MethodGet, path, nil, "")
	if err != nil {
		return CommandsPage{}, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, MaxCommandsPageBytes+1))
	if err != nil {
		return CommandsPage{}, model.Errorf(model.ErrUnavailable, "read the command list from worker %s: %v", t.Worker, err)
	}
	if len(body) > MaxCommandsPageBytes {
		return CommandsPage{}, model.Errorf(model.ErrUnavailable, "worker %s sent a command list over %d bytes", t.Worker, MaxCommandsPageBytes)
	}
	var page CommandsPage
	if err := json.Unmarshal(body, &page); err != nil {
		// A worker before pagination answered a bare array.
		if err2 := json.Unmarshal(body, &page.Commands); err2 != nil {
			return CommandsPage{}, model.Errorf(model.ErrUnavailable, "decode the command list from worker %s: %v", t.Worker, err)
		}
	}
	return page, nil
}

// Export streams snapshot snap of sandbox sid as a checkpoint archive
// (application/x-tar); size is its length, -1 if the worker did not say.
// The caller closes the body.
func (d *DataPlane) Export(ctx context.Context, t Target, sid, snap string) (body io.ReadCloser, size int64, err error) {
	res, err := d.do(ctx, d.stream(), t, http.MethodGet, ExportPath(sid, snap), nil, "")
	if err != nil {
		return nil, 0, err
	}
	return res.Body, res.ContentLength, nil
}

// Import streams archive into the worker's snapshot store under sandbox
// sid and returns the manifest the worker committed.
func (d *DataPlane) Import(ctx context.Context, t Target, sid string, archive io.Reader) (snapshot.Manifest, error) {
	res, err := d.do(ctx, d.stream(), t, http.MethodPost, SnapshotsPath(sid), archive, "application/x-tar")
	if err != nil {
		return snapshot.Manifest{}, err
	}
	defer res.Body.Close()
	var m snapshot.Manifest
	if err := json.NewDecoder(io.LimitReader(res.Body, MaxManifestBytes)).Decode(&m); err != nil {
		return snapshot.Manifest{}, model.Errorf(model.ErrUnavailable, "decode the manifest from worker %s: %v", t.Worker, err)
	}
	return m, nil
}

// DropSnapshots deletes whatever the worker holds for sandbox sid.
func (d *DataPlane) DropSnapshots(ctx context.Context, t Target, sid string) error {
	res, err := d.do(ctx, d.http(), t, http.MethodDelete, SnapshotsPath(sid), nil, "")
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	return res.Body.Close()
}

// DropSnapshot deletes snapshot snap (a deleted checkpoint) of sandbox sid.
func (d *DataPlane) DropSnapshot(ctx context.Context, t Target, sid, snap string) error {
	res, err := d.do(ctx, d.http(), t, http.MethodDelete, SnapshotPath(sid, snap), nil, "")
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	return res.Body.Close()
}

// do sends one call and returns a 2xx answer (its body open) or the error
// the answer stands for.
func (d *DataPlane) do(ctx context.Context, hc *http.Client, t Target, method, path string, body io.Reader, contentType string) (*http.Response, error) {
	if t.URL == "" {
		return nil, model.Errorf(model.ErrUnavailable, "worker %s has no data-plane URL", t.Worker)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(t.URL, "/")+path, body)
	if err != nil {
		return nil, fmt.Errorf("request to worker %s: %w", t.Worker, err)
	}
	req.Header.Set("Authorization", "Bearer "+t.Token)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	res, err := hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, model.Errorf(model.ErrUnavailable, "worker %s did not answer %s %s: %v", t.Worker, method, path, err)
	}
	if res.StatusCode/100 == 2 {
		return res, nil
	}
	defer res.Body.Close()
	var he *httperr.Error
	errors.As(httperr.FromResponse(res), &he)
	kind := httperr.Kind(he)
	if kind == nil {
		kind = model.ErrUnavailable
	}
	return nil, &Error{Path: path, Status: res.Status, Message: he.Message, kind: kind, from: "worker " + t.Worker}
}
