package httplimit_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/httplimit"
)

// serve runs l.Server(h) on a loopback port and returns its address.
func serve(t *testing.T, l httplimit.Limits, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := l.Server(h)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitClosed reads from c until the server closes it; a connection still
// open after a minute fails the test (the limit was not applied).
func waitClosed(t *testing.T, c net.Conn, br *bufio.Reader, what string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(time.Minute))
	_, err := io.Copy(io.Discard, br)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: the server still holds the connection after a minute", what)
	}
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })

// TestIdleKeepAliveClosed: one request, then silence on the keep-alive
// connection (the unauthenticated GET /healthz hold): the server closes it.
func TestIdleKeepAliveClosed(t *testing.T) {
	addr := serve(t, httplimit.Limits{IdleTimeout: 100 * time.Millisecond}, ok)
	c := dial(t, addr)
	fmt.Fprint(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Close {
		t.Fatal("the server did not keep the connection alive; nothing tested")
	}
	waitClosed(t, c, br, "idle keep-alive connection")
}

// TestSlowHeadersClosed: headers that never end (slowloris) are cut.
func TestSlowHeadersClosed(t *testing.T) {
	addr := serve(t, httplimit.Limits{ReadHeaderTimeout: 100 * time.Millisecond}, ok)
	c := dial(t, addr)
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
	waitClosed(t, c, bufio.NewReader(c), "connection with unfinished headers")
}

// TestOversizedHeaders: headers beyond MaxHeaderBytes get 431.
func TestOversizedHeaders(t *testing.T) {
	addr := serve(t, httplimit.Control, ok)
	c := dial(t, addr)
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", 100<<10))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("status %d, want 431", resp.StatusCode)
	}
}

// upload reads the whole body and answers its length, or 408 naming the
// stall.
var upload = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	if errors.Is(err, httplimit.ErrBodyStalled) {
		http.Error(w, err.Error(), http.StatusRequestTimeout)
		return
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	fmt.Fprintf(w, "%d", len(b))
})

// TestStalledBodyCut: a body that stops arriving ends the read with
// ErrBodyStalled instead of holding the handler forever.
func TestStalledBodyCut(t *testing.T) {
	addr := serve(t, httplimit.Limits{BodyStallTimeout: 100 * time.Millisecond}, upload)
	c := dial(t, addr)
	fmt.Fprint(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
	c.SetReadDeadline(time.Now().Add(time.Minute))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled upload: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(b), "request body stalled") {
		t.Errorf("got %d %q, want 408 naming the stall", resp.StatusCode, b)
	}
}

// TestSlowUploadNotCut: a body that keeps flowing is read to the end even
// when the whole upload takes longer than the stall timeout.
func TestSlowUploadNotCut(t *testing.T) {
	const stall = 2 * time.Second
	addr := serve(t, httplimit.Limits{BodyStallTimeout: stall}, upload)
	pr, pw := io.Pipe()
	go func() {
		// 30 chunks 100 ms apart: about 3 s in all, longer than the stall
		// timeout, never a 2 s gap.
		for range 30 {
			pw.Write([]byte(strings.Repeat("x", 1000)))
			time.Sleep(100 * time.Millisecond)
		}
		pw.Close()
	}()
	resp, err := http.Post("http://"+addr+"/", "application/octet-stream", pr)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "30000" {
		t.Errorf("got %d %q, want 200 30000", resp.StatusCode, b)
	}
}

// TestStreamAfterBodyNotCut: once the body is read, a handler that goes on
// streaming (a long poll, SSE after a POST) is not bounded by the body's
// deadline: its context stays alive past the stall timeout.
func TestStreamAfterBodyNotCut(t *testing.T) {
	addr := serve(t, httplimit.Limits{BodyStallTimeout: 50 * time.Millisecond}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		time.Sleep(500 * time.Millisecond) // ten stall timeouts
		if err := r.Context().Err(); err != nil {
			http.Error(w, "context ended: "+err.Error(), http.StatusInternalServerError)
			return
		}
		io.WriteString(w, "alive")
	}))
	resp, err := http.Post("http://"+addr+"/", "text/plain", strings.NewReader("hello"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "alive" {
		t.Errorf("got %d %q", resp.StatusCode, b)
	}
}

// TestDaemonLimitsSet: the limits the server and the worker use are all
// bounded.
func TestDaemonLimitsSet(t *testing.T) {
	for name, l := range map[string]httplimit.Limits{"control": httplimit.Control, "data plane": httplimit.DataPlane} {
		s := l.Server(ok)
		if s.ReadHeaderTimeout <= 0 || s.IdleTimeout <= 0 || s.MaxHeaderBytes <= 0 || s.ReadTimeout != 0 || s.WriteTimeout != 0 {
			t.Errorf("%s: %+v", name, s)
		}
	}
}

// TestLongStreamNotCut: a response that streams (SSE, a long poll) for
// many times every limit keeps going, and its context stays alive.
func TestLongStreamNotCut(t *testing.T) {
	const tick = 20 * time.Millisecond
	l := httplimit.Limits{ReadHeaderTimeout: tick, IdleTimeout: tick, BodyStallTimeout: tick}
	addr := serve(t, l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		for i := range 25 { // ~25 limits long
			if r.Context().Err() != nil {
				return
			}
			fmt.Fprintf(w, "%d\n", i)
			rc.Flush()
			time.Sleep(tick)
		}
		io.WriteString(w, "end\n")
	}))
	resp, err := http.Get("http://" + addr + "/v1/events")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.HasSuffix(string(b), "24\nend\n") {
		t.Errorf("stream cut: %q", b)
	}
}
