package workerapi

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/airlock/airlock/internal/model"
)

// The network log: every egress decision of the worker's gateway about a
// sandbox, kept in memory by the worker (the last model.NetLogSize per
// sandbox) while it holds the sandbox, served on its data plane (scope
// files, like the command list) and asked for by the server's GET
// /v1/sandboxes/{id}/network/log:
//
//	GET /v1/sandboxes/{sid}/network/log?after=SEQ&limit=N  → NetLogPage
//
// Denials also go up in each Sync (SyncRequest.NetDenied, at most
// MaxNetDenials), which the server publishes as network.denied events.

// RouteNetworkLog is the data plane's network log route.
const RouteNetworkLog = "GET " + DataPlaneSandbox + "/network/log"

// NetworkLogPath is the data-plane path of sandbox sid's network log.
func NetworkLogPath(sid string) string { return SandboxPath(sid, "/network/log") }

// MaxNetLogPage is the most entries one NetLogPage carries (and the
// default limit).
const MaxNetLogPage = model.NetLogSize

// MaxNetDenials bounds SyncRequest.NetDenied: a worker sends at most this
// many per Sync (the rest wait for the next), and the server reads no more.
const MaxNetDenials = 64

// MaxNetLogPageBytes bounds a NetLogPage as the server reads it.
const MaxNetLogPageBytes = 4 << 20

// NetLogPage is a page of a sandbox's network log: the entries with Seq
// after the request's after, oldest first.
type NetLogPage struct {
	Entries []model.NetDecision `json:"entries"`
	// Next is the after of the following request: the last entry's Seq,
	// or the request's after when there is none.
	Next int64 `json:"next"`
	// Missed counts entries after the request's after that the log no
	// longer holds (it keeps the last model.NetLogSize).
	Missed int64 `json:"missed,omitempty"`
	// Reset says the request's after is past the log's end: the log began
	// again (its worker restarted, or the sandbox moved to another
	// worker), and Entries start at its beginning.
	Reset bool `json:"reset,omitempty"`
	// Note explains an empty log (no egress on the worker, the sandbox on
	// no worker, …).
	Note string `json:"note,omitempty"`
}

// NetDenial is one denial carried up in a Sync for the server to publish.
type NetDenial struct {
	SandboxID string `json:"sandbox_id"`
	model.NetDenial
}

// NetworkLog reads one page of sandbox sid's network log: at most limit
// entries (0: MaxNetLogPage) with Seq after after.
func (d *DataPlane) NetworkLog(ctx context.Context, t Target, sid string, after int64, limit int) (NetLogPage, error) {
	q := url.Values{}
	if after > 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	path := NetworkLogPath(sid)
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	res, err := d.do(ctx, d.http(), t, http.MethodGet, path, nil, "")
	if err != nil {
		return NetLogPage{}, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, MaxNetLogPageBytes+1))
	if err != nil {
		return NetLogPage{}, model.Errorf(model.ErrUnavailable, "read the network log from worker %s: %v", t.Worker, err)
	}
	if len(body) > MaxNetLogPageBytes {
		return NetLogPage{}, model.Errorf(model.ErrUnavailable, "worker %s sent a network log page over %d bytes", t.Worker, MaxNetLogPageBytes)
	}
	var page NetLogPage
	if err := json.Unmarshal(body, &page); err != nil {
		return NetLogPage{}, model.Errorf(model.ErrUnavailable, "decode the network log from worker %s: %v", t.Worker, err)
	}
	if page.Entries == nil {
		page.Entries = []model.NetDecision{}
	}
	return page, nil
}
