package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/api"
	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/store"
	"github.com/airlock/airlock/internal/store/pgtest"
	"github.com/airlock/airlock/internal/store/postgres"
	"github.com/airlock/airlock/internal/store/sqlite"
)

// countingStore is the real SQLite store, counting event reads.
type countingStore struct {
	store.Store
	lists atomic.Int64
}

func (c *countingStore) ListEvents(ctx context.Context, orgID, sandboxID string, after int64, limit int) ([]model.Event, error) {
	c.lists.Add(1)
	return c.Store.ListEvents(ctx, orgID, sandboxID, after, limit)
}

// sseEnv is the real handler over a real SQLite store (wrapped to count
// event reads), with the default stream cap.
type sseEnv struct {
	st   *countingStore
	ev   *events.Log
	svc  *service.Service
	srv  *httptest.Server
	key  string // admin key of the default org
	ctx  context.Context
	stop context.CancelFunc
	// padding goes into every appended event's reason (bulk, so that a
	// stream that does not read fills its connection's buffers).
	padding string
}

func newSSEEnv(t *testing.T) *sseEnv { return newSSEEnvOn(t, "sqlite") }

// backends are the stores the fan-out tests run over.
var backends = []string{"sqlite", "postgres"}

// newSSEEnvOn is newSSEEnv over backend "sqlite" or "postgres" (a private
// PostgreSQL from pgtest; skipped when there is none).
func newSSEEnvOn(t *testing.T, backend string) *sseEnv {
	t.Helper()
	ctx, stop := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(stop)
	var st store.Store
	var err error
	switch backend {
	case "postgres":
		st, err = postgres.Open(ctx, pgtest.URL(t))
	default:
		st, err = sqlite.Open(ctx, filepath.Join(t.TempDir(), "airlock.db"))
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &sseEnv{st: &countingStore{Store: st}, ctx: ctx, stop: stop}
	e.ev = events.New(e.st)
	e.svc = service.New(service.Config{Store: e.st, Events: e.ev, Kick: func() {}, RateLimit: -1})
	if e.key, _, err = e.svc.Bootstrap(ctx); err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(api.New(e.svc, api.Options{KeepAlive: time.Hour}))
	t.Cleanup(e.srv.Close)
	t.Cleanup(stop) // end the streams before the server closes
	return e
}

// newKey mints another admin key of the default org.
func (e *sseEnv) newKey(t *testing.T) string {
	t.Helper()
	_, secret, err := e.svc.CreateKey(e.ctx, service.Principal{OrgID: service.DefaultOrgID, Admin: true}, service.DefaultOrgID, "k", true)
	if err != nil {
		t.Fatal(err)
	}
	return secret
}

// open starts an event stream (path "" is /v1/events) and returns the
// answer; the body stays open until the test ends.
func (e *sseEnv) open(t *testing.T, key, path string, after int64) *http.Response {
	t.Helper()
	if path == "" {
		path = "/v1/events"
	}
	req, _ := http.NewRequestWithContext(e.ctx, "GET", e.srv.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	if after > 0 {
		req.Header.Set("Last-Event-ID", strconv.FormatInt(after, 10))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// append writes an event of sandbox sid through the service's event log.
func (e *sseEnv) append(t testing.TB, sid string) { e.appendState(t, sid, model.StateRunning) }

func (e *sseEnv) appendState(t testing.TB, sid string, st model.SandboxState) {
	if err := e.ev.Sandbox(e.ctx, model.Sandbox{ID: sid, OrgID: service.DefaultOrgID, State: st, Reason: e.padding}); err != nil {
		t.Error(err)
	}
}

// sseReader yields the ids of a stream's events.
type sseReader struct{ br *bufio.Reader }

func (r sseReader) next() (int64, error) {
	id, _, err := r.event()
	return id, err
}

// event returns the next event's id and the state of the sandbox it carries.
func (r sseReader) event() (int64, model.SandboxState, error) {
	var id int64
	for {
		line, err := r.br.ReadString('\n')
		if err != nil {
			return 0, "", err
		}
		if v, ok := strings.CutPrefix(line, "id: "); ok {
			if id, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64); err != nil {
				return 0, "", err
			}
		}
		if v, ok := strings.CutPrefix(line, "data: "); ok {
			var ev model.Event
			var sb model.Sandbox
			if err := json.Unmarshal([]byte(v), &ev); err != nil {
				return 0, "", err
			}
			json.Unmarshal(ev.Data, &sb)
			return id, sb.State, nil
		}
	}
}

// TestEventStreamsPerKeyCapped opens more streams with one key than the cap:
// the one too many gets 429 naming the limit; another key is unaffected,
// and closing a stream frees its place.
func TestEventStreamsPerKeyCapped(t *testing.T) {
	e := newSSEEnv(t)
	var open []*http.Response
	for i := range api.DefaultMaxStreamsPerKey {
		resp := e.open(t, e.key, "", 0)
		if resp.StatusCode != 200 {
			t.Fatalf("stream %d: %d", i, resp.StatusCode)
		}
		// Read the opening comment: the stream is being served (counted).
		if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		open = append(open, resp)
	}
	resp := e.open(t, e.key, "", 0)
	b, _ := io.ReadAll(resp.Body)
	var body apitypes.ErrorResponse
	json.Unmarshal(b, &body)
	if resp.StatusCode != http.StatusTooManyRequests || body.Error.Code != apitypes.CodeRateLimited ||
		!strings.Contains(body.Error.Message, fmt.Sprintf("%d event streams open", api.DefaultMaxStreamsPerKey)) {
		t.Fatalf("stream %d: %d %s; want 429 naming the limit", api.DefaultMaxStreamsPerKey+1, resp.StatusCode, b)
	}
	t.Logf("429: %s", body.Error.Message)
	if r := e.open(t, e.newKey(t), "", 0); r.StatusCode != 200 {
		t.Errorf("another key's stream: %d", r.StatusCode)
	}
	// Close one: the server notices the client gone and frees the place.
	open[0].Body.Close()
	for {
		r := e.open(t, e.key, "", 0)
		if r.StatusCode == 200 {
			break
		}
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
		if e.ctx.Err() != nil {
			t.Fatal("a closed stream's place was never freed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestEventFanOutOneQueryPerEvent: with N streams open, one event costs
// the store O(1) event reads (the fan-out's), not one per stream.
func TestEventFanOutOneQueryPerEvent(t *testing.T) {
	for _, b := range backends {
		t.Run(b, func(t *testing.T) { testFanOutOneQueryPerEvent(t, b) })
	}
}

func testFanOutOneQueryPerEvent(t *testing.T, backend string) {
	const n = 30
	e := newSSEEnvOn(t, backend)
	var readers []sseReader
	for range n {
		resp := e.open(t, e.key, "", 0)
		if resp.StatusCode != 200 {
			t.Fatalf("stream: %d", resp.StatusCode)
		}
		readers = append(readers, sseReader{bufio.NewReader(resp.Body)})
	}
	// Each stream has caught up and follows once it has seen a first event.
	e.append(t, "sb-warm")
	for _, r := range readers {
		if _, err := r.next(); err != nil {
			t.Fatal(err)
		}
	}
	before := e.st.lists.Load()
	e.append(t, "sb-one")
	for _, r := range readers {
		if _, err := r.next(); err != nil {
			t.Fatal(err)
		}
	}
	reads := e.st.lists.Load() - before
	t.Logf("one event to %d streams: %d store reads of events", n, reads)
	if reads > 2 {
		t.Errorf("one event to %d streams cost %d store reads; want O(1), not one per stream", n, reads)
	}
}

// TestEventStreamsLoseNothing: streams of the org and of single sandboxes,
// two opened mid-way from the start of the log, and every stream reading
// only once the writers are done (so they fall behind the fan-out and catch
// up from the store), all receive every matching event exactly once and in
// order while several writers append at once.
func TestEventStreamsLoseNothing(t *testing.T) {
	for _, b := range backends {
		t.Run(b, func(t *testing.T) { testStreamsLoseNothing(t, b) })
	}
}

func testStreamsLoseNothing(t *testing.T, backend string) {
	const writers, perWriter = 4, 400
	e := newSSEEnvOn(t, backend)
	e.padding = strings.Repeat("p", 8<<10) // 1600 events: ~13 MiB per stream
	if err := e.st.PutTemplate(e.ctx, model.Template{Name: "base", Tag: "latest", Digest: baseDigest, SizeBytes: 1, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	c := client.New(e.srv.URL, e.key)
	var sids []string
	for range 2 {
		sb, _, err := c.CreateSandbox(e.ctx, client.CreateSandboxRequest{}, "")
		if err != nil {
			t.Fatal(err)
		}
		sids = append(sids, sb.ID)
	}
	sids = append(sids, "sb-x", "sb-y") // events of sandboxes the streams do not filter on

	type stream struct {
		name, sid string
		r         sseReader
		slow      bool
		got       []int64
	}
	var streams []*stream
	add := func(name, sid string, slow bool) {
		path := "/v1/events"
		if sid != "" {
			path = "/v1/sandboxes/" + sid + "/events"
		}
		resp := e.open(t, e.key, path, 0)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", name, resp.StatusCode)
		}
		streams = append(streams, &stream{name: name, sid: sid, r: sseReader{bufio.NewReader(resp.Body)}, slow: slow})
	}
	add("org stream", "", false)
	add("org stream, slow", "", true)
	add("org stream 2", "", false)
	add("sandbox stream a", sids[0], false)
	add("sandbox stream b, slow", sids[1], true)

	// Readers: the slow ones start only when the writers are done (they
	// may fall behind the fan-out and catch up from the store). Each reads
	// up to the end markers: a "deleted" event of sids[0] and one of
	// sids[1], appended after every writer is done.
	var rg sync.WaitGroup
	read := func(s *stream, start <-chan struct{}) {
		rg.Add(1)
		go func() {
			defer rg.Done()
			<-start
			markers := 2 // the org stream carries both
			if s.sid != "" {
				markers = 1
			}
			for markers > 0 {
				id, st, err := s.r.event()
				if err != nil {
					t.Errorf("%s: after %d events: %v", s.name, len(s.got), err)
					return
				}
				s.got = append(s.got, id)
				if st == model.StateDeleted {
					markers--
				}
			}
		}()
	}
	now, done := make(chan struct{}), make(chan struct{})
	close(now)
	for _, s := range streams {
		if s.slow {
			read(s, done)
		} else {
			read(s, now)
		}
	}

	total := writers * perWriter
	var wg sync.WaitGroup
	var written atomic.Int64
	midway := make(chan struct{})
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				e.append(t, sids[(w+i)%len(sids)])
				if written.Add(1) == int64(total/2) {
					close(midway)
				}
			}
		}()
	}
	<-midway
	add("mid-way org stream (from the start)", "", false)
	read(streams[len(streams)-1], now)
	add("mid-way sandbox stream (from the start)", sids[0], true)
	read(streams[len(streams)-1], done)
	wg.Wait()
	e.appendState(t, sids[0], model.StateDeleted)
	e.appendState(t, sids[1], model.StateDeleted)
	close(done)
	rg.Wait()

	want := map[string][]int64{}
	for _, sid := range append([]string{""}, sids[:2]...) {
		evs, err := e.st.Store.ListEvents(e.ctx, service.DefaultOrgID, sid, 0, 2*total)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			want[sid] = append(want[sid], ev.Seq)
		}
	}
	if len(want[""]) < total {
		t.Fatalf("stored %d events, want at least %d", len(want[""]), total)
	}
	for _, s := range streams {
		if !slices.Equal(s.got, want[s.sid]) {
			t.Errorf("%s: got %d events, want %d in order (first difference at %d)", s.name, len(s.got), len(want[s.sid]), firstDiff(s.got, want[s.sid]))
		}
	}
	t.Logf("%d streams, %d events by %d writers: %d store reads of events", len(streams), total, writers, e.st.lists.Load())
}

func firstDiff(a, b []int64) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
