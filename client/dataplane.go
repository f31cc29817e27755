package client

// The data-plane side of the client: attaching to commands over the
// worker's WebSocket and streaming files to and from a sandbox. These calls
// go straight to the worker's data plane with a token the server issued; the
// server never carries the bytes.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/httperr"
	"github.com/airlock/airlock/internal/model"
)

// ErrGone is the data plane's answer (410) to an attach of a command that
// already ran and whose record the sandbox dropped (after many newer
// commands, or a rollback): it is not run again, and RunCommand does not
// retry. It is model.ErrGone, a kind of model.ErrNotFound.
var ErrGone = model.ErrGone

// AttachRetries bounds how many times RunCommand re-attaches in a row
// without receiving anything before it gives up.
const AttachRetries = 5

// CommandSession is one WebSocket attachment to a command. It is bound to
// the context passed to AttachCommand. Next must not be called concurrently
// with itself; the write methods may be called from another goroutine.
type CommandSession struct {
	ctx  context.Context
	conn *websocket.Conn
}

// AttachCommand attaches to the command at attachURL (the attach_url the
// server returned) with its token, receiving output from the combined
// stdout+stderr offset. The first attach starts the command.
func AttachCommand(ctx context.Context, attachURL, token string, offset int64) (*CommandSession, error) {
	u, err := url.Parse(attachURL)
	if err != nil {
		return nil, model.Errorf(model.ErrInvalid, "attach url %q: %v", attachURL, err)
	}
	q := u.Query()
	q.Set("offset", strconv.FormatInt(offset, 10))
	u.RawQuery = q.Encode()
	h := http.Header{}
	h.Set("Authorization", "Bearer "+token)
	conn, res, err := websocket.Dial(ctx, u.String(), &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		if res != nil && res.StatusCode/100 != 1 && res.StatusCode/100 != 2 {
			return nil, fmt.Errorf("attach: %w", dataPlaneResponseError(res))
		}
		return nil, fmt.Errorf("attach: %w", model.Errorf(model.ErrUnavailable, "%v", err))
	}
	conn.SetReadLimit(agentapi.MaxFramePayload + 1)
	return &CommandSession{ctx: ctx, conn: conn}, nil
}

// Next returns the next frame (agentapi.FrameStarted, FrameStdout,
// FrameStderr, FrameExit, FrameError). After FrameExit the worker closes the
// stream and Next returns io.EOF.
func (s *CommandSession) Next() (kind byte, payload []byte, err error) {
	for {
		typ, msg, err := s.conn.Read(s.ctx)
		if err != nil {
			if websocket.CloseStatus(err) == websocket.StatusNormalClosure {
				return 0, nil, io.EOF
			}
			return 0, nil, fmt.Errorf("read command frame: %w", err)
		}
		if typ != websocket.MessageBinary || len(msg) == 0 {
			continue
		}
		return msg[0], msg[1:], nil
	}
}

func (s *CommandSession) send(kind byte, payload []byte) error {
	msg := make([]byte, 1+len(payload))
	msg[0] = kind
	copy(msg[1:], payload)
	return s.conn.Write(s.ctx, websocket.MessageBinary, msg)
}

// WriteStdin sends p to the command's stdin (the command must have been
// created with stdin enabled).
func (s *CommandSession) WriteStdin(p []byte) error {
	for len(p) > 0 {
		n := min(len(p), agentapi.MaxFramePayload)
		if err := s.send(agentapi.FrameStdin, p[:n]); err != nil {
			return fmt.Errorf("write stdin: %w", err)
		}
		p = p[n:]
	}
	return nil
}

// CloseStdin closes the command's stdin after everything written so far.
func (s *CommandSession) CloseStdin() error {
	if err := s.send(agentapi.FrameStdinClose, nil); err != nil {
		return fmt.Errorf("close stdin: %w", err)
	}
	return nil
}

// Signal sends a signal ("TERM", "KILL", "INT", …) to the command.
func (s *CommandSession) Signal(name string) error {
	b, _ := json.Marshal(agentapi.Signal{Signal: name})
	if err := s.send(agentapi.FrameSignal, b); err != nil {
		return fmt.Errorf("signal: %w", err)
	}
	return nil
}

// Resize sets the terminal size of a command created with a PTY.
func (s *CommandSession) Resize(cols, rows int) error {
	b, _ := json.Marshal(PTYSize{Cols: cols, Rows: rows})
	if err := s.send(agentapi.FrameResize, b); err != nil {
		return fmt.Errorf("resize: %w", err)
	}
	return nil
}

// Close detaches; the command keeps running.
func (s *CommandSession) Close() error {
	_ = s.conn.Close(websocket.StatusNormalClosure, "")
	return nil
}

// closeNow drops the connection without a handshake.
func (s *CommandSession) closeNow() { _ = s.conn.CloseNow() }

// RunCommand attaches to a command, copies stdin to it (if not nil; stdin is
// closed at EOF), writes its output to stdout and stderr, and returns its
// exit. A dropped connection is re-attached from the output offset reached,
// so no output is lost or repeated.
func RunCommand(ctx context.Context, attachURL, token string, stdin io.Reader, stdout, stderr io.Writer) (agentapi.Exit, error) {
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var (
		mu      sync.Mutex
		cur     *CommandSession
		curGen  int
		newSess = make(chan struct{}) // closed and replaced when cur changes
	)
	setSession := func(s *CommandSession) {
		mu.Lock()
		cur = s
		curGen++
		close(newSess)
		newSess = make(chan struct{})
		mu.Unlock()
	}
	if stdin != nil {
		go dpPumpStdin(ctx, stdin, func() (*CommandSession, int, chan struct{}) {
			mu.Lock()
			defer mu.Unlock()
			return cur, curGen, newSess
		})
	}

	var offset int64
	failures := 0
	for {
		s, err := AttachCommand(ctx, attachURL, token, offset)
		if err != nil {
			if ctx.Err() != nil || !dpRetryable(err) || failures >= AttachRetries {
				return agentapi.Exit{}, err
			}
			failures++
			if !dpSleep(ctx, time.Duration(failures)*200*time.Millisecond) {
				return agentapi.Exit{}, ctx.Err()
			}
			continue
		}
		setSession(s)
		exit, done, progressed, err := dpPumpOutput(s, &offset, stdout, stderr)
		if done {
			s.Close()
			return exit, err
		}
		s.closeNow()
		if ctx.Err() != nil {
			return agentapi.Exit{}, ctx.Err()
		}
		if progressed {
			failures = 0
		}
		if failures >= AttachRetries {
			return agentapi.Exit{}, fmt.Errorf("command stream lost after %d re-attaches: %w", failures, err)
		}
		failures++
		if !dpSleep(ctx, time.Duration(failures)*100*time.Millisecond) {
			return agentapi.Exit{}, ctx.Err()
		}
	}
}

// dpPumpOutput copies frames until the exit (done), an error frame (done, with
// err) or a broken connection (not done).
func dpPumpOutput(s *CommandSession, offset *int64, stdout, stderr io.Writer) (exit agentapi.Exit, done, progressed bool, err error) {
	for {
		kind, payload, err := s.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("stream closed before the command exited")
			}
			return exit, false, progressed, err
		}
		switch kind {
		case agentapi.FrameStdout, agentapi.FrameStderr:
			w := stdout
			if kind == agentapi.FrameStderr {
				w = stderr
			}
			*offset += int64(len(payload))
			progressed = true
			if _, err := w.Write(payload); err != nil {
				return exit, true, progressed, fmt.Errorf("write command output: %w", err)
			}
		case agentapi.FrameExit:
			if err := json.Unmarshal(payload, &exit); err != nil {
				return exit, true, progressed, fmt.Errorf("decode exit frame: %w", err)
			}
			return exit, true, progressed, nil
		case agentapi.FrameError:
			var e struct {
				Message string `json:"message"`
			}
			_ = json.Unmarshal(payload, &e)
			return exit, true, progressed, fmt.Errorf("command stream: %w", model.Errorf(model.ErrUnavailable, "%s", e.Message))
		}
	}
}

// dpPumpStdin copies stdin into the current session, retrying a chunk on
// the next session when the connection drops.
func dpPumpStdin(ctx context.Context, stdin io.Reader, current func() (*CommandSession, int, chan struct{})) {
	buf := make([]byte, 256<<10)
	send := func(do func(*CommandSession) error) bool {
		lastGen := -1
		for {
			s, gen, next := current()
			if s != nil && gen != lastGen {
				if do(s) == nil {
					return true
				}
				lastGen = gen
			}
			select {
			case <-ctx.Done():
				return false
			case <-next:
			}
		}
	}
	for {
		n, err := stdin.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if !send(func(s *CommandSession) error { return s.WriteStdin(chunk) }) {
				return
			}
		}
		if err != nil {
			send(func(s *CommandSession) error { return s.CloseStdin() })
			return
		}
	}
}

func dpRetryable(err error) bool {
	return errors.Is(err, model.ErrUnavailable) || !(errors.Is(err, model.ErrNotFound) ||
		errors.Is(err, model.ErrUnauthorized) || errors.Is(err, model.ErrForbidden) ||
		errors.Is(err, model.ErrInvalid) || errors.Is(err, model.ErrConflict))
}

func dpSleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// dataPlaneResponseError turns a non-2xx data-plane answer into a model
// error (internal/httperr). An answer that names no sentinel is
// model.ErrUnavailable (a proxy's 502, a worker going away), except a 500,
// which stays an internal error.
func dataPlaneResponseError(res *http.Response) error {
	e := httperr.FromResponse(res)
	kind := httperr.Kind(e)
	switch {
	case kind != nil:
	case res.StatusCode == http.StatusInternalServerError:
		kind = errors.New("internal error")
	default:
		kind = model.ErrUnavailable
	}
	return model.Errorf(kind, "%s", e.Error())
}

// dpSized is a request body of known length.
type dpSized struct {
	io.Reader
	n int64
}

// FilesClient streams files to and from one sandbox over the data plane.
// URL is the worker's data-plane base URL, or the sandbox's
// (".../v1/sandboxes/{id}" or ".../v1/sandboxes/{id}/files", as the server's
// files session returns it); Token is a files-scoped token. With a worker
// base URL, SandboxID names the sandbox; if empty it is read from the token.
type FilesClient struct {
	URL       string
	SandboxID string
	Token     string
	HTTP      *http.Client // nil: http.DefaultClient
}

func (f *FilesClient) endpoint(op string, q url.Values) (string, error) {
	base := strings.TrimSuffix(strings.TrimRight(f.URL, "/"), "/files")
	if !strings.Contains(base, "/v1/sandboxes/") {
		sid := f.SandboxID
		if sid == "" {
			sid = dpSandboxFromToken(f.Token)
		}
		if sid == "" {
			return "", model.Errorf(model.ErrInvalid, "files client: no sandbox id")
		}
		base += "/v1/sandboxes/" + url.PathEscape(sid)
	}
	u := base + "/files" + op
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u, nil
}

// dpSandboxFromToken reads the sandbox id from a data-plane token's claims
// (without verifying it: the worker does that).
func dpSandboxFromToken(tok string) string {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return ""
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return ""
	}
	var c struct {
		SandboxID string `json:"sid"`
	}
	if json.Unmarshal(b, &c) != nil {
		return ""
	}
	return c.SandboxID
}

func (f *FilesClient) do(ctx context.Context, method, op string, q url.Values, body io.Reader, contentType string) (*http.Response, error) {
	u, err := f.endpoint(op, q)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	if sz, ok := body.(dpSized); ok {
		req.ContentLength = sz.n
		if sz.n == 0 {
			req.Body = http.NoBody
		}
	}
	req.Header.Set("Authorization", "Bearer "+f.Token)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	hc := f.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	res, err := hc.Do(req)
	if err != nil {
		return nil, model.Errorf(model.ErrUnavailable, "data plane %s %s: %v", method, op, err)
	}
	if res.StatusCode/100 != 2 {
		defer res.Body.Close()
		return nil, dataPlaneResponseError(res)
	}
	return res, nil
}

func (f *FilesClient) doJSON(ctx context.Context, method, op string, q url.Values, in, out any) error {
	var body io.Reader
	ct := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		body, ct = bytes.NewReader(b), "application/json"
	}
	res, err := f.do(ctx, method, op, q, body, ct)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(res.Body).Decode(out); err != nil {
		return fmt.Errorf("decode answer: %w", err)
	}
	return nil
}

// Read opens the file at path for reading; close the reader when done.
func (f *FilesClient) Read(ctx context.Context, path string) (io.ReadCloser, error) {
	res, err := f.do(ctx, http.MethodGet, "/content", url.Values{"path": {path}}, nil, "")
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return res.Body, nil
}

// Write streams r into the file at path (parents are created; the file is
// replaced atomically). mode ("0644") and owner ("user") may be empty.
func (f *FilesClient) Write(ctx context.Context, path string, r io.Reader, mode, owner string) (agentapi.FileInfo, error) {
	q := url.Values{"path": {path}}
	if mode != "" {
		q.Set("mode", mode)
	}
	if owner != "" {
		q.Set("owner", owner)
	}
	if fl, ok := r.(*os.File); ok {
		// Send a Content-Length for a regular file (net/http only knows
		// the length of in-memory readers).
		if st, err := fl.Stat(); err == nil && st.Mode().IsRegular() {
			if off, err := fl.Seek(0, io.SeekCurrent); err == nil && off <= st.Size() {
				r = dpSized{io.LimitReader(fl, st.Size()-off), st.Size() - off}
			}
		}
	}
	res, err := f.do(ctx, http.MethodPut, "/content", q, r, "application/octet-stream")
	if err != nil {
		return agentapi.FileInfo{}, fmt.Errorf("write %s: %w", path, err)
	}
	defer res.Body.Close()
	var fi agentapi.FileInfo
	if err := json.NewDecoder(res.Body).Decode(&fi); err != nil {
		return fi, fmt.Errorf("write %s: decode answer: %w", path, err)
	}
	return fi, nil
}

// Stat describes path (without following a final symlink).
func (f *FilesClient) Stat(ctx context.Context, path string) (agentapi.FileInfo, error) {
	var fi agentapi.FileInfo
	if err := f.doJSON(ctx, http.MethodGet, "/stat", url.Values{"path": {path}}, nil, &fi); err != nil {
		return fi, fmt.Errorf("stat %s: %w", path, err)
	}
	return fi, nil
}

// List returns the entries of the directory at path, following the data
// plane's pages.
func (f *FilesClient) List(ctx context.Context, path string) ([]agentapi.FileInfo, error) {
	var all []agentapi.FileInfo
	cursor := ""
	for {
		es, next, err := f.ListPage(ctx, path, 0, cursor)
		all = append(all, es...)
		if err != nil {
			return all, err
		}
		if next == "" {
			return all, nil
		}
		if next == cursor {
			return all, fmt.Errorf("list %s: the data plane handed out the same cursor twice", path)
		}
		cursor = next
	}
}

// ListPage returns one page of the entries of the directory at path, sorted
// by name: at most limit (0: the data plane's most, 1000) after cursor ("":
// from the start). next is the cursor of the following page, "" at the end.
func (f *FilesClient) ListPage(ctx context.Context, path string, limit int, cursor string) (entries []agentapi.FileInfo, next string, err error) {
	q := url.Values{"path": {path}}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	var out struct {
		Entries    []agentapi.FileInfo `json:"entries"`
		NextCursor string              `json:"next_cursor"`
	}
	if err := f.doJSON(ctx, http.MethodGet, "/list", q, nil, &out); err != nil {
		return nil, "", fmt.Errorf("list %s: %w", path, err)
	}
	return out.Entries, out.NextCursor, nil
}

// Mkdir creates path and its parents; mode and owner may be empty.
func (f *FilesClient) Mkdir(ctx context.Context, path, mode, owner string) (agentapi.FileInfo, error) {
	var fi agentapi.FileInfo
	in := agentapi.Mkdir{Path: path, Mode: mode, Owner: owner}
	if err := f.doJSON(ctx, http.MethodPost, "/mkdir", nil, in, &fi); err != nil {
		return fi, fmt.Errorf("mkdir %s: %w", path, err)
	}
	return fi, nil
}

// Move renames from to to.
func (f *FilesClient) Move(ctx context.Context, from, to string) (agentapi.FileInfo, error) {
	var fi agentapi.FileInfo
	if err := f.doJSON(ctx, http.MethodPost, "/move", nil, agentapi.Move{From: from, To: to}, &fi); err != nil {
		return fi, fmt.Errorf("move %s to %s: %w", from, to, err)
	}
	return fi, nil
}

// Remove deletes path; a non-empty directory needs recursive.
func (f *FilesClient) Remove(ctx context.Context, path string, recursive bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "1")
	}
	if err := f.doJSON(ctx, http.MethodDelete, "", q, nil, nil); err != nil {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// ListCommands lists the sandbox's commands (running and finished) with a
// files-scoped token, following the data plane's pages.
func (f *FilesClient) ListCommands(ctx context.Context) ([]agentapi.ProcessInfo, error) {
	var all []agentapi.ProcessInfo
	cursor := ""
	for {
		ps, next, err := f.ListCommandsPage(ctx, 0, cursor)
		all = append(all, ps...)
		if err != nil {
			return all, err
		}
		if next == "" {
			return all, nil
		}
		if next == cursor {
			return all, errors.New("list commands: the data plane handed out the same cursor twice")
		}
		cursor = next
	}
}

// ListCommandsPage lists one page of the sandbox's commands in start order:
// at most limit (0: the data plane's most, 1000) after cursor ("": from the
// start). next is the cursor of the following page, "" at the end.
func (f *FilesClient) ListCommandsPage(ctx context.Context, limit int, cursor string) (cmds []agentapi.ProcessInfo, next string, err error) {
	u, err := f.endpoint("", nil)
	if err != nil {
		return nil, "", err
	}
	u = strings.TrimSuffix(u, "/files") + "/commands"
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, "", fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+f.Token)
	hc := f.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	res, err := hc.Do(req)
	if err != nil {
		return nil, "", model.Errorf(model.ErrUnavailable, "list commands: %v", err)
	}
	defer res.Body.Close()
	if res.StatusCode/100 != 2 {
		return nil, "", fmt.Errorf("list commands: %w", dataPlaneResponseError(res))
	}
	var out struct {
		Commands   []agentapi.ProcessInfo `json:"commands"`
		NextCursor string                 `json:"next_cursor"`
	}
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		return nil, "", fmt.Errorf("list commands: decode answer: %w", err)
	}
	return out.Commands, out.NextCursor, nil
}
