package events_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/api"
	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/store"
	"github.com/airlock/airlock/internal/store/pgtest"
	"github.com/airlock/airlock/internal/store/postgres"
	"github.com/airlock/airlock/internal/store/sqlite"
)

// seenBound is how long a transition may take to reach the other server's
// stream before the test calls it lost: a bound on "never" (without the
// notifier it never comes: nothing else wakes B's feed), not the measure,
// which the test logs.
const seenBound = 20 * time.Second

// TestTwoServersSSE runs two servers' stacks (store, event log with
// Listen, service) on one database — PostgreSQL, as two airlock servers
// would, and one SQLite file in one process — and an SSE client on server
// B's native API. Server A writes sandbox transitions as the controller
// does (the guarded write, then the event); B's stream must deliver each,
// woken by the notifier. The latency from A's write to B's client is
// logged (the target is under 100 ms).
func TestTwoServersSSE(t *testing.T) {
	for _, backend := range []string{"postgres", "sqlite"} {
		t.Run(backend, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var stA, stB store.Store
			switch backend {
			case "postgres":
				url := pgtest.URL(t)
				stA, stB = openPG(t, ctx, url), openPG(t, ctx, url)
			default:
				path := filepath.Join(t.TempDir(), "airlock.db")
				stA, stB = openSQLite(t, ctx, path), openSQLite(t, ctx, path)
			}
			evA, evB := events.New(stA), events.New(stB)
			go evA.Listen(ctx)
			go evB.Listen(ctx)
			svcA := service.New(service.Config{Store: stA, Events: evA, Kick: func() {}, RateLimit: -1})
			key, _, err := svcA.Bootstrap(ctx)
			if err != nil {
				t.Fatal(err)
			}
			svcB := service.New(service.Config{Store: stB, Events: evB, Kick: func() {}, RateLimit: -1})
			srvB := httptest.NewServer(api.New(svcB, api.Options{KeepAlive: time.Hour}))
			defer srvB.Close()
			defer cancel() // end the stream before the server closes

			now := time.Now().UTC()
			sb := model.Sandbox{
				ID: "sb-1", OrgID: service.DefaultOrgID, Template: "base", TemplateDigest: "sha256:aaa", Runtime: "gvisor",
				State: model.StateRunning, DesiredState: model.StateRunning, Resources: model.Resources{VCPUs: 1, MemoryMiB: 256},
				Generation: 1, CreatedAt: now, UpdatedAt: now, LastActivityAt: now,
			}
			op := model.Operation{ID: "op-1", OrgID: sb.OrgID, SandboxID: sb.ID, Kind: model.OpCreate, State: model.OpSucceeded,
				Target: model.StateRunning, CreatedAt: now, UpdatedAt: now, Deadline: now.Add(time.Hour)}
			if sb, _, _, err = stA.CreateSandbox(ctx, sb, op, ""); err != nil {
				t.Fatal(err)
			}

			seen := streamGenerations(t, ctx, srvB.URL+"/v1/sandboxes/"+sb.ID+"/events", key)
			// transition is A's write: the guarded update, then its event.
			transition := func() (int64, time.Time) {
				t.Helper()
				next := sb
				if sb.State == model.StateRunning {
					next.State = model.StatePaused
				} else {
					next.State = model.StateRunning
				}
				start := time.Now()
				var err error
				if sb, err = stA.UpdateSandbox(ctx, next); err != nil {
					t.Fatal(err)
				}
				if err := evA.Sandbox(ctx, sb); err != nil {
					t.Fatal(err)
				}
				return sb.Generation, start
			}
			await := func(gen int64) time.Time {
				t.Helper()
				timeout := time.After(seenBound)
				for {
					select {
					case s := <-seen:
						if s.gen == gen {
							return s.at
						}
					case <-timeout:
						t.Fatalf("server B's stream did not deliver generation %d within %v of A's write", gen, seenBound)
					}
				}
			}
			// Warm up: B's listener may still be connecting.
			await(transitionNoWait(transition))
			var lat []time.Duration
			for range 20 {
				gen, start := transition()
				lat = append(lat, await(gen).Sub(start))
			}
			slices.Sort(lat)
			t.Logf("%s: A's write → B's SSE client, %d transitions: min %v, median %v, max %v (target < 100ms)",
				backend, len(lat), lat[0], lat[len(lat)/2], lat[len(lat)-1])
		})
	}
}

func transitionNoWait(f func() (int64, time.Time)) int64 {
	gen, _ := f()
	return gen
}

type seenEvent struct {
	gen int64
	at  time.Time
}

// streamGenerations opens an SSE stream and sends the generation of every
// sandbox event on it with the time it arrived; the stream is open when it
// returns.
func streamGenerations(t *testing.T, ctx context.Context, url, key string) <-chan seenEvent {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		t.Fatalf("open stream: %s", resp.Status)
	}
	out := make(chan seenEvent, 64)
	go func() {
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok {
				continue
			}
			at := time.Now()
			var ev model.Event
			var sb model.Sandbox
			if json.Unmarshal([]byte(data), &ev) != nil || ev.Type != events.TypeSandbox || json.Unmarshal(ev.Data, &sb) != nil {
				continue
			}
			select {
			case out <- seenEvent{gen: sb.Generation, at: at}:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

func openPG(t *testing.T, ctx context.Context, url string) store.Store {
	t.Helper()
	st, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func openSQLite(t *testing.T, ctx context.Context, path string) store.Store {
	t.Helper()
	st, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}
