package agentclient_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/agentclient"
)

// serveHealth serves an agent's /health as HTTP/2 without TLS on a unix
// socket until the test ends, and returns the socket's path.
func serveHealth(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Protocols: &p, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"pid":1}`)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// TestWaitReadyDropsAStuckConnection: the first connection leads nowhere
// (bytes are read and never answered, as on a restored VM whose channel
// session did not come up); WaitReady must give up on it after one attempt
// and succeed on a fresh connection, well before its own deadline.
func TestWaitReadyDropsAStuckConnection(t *testing.T) {
	defer agentclient.SetReadyAttempt(300 * time.Millisecond)()
	sock := serveHealth(t)

	var dials atomic.Int32
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) {
		if dials.Add(1) == 1 {
			a, b := net.Pipe()
			go io.Copy(io.Discard, b) // swallows the client's frames, answers nothing
			return a, nil
		}
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatalf("WaitReady: %v (after %d dials)", err, dials.Load())
	}
	if n := dials.Load(); n < 2 {
		t.Errorf("dials = %d; want the stuck connection replaced", n)
	}
	t.Logf("ready after %v and %d dials", time.Since(t0), dials.Load())
}

// TestWaitReadySlowDial: a dial that takes longer than an attempt's bound
// (a guest still booting) is waited for, not abandoned.
func TestWaitReadySlowDial(t *testing.T) {
	defer agentclient.SetReadyAttempt(200 * time.Millisecond)()
	sock := serveHealth(t)
	var dials atomic.Int32
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) {
		dials.Add(1)
		time.Sleep(time.Second)
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatalf("WaitReady: %v", err)
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("dials = %d; want the one slow dial", n)
	}
}
