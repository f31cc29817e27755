package agentclient_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/agentclient"
)

// rogueAgent serves h (HTTP/2 without TLS, like the agent) on connections
// the returned client dials: a guest that replaced the agent.
func rogueAgent(t *testing.T, h http.Handler) *agentclient.Client {
	t.Helper()
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: h, Protocols: &p}
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) {
		a, b := net.Pipe()
		go srv.Serve(&oneConn{c: b, done: make(chan struct{})})
		return a, nil
	})
	t.Cleanup(func() { c.Close(); srv.Close() })
	return c
}

// oneConn is a listener that accepts one connection.
type oneConn struct {
	c    net.Conn
	used atomic.Bool
	done chan struct{}
}

func (l *oneConn) Accept() (net.Conn, error) {
	if l.used.CompareAndSwap(false, true) {
		return l.c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}
func (l *oneConn) Close() error {
	if l.used.Load() {
		select {
		case <-l.done:
		default:
			close(l.done)
		}
	}
	return nil
}
func (l *oneConn) Addr() net.Addr { return &net.UnixAddr{Name: "rogue", Net: "unix"} }

// TestRogueAgentAnswerBounded: an agent (guest root can be one) answers a
// process list with 100 MiB of JSON. The client gives up at its 16 MiB
// bound with an error naming it, having read little more than that; the
// old client decoded all of it.
func TestRogueAgentAnswerBounded(t *testing.T) {
	var written atomic.Int64
	entry := fmt.Sprintf(`{"id":"x","pid":1,"argv":[%q],"running":true,"started_at":"2026-01-01T00:00:00Z","output_bytes":0}`, strings.Repeat("A", 64<<10))
	c := rogueAgent(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if _, err := w.Write([]byte("[")); err != nil {
			return
		}
		for i := 0; written.Load() < 100<<20; i++ {
			s := entry
			if i > 0 {
				s = "," + entry
			}
			n, err := w.Write([]byte(s))
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
		_, _ = w.Write([]byte("]"))
	}))
	ctx := testCtx(t)
	ps, err := c.ListProcesses(ctx)
	if err == nil || !strings.Contains(err.Error(), "16 MiB") {
		t.Fatalf("list of a 100 MiB answer: %d entries, err %v; want an error naming the 16 MiB limit", len(ps), err)
	}
	// Read at most the bound plus what HTTP/2 flow control lets the rogue
	// buffer (16 MiB per stream).
	if n := written.Load(); n >= 100<<20 {
		t.Fatalf("the rogue agent got all %d bytes out", n)
	}
	t.Logf("error: %v; the rogue agent wrote %d MiB", err, written.Load()>>20)
}

// TestProcessListPaged: 400 running processes with 64 KiB of argv each
// (25 MiB of answer in one piece on the old agent) are listed in pages of
// at most agentapi.MaxPageBytes, each process once, in start order.
func TestProcessListPaged(t *testing.T) {
	h := startAgent(t)
	ctx := testCtx(t)
	arg := strings.Repeat("B", 16<<10)
	const n = 400
	var ids []string
	t.Cleanup(func() {
		for _, id := range ids {
			_ = h.client.Signal(context.Background(), id, "KILL")
		}
	})
	for i := range n {
		id := fmt.Sprintf("long-%03d", i)
		if _, err := h.client.StartProcess(ctx, agentapi.ProcessSpec{ID: id, User: "root", Cwd: "/",
			Argv: []string{"sh", "-c", "exec sleep 1000", arg, arg, arg, arg}}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	var got []string
	pages := 0
	after := ""
	for {
		ps, next, err := h.client.ListProcessesPage(ctx, 0, after)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(ps) == n {
			t.Fatalf("one page holds all %d processes", n)
		}
		size := 0
		for _, p := range ps {
			size += len(p.ID) + 4*len(arg) + 100
			got = append(got, p.ID)
		}
		if size > agentapi.MaxPageBytes+len(arg)*4+1024 {
			t.Fatalf("page %d holds about %d bytes, more than %d", pages, size, agentapi.MaxPageBytes)
		}
		if next == "" {
			break
		}
		after = next
	}
	if strings.Join(got, ",") != strings.Join(ids, ",") {
		t.Fatalf("pages listed %d processes (%v…), want the %d started, each once in start order", len(got), got[:min(5, len(got))], n)
	}
	// A small limit is honoured.
	ps, next, err := h.client.ListProcessesPage(ctx, 7, "")
	if err != nil || len(ps) != 7 || next == "" {
		t.Fatalf("limit 7: %d entries, next %q, %v", len(ps), next, err)
	}
	t.Logf("%d processes in %d pages", n, pages)
}

// TestDirListPaged: a directory of 5000 files with 200-byte names is
// listed in pages of at most agentapi.MaxPageEntries, each name once,
// sorted.
func TestDirListPaged(t *testing.T) {
	h := startAgent(t)
	ctx := testCtx(t)
	dir := filepath.Join(h.dir, "many")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const n = 5000
	var want []string
	for i := range n {
		name := fmt.Sprintf("%04d-%s", i, strings.Repeat("n", 195))
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		want = append(want, name)
	}
	var got []string
	after := ""
	pages := 0
	for {
		es, next, err := h.client.ListPage(ctx, dir, 0, after)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(es) > agentapi.MaxPageEntries {
			t.Fatalf("page %d holds %d entries, more than %d", pages, len(es), agentapi.MaxPageEntries)
		}
		for _, e := range es {
			got = append(got, e.Name)
		}
		if next == "" {
			break
		}
		after = next
	}
	if strings.Join(got, "/") != strings.Join(want, "/") {
		t.Fatalf("pages listed %d names, want the %d, each once and sorted", len(got), n)
	}
	all, err := h.client.List(ctx, dir)
	if err != nil || len(all) != n {
		t.Fatalf("List: %d entries, %v", len(all), err)
	}
	t.Logf("%d entries in %d pages", n, pages)
}
