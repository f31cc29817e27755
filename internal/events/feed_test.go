package events_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store/sqlite"
)

func newLog(t *testing.T) (*events.Log, context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return events.New(st), ctx
}

func appendN(t *testing.T, ctx context.Context, l *events.Log, org, sid string, n int) {
	t.Helper()
	for range n {
		if err := l.Sandbox(ctx, model.Sandbox{ID: sid, OrgID: org}); err != nil {
			t.Error(err)
			return
		}
	}
}

// TestSubscribeStartsAtLogEnd: a first subscription over a log with history
// delivers only what comes after it, filtered by org and sandbox, in order;
// the history is not read through.
func TestSubscribeStartsAtLogEnd(t *testing.T) {
	l, ctx := newLog(t)
	// History written by another Log (another process): this one learns the
	// end of the log from the store.
	appendN(t, ctx, events.New(l.Store), "o1", "sb-old", 1234)
	org, err := l.Subscribe(ctx, "o1", "")
	if err != nil {
		t.Fatal(err)
	}
	defer org.Close()
	one, err := l.Subscribe(ctx, "o1", "sb-2")
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	appendN(t, ctx, l, "o2", "sb-x", 1) // another org
	appendN(t, ctx, l, "o1", "sb-1", 1)
	appendN(t, ctx, l, "o1", "sb-2", 1)
	var got []model.Event
	for range 2 {
		select {
		case ev := <-org.C:
			got = append(got, *ev)
		case <-ctx.Done():
			t.Fatal("org subscription: no event")
		}
	}
	if got[0].Seq != 1236 || got[0].SandboxID != "sb-1" || got[1].Seq != 1237 || got[1].SandboxID != "sb-2" {
		t.Errorf("org subscription got %+v %+v; want seq 1236 (sb-1), 1237 (sb-2)", got[0], got[1])
	}
	select {
	case ev := <-one.C:
		if ev.Seq != 1237 {
			t.Errorf("sandbox subscription got seq %d, want 1237", ev.Seq)
		}
	case <-ctx.Done():
		t.Fatal("sandbox subscription: no event")
	}
	if n := l.FeedReads(); n > 4 {
		t.Errorf("the feed made %d reads for 3 events", n)
	}
}

// TestSubscriptionLags: a subscriber that reads nothing while more than
// SubscriptionBuffer events arrive is told it lagged (and holds the first
// SubscriptionBuffer, in order); the others are not held up.
func TestSubscriptionLags(t *testing.T) {
	l, ctx := newLog(t)
	slow, err := l.Subscribe(ctx, "o1", "")
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	fast, err := l.Subscribe(ctx, "o1", "")
	if err != nil {
		t.Fatal(err)
	}
	defer fast.Close()
	n := events.SubscriptionBuffer + 100
	go appendN(t, ctx, l, "o1", "sb-1", n)
	var last int64
	for i := range n {
		select {
		case ev := <-fast.C:
			if ev.Seq <= last {
				t.Fatalf("fast subscriber: seq %d after %d", ev.Seq, last)
			}
			last = ev.Seq
		case <-ctx.Done():
			t.Fatalf("fast subscriber got %d of %d events", i, n)
		}
	}
	select {
	case <-slow.Lagged:
	case <-ctx.Done():
		t.Fatal("the slow subscriber was never told it lagged")
	}
	if len(slow.C) != events.SubscriptionBuffer {
		t.Errorf("slow subscriber holds %d events, want %d", len(slow.C), events.SubscriptionBuffer)
	}
}
