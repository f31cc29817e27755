package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
)

// notifyBound is how long a wake-up may take before the test calls it
// lost: generous, a bound on "never", not a measure (they take
// milliseconds).
const notifyBound = 20 * time.Second

// RunNotify checks store.Notifier across two stores on one database
// (open returns both): b's Listen wakes after each event a appends. The
// first round also waits for b to start listening (on PostgreSQL, its
// LISTEN connection); the later rounds could pass only by a notification.
func RunNotify(t *testing.T, open func(t *testing.T) (a, b store.Store)) {
	a, b := open(t)
	n, ok := b.(store.Notifier)
	if !ok {
		t.Fatalf("%T is not a store.Notifier", b)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	woke := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.Listen(ctx, func() {
			select {
			case woke <- struct{}{}:
			default:
			}
		})
	}()
	appendOne := func(i int) {
		t.Helper()
		if _, err := a.AppendEvent(ctx, model.Event{OrgID: "org-a", Type: "org.note", Data: []byte(fmt.Sprintf(`{"n":%d}`, i))}); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	// Warm up: append until a wake-up comes (b may not listen yet).
	warm := time.After(notifyBound)
	for i := 0; ; i++ {
		appendOne(i)
		select {
		case <-woke:
		case <-time.After(50 * time.Millisecond):
			select {
			case <-warm:
				t.Fatalf("no wake-up within %v of appends", notifyBound)
			default:
			}
			continue
		}
		break
	}
	for round := range 5 {
		select { // a wake-up left over from the warm-up appends
		case <-woke:
		default:
		}
		start := time.Now()
		appendOne(1000 + round)
		select {
		case <-woke:
			t.Logf("round %d: woken %v after the append returned", round, time.Since(start))
		case <-time.After(notifyBound):
			t.Fatalf("round %d: no wake-up within %v of an append", round, notifyBound)
		}
	}
	cancel()
	<-done // Listen returns when ctx ends
}
