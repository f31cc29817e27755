// Package agentclient is the host-side client of airlock-agent: typed calls
// over the agentapi contract, spoken as HTTP/2 without TLS on connections
// the caller supplies (usually runtime.Sandbox.AgentConn).
package agentclient

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/httperr"
	"github.com/airlock/airlock/internal/model"
)

const baseURL = "http://agent"

// ErrGone is the agent's answer (410) for a process it ran and has since
// forgotten: it is not started again. It is model.ErrGone, a kind of
// model.ErrNotFound.
var ErrGone = model.ErrGone

// Client talks to one agent.
type Client struct {
	tr *http.Transport
	hc *http.Client
}

// New returns a client that opens connections with dial; the agent serves
// HTTP/2 (prior knowledge, no TLS) on each.
func New(dial func(ctx context.Context) (net.Conn, error)) *Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{
		Protocols:          &p,
		DialContext:        func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		DisableCompression: true,
		HTTP2: &http.HTTP2Config{
			MaxReadFrameSize:              1 << 20,
			MaxReceiveBufferPerConnection: 64 << 20,
			MaxReceiveBufferPerStream:     16 << 20,
		},
	}
	return &Client{tr: tr, hc: &http.Client{Transport: tr}}
}

// WrapTransport puts wrap around the transport of c's requests (the
// worker's client spans); raw proxied streams keep the bare transport.
func (c *Client) WrapTransport(wrap func(http.RoundTripper) http.RoundTripper) {
	c.hc.Transport = wrap(c.tr)
}

// Close closes idle connections.
func (c *Client) Close() error {
	c.tr.CloseIdleConnections()
	return nil
}

// do sends a request and returns the response if its status is 2xx; any
// other answer becomes an error mapped to a model sentinel.
func (c *Client) do(ctx context.Context, method, path string, q url.Values, body io.Reader, contentLength int64) (*http.Response, error) {
	u := baseURL + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("agent %s %s: %w", method, path, err)
	}
	if contentLength >= 0 && body != nil {
		req.ContentLength = contentLength
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("agent %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	return nil, decodeError(resp)
}

// decodeError reads an agent's error answer through httperr (the agent's
// codes are a subset of the internal table's). An answer that names no
// sentinel (a 500 "internal") stays a plain error.
func decodeError(resp *http.Response) error {
	e := httperr.FromResponse(resp).(*httperr.Error)
	msg := e.Message
	if e.Code == "" {
		msg = fmt.Sprintf("agent answered %s: %s", resp.Status, msg)
	}
	kind := httperr.Kind(e)
	if kind == nil {
		return fmt.Errorf("agent: %s (%s)", msg, resp.Status)
	}
	return model.Errorf(kind, "%s", msg)
}

func (c *Client) getJSON(ctx context.Context, path string, q url.Values, out any) error {
	resp, err := c.do(ctx, http.MethodGet, path, q, nil, -1)
	if err != nil {
		return err
	}
	return decodeBody(resp, out)
}

func (c *Client) postJSON(ctx context.Context, path string, in, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("encode %s request: %w", path, err)
	}
	resp, err := c.do(ctx, http.MethodPost, path, nil, bytes.NewReader(b), int64(len(b)))
	if err != nil {
		return err
	}
	if out == nil {
		resp.Body.Close()
		return nil
	}
	return decodeBody(resp, out)
}

// MaxAnswer bounds a JSON answer of the agent. The guest is not trusted: a
// longer answer is an error, and reading stops at the bound. (Lists come in
// pages of at most agentapi.MaxPageBytes, well below it.)
const MaxAnswer = 16 << 20

func decodeBody(resp *http.Response, out any) error {
	defer resp.Body.Close()
	lr := &io.LimitedReader{R: resp.Body, N: MaxAnswer + 1}
	err := json.NewDecoder(lr).Decode(out)
	if lr.N <= 0 {
		return fmt.Errorf("agent answer to %s exceeds the %d MiB limit of an agent answer; the sandbox's agent is misbehaving",
			resp.Request.URL.Path, MaxAnswer>>20)
	}
	if err != nil {
		return fmt.Errorf("decode agent answer to %s: %w", resp.Request.URL.Path, err)
	}
	return nil
}

// getPage GETs one page of a list: the answer must fit MaxAnswer; next is
// the cursor of the following page ("" at the end).
func (c *Client) getPage(ctx context.Context, path string, q url.Values, out any) (next string, err error) {
	resp, err := c.do(ctx, http.MethodGet, path, q, nil, -1)
	if err != nil {
		return "", err
	}
	next = resp.Header.Get(agentapi.NextCursorHeader)
	return next, decodeBody(resp, out)
}

func pageQuery(q url.Values, limit int, after string) url.Values {
	if q == nil {
		q = url.Values{}
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if after != "" {
		q.Set("after", after)
	}
	return q
}

// Health calls /health.
func (c *Client) Health(ctx context.Context) (agentapi.Health, error) {
	var h agentapi.Health
	err := c.getJSON(ctx, "/health", nil, &h)
	return h, err
}

// readyAttempt bounds how long one Health call of WaitReady waits for its
// answer once it has a connection. A connection on which the agent never
// answers (a VM guest restored from a snapshot whose channel session did
// not come up) would otherwise hold WaitReady until its deadline; it is
// dropped instead and the next attempt dials (and handshakes) afresh. The
// dial itself is not bounded: a booting guest takes as long as it takes.
var readyAttempt = 10 * time.Second

// Ready polling: every readyFastPoll for the first readyFastFor (a gVisor
// agent answers ~0.1 s after its sandbox starts, and a doubling backoff
// would overshoot that by up to half: a create's latency), then with a
// backoff doubling up to readySlowPoll (a QEMU guest under TCG boots for
// seconds). An attempt on a sandbox not yet listening fails at the dial,
// in microseconds.
const (
	readyFastPoll = 2 * time.Millisecond
	readyFastFor  = time.Second
	readySlowPoll = 200 * time.Millisecond
)

// WaitReady polls Health until it answers or ctx ends.
func (c *Client) WaitReady(ctx context.Context) error {
	start := time.Now()
	backoff := readyFastPoll
	for {
		actx, cancel := context.WithCancel(ctx)
		var timer atomic.Pointer[time.Timer]
		var conn atomic.Value // net.Conn
		actx = httptrace.WithClientTrace(actx, &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) {
				conn.Store(info.Conn)
				timer.Store(time.AfterFunc(readyAttempt, cancel))
			},
		})
		_, err := c.Health(actx)
		stuck := actx.Err() != nil && ctx.Err() == nil
		if t := timer.Load(); t != nil {
			t.Stop()
		}
		cancel()
		if err == nil {
			return nil
		}
		if nc, ok := conn.Load().(net.Conn); ok && stuck {
			// Closed, not just released: an HTTP/2 connection whose peer
			// never answers stays in the pool with its reset stream.
			nc.Close()
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("wait for agent: %w (last error: %v)", ctx.Err(), err)
		case <-t.C:
		}
		if time.Since(start) >= readyFastFor {
			backoff = min(backoff*2, readySlowPoll)
		}
	}
}

// StartProcess starts a process. A program that cannot be started still
// returns a ProcessInfo; its output stream ends with an Exit carrying Error.
func (c *Client) StartProcess(ctx context.Context, spec agentapi.ProcessSpec) (agentapi.ProcessInfo, error) {
	var pi agentapi.ProcessInfo
	err := c.postJSON(ctx, "/processes", spec, &pi)
	return pi, err
}

// ListProcessesPage lists one page of the agent's processes in start order,
// at most limit (0: the agent's most, agentapi.MaxPageEntries) after the
// cursor after ("": from the start). next is the cursor of the following
// page, "" at the end.
func (c *Client) ListProcessesPage(ctx context.Context, limit int, after string) (ps []agentapi.ProcessInfo, next string, err error) {
	next, err = c.getPage(ctx, "/processes", pageQuery(nil, limit, after), &ps)
	return ps, next, err
}

// ListProcesses lists every process the agent started, following the pages
// (it holds the whole list: for tests and tools; the data plane passes
// pages on instead).
func (c *Client) ListProcesses(ctx context.Context) ([]agentapi.ProcessInfo, error) {
	var all []agentapi.ProcessInfo
	after := ""
	for {
		ps, next, err := c.ListProcessesPage(ctx, 0, after)
		all = append(all, ps...)
		if err != nil || next == "" {
			return all, err
		}
		if next == after {
			return all, fmt.Errorf("agent handed out the same list cursor %q twice", next)
		}
		after = next
	}
}

// GetProcess describes one process.
func (c *Client) GetProcess(ctx context.Context, id string) (agentapi.ProcessInfo, error) {
	var pi agentapi.ProcessInfo
	err := c.getJSON(ctx, "/processes/"+url.PathEscape(id), nil, &pi)
	return pi, err
}

// OutputStream reads the frames of a process's output.
type OutputStream struct {
	body io.ReadCloser
	r    *bufio.Reader
	done bool
}

// Output opens the output of process id from the combined offset.
func (c *Client) Output(ctx context.Context, id string, offset int64) (*OutputStream, error) {
	q := url.Values{"offset": {strconv.FormatInt(offset, 10)}}
	resp, err := c.do(ctx, http.MethodGet, "/processes/"+url.PathEscape(id)+"/output", q, nil, -1)
	if err != nil {
		return nil, err
	}
	return &OutputStream{body: resp.Body, r: bufio.NewReaderSize(resp.Body, 256<<10)}, nil
}

// Next returns the next frame: agentapi.FrameStdout or FrameStderr with
// bytes, then one FrameExit (JSON agentapi.Exit) or FrameError (JSON
// {"message"}), after which Next returns io.EOF. The payload is the
// caller's to keep.
func (s *OutputStream) Next() (kind byte, payload []byte, err error) {
	if s.done {
		return 0, nil, io.EOF
	}
	kind, payload, err = agentapi.ReadFrame(s.r)
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF // the stream must end with Exit or Error
		}
		return 0, nil, fmt.Errorf("read output frame: %w", err)
	}
	if kind == agentapi.FrameExit || kind == agentapi.FrameError {
		s.done = true
	}
	return kind, payload, nil
}

// Close ends the stream.
func (s *OutputStream) Close() error { return s.body.Close() }

// Stdin streams r to the process's stdin; closeAfter closes stdin when r ends.
func (c *Client) Stdin(ctx context.Context, id string, r io.Reader, closeAfter bool) error {
	var q url.Values
	if closeAfter {
		q = url.Values{"close": {"1"}}
	}
	resp, err := c.do(ctx, http.MethodPost, "/processes/"+url.PathEscape(id)+"/stdin", q, r, -1)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// CloseStdin closes the process's stdin.
func (c *Client) CloseStdin(ctx context.Context, id string) error {
	return c.postJSON(ctx, "/processes/"+url.PathEscape(id)+"/close-stdin", struct{}{}, nil)
}

// Signal sends a signal ("TERM", "KILL", … or a number) to the process group.
func (c *Client) Signal(ctx context.Context, id, signal string) error {
	return c.postJSON(ctx, "/processes/"+url.PathEscape(id)+"/signal", agentapi.Signal{Signal: signal}, nil)
}

// Resize sets the terminal size of a process started with a PTY.
func (c *Client) Resize(ctx context.Context, id string, size agentapi.PTYSize) error {
	return c.postJSON(ctx, "/processes/"+url.PathEscape(id)+"/resize", size, nil)
}

// ReadFile opens a file's content. The FileInfo carries Path, Size and Mode.
func (c *Client) ReadFile(ctx context.Context, path string) (io.ReadCloser, agentapi.FileInfo, error) {
	resp, err := c.do(ctx, http.MethodGet, "/files/content", url.Values{"path": {path}}, nil, -1)
	if err != nil {
		return nil, agentapi.FileInfo{}, err
	}
	info := agentapi.FileInfo{Path: path, Type: "file", Size: resp.ContentLength, Mode: resp.Header.Get("X-Airlock-Mode")}
	return resp.Body, info, nil
}

// WriteFile writes r to path atomically (temp file + rename), creating
// parents. mode is octal ("" = 0644); owner "" = the default user.
func (c *Client) WriteFile(ctx context.Context, path, mode, owner string, r io.Reader) (agentapi.FileInfo, error) {
	q := url.Values{"path": {path}}
	if mode != "" {
		q.Set("mode", mode)
	}
	if owner != "" {
		q.Set("owner", owner)
	}
	if r == nil {
		r = http.NoBody
	}
	resp, err := c.do(ctx, http.MethodPut, "/files/content", q, r, -1)
	if err != nil {
		return agentapi.FileInfo{}, err
	}
	var fi agentapi.FileInfo
	err = decodeBody(resp, &fi)
	return fi, err
}

// Stat describes path (without following a final symlink).
func (c *Client) Stat(ctx context.Context, path string) (agentapi.FileInfo, error) {
	var fi agentapi.FileInfo
	err := c.getJSON(ctx, "/files/stat", url.Values{"path": {path}}, &fi)
	return fi, err
}

// ListPage lists one page of a directory sorted by name: at most limit
// entries (0: agentapi.MaxPageEntries) after the name after. next is the
// cursor of the following page, "" at the end.
func (c *Client) ListPage(ctx context.Context, path string, limit int, after string) (fis []agentapi.FileInfo, next string, err error) {
	next, err = c.getPage(ctx, "/files/list", pageQuery(url.Values{"path": {path}}, limit, after), &fis)
	return fis, next, err
}

// List lists a whole directory, sorted by name, following the pages (it
// holds the whole list: for tests and tools).
func (c *Client) List(ctx context.Context, path string) ([]agentapi.FileInfo, error) {
	var all []agentapi.FileInfo
	after := ""
	for {
		fis, next, err := c.ListPage(ctx, path, 0, after)
		all = append(all, fis...)
		if err != nil || next == "" {
			return all, err
		}
		if next == after {
			return all, fmt.Errorf("agent handed out the same list cursor %q twice", next)
		}
		after = next
	}
}

// Mkdir creates a directory and its parents.
func (c *Client) Mkdir(ctx context.Context, req agentapi.Mkdir) (agentapi.FileInfo, error) {
	var fi agentapi.FileInfo
	err := c.postJSON(ctx, "/files/mkdir", req, &fi)
	return fi, err
}

// Move renames from to to, creating the destination's parents.
func (c *Client) Move(ctx context.Context, from, to string) (agentapi.FileInfo, error) {
	var fi agentapi.FileInfo
	err := c.postJSON(ctx, "/files/move", agentapi.Move{From: from, To: to}, &fi)
	return fi, err
}

// Remove deletes path; recursive removes a directory tree.
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "1")
	}
	resp, err := c.do(ctx, http.MethodDelete, "/files", q, nil, -1)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Do sends req to the agent as is (its URL's path and query are kept; the
// scheme and host are the agent's) and returns the raw response, whatever
// its status. The data plane uses it to forward envd and port traffic. A
// CONNECT request keeps its Host (the authority, "127.0.0.1:<port>"): the
// response body and the request body are then a tunnel to that port.
func (c *Client) Do(req *http.Request) (*http.Response, error) {
	out := req.Clone(req.Context())
	u := *req.URL
	u.Scheme, u.Host = "http", "agent"
	out.URL = &u
	if req.Method != http.MethodConnect || out.Host == "" {
		out.Host = "agent"
	}
	out.RequestURI = ""
	resp, err := c.tr.RoundTrip(out)
	if err != nil {
		return nil, fmt.Errorf("agent %s %s: %w", req.Method, req.URL.Path, err)
	}
	return resp, nil
}
