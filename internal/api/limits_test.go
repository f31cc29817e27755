package api_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/api"
	"github.com/airlock/airlock/internal/httplimit"
)

// TestStalledBodyIsBadRequest sends a create whose body stops after a few
// bytes to the API behind the daemon's server limits (a short stall limit
// set here): the answer is 400 naming the stall, not a handler held forever.
func TestStalledBodyIsBadRequest(t *testing.T) {
	e := newSSEEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := httplimit.Control
	l.BodyStallTimeout = 100 * time.Millisecond
	srv := l.Server(api.New(e.svc, api.Options{}))
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"template\":", e.key)
	c.SetReadDeadline(time.Now().Add(time.Minute))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "request body stalled") {
		t.Errorf("got %d %s; want 400 naming the stall", resp.StatusCode, b)
	}
	t.Logf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
}
