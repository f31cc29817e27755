package controller

import (
	"context"
	"testing"
	"time"
)

// TestOneReplicaReconciles: of two controllers on one store only the
// lease holder runs rounds; when it stops, the other takes over at once
// (the lease is released); a holder that died without releasing is
// replaced once its lease expires.
func TestOneReplicaReconciles(t *testing.T) {
	e := newEnv(t)
	ttl := 300 * time.Millisecond
	// A replica that died holding the lease.
	if _, err := e.st.AcquireLease(e.ctx, LeaseName, "dead", time.Now().UTC(), ttl); err != nil {
		t.Fatal(err)
	}
	rounds := map[string]chan struct{}{}
	start := func(name string) context.CancelFunc {
		c := New(Config{Store: e.st, Events: e.ev, WorkerToken: testToken, Instance: name, LeaseTTL: ttl, Resync: 50 * time.Millisecond})
		ch := make(chan struct{}, 100)
		rounds[name] = ch
		c.ObserveRounds(func(RoundStats) {
			select {
			case ch <- struct{}{}:
			default:
			}
		})
		ctx, cancel := context.WithCancel(e.ctx)
		done := make(chan struct{})
		go func() { c.Run(ctx); close(done) }()
		return func() { cancel(); <-done }
	}
	t0 := time.Now()
	stopA := start("a")
	stopB := start("b")
	defer stopB()
	first := ""
	select {
	case <-rounds["a"]:
		first = "a"
	case <-rounds["b"]:
		first = "b"
	case <-time.After(10 * time.Second):
		t.Fatal("no replica reconciled after the dead holder's lease expired")
	}
	if waited := time.Since(t0); waited < ttl/2 {
		t.Fatalf("a replica reconciled %v after start, while the dead holder's lease (%v) was valid", waited, ttl)
	}
	other := map[string]string{"a": "b", "b": "a"}[first]
	// Only the holder runs rounds.
	drain(rounds[other])
	time.Sleep(3 * ttl)
	if n := drain(rounds[other]); n != 0 {
		t.Fatalf("replica %s (not the holder) ran %d rounds", other, n)
	}
	l, err := e.st.AcquireLease(e.ctx, LeaseName, "probe", time.Now().UTC(), ttl)
	if err != nil || l.Holder != first {
		t.Fatalf("lease = %+v %v; want held by %s", l, err, first)
	}
	// The holder stops: the other takes over well before a TTL.
	if first == "a" {
		stopA()
	} else {
		stopB()
		defer stopA()
	}
	select {
	case <-rounds[other]:
	case <-time.After(10 * time.Second):
		t.Fatalf("replica %s did not take over", other)
	}
	if l, err := e.st.AcquireLease(e.ctx, LeaseName, "probe", time.Now().UTC(), ttl); err != nil || l.Holder != other || l.Epoch < 3 {
		t.Fatalf("lease after the takeover = %+v %v; want %s at epoch ≥ 3", l, err, other)
	}
}

func drain(ch chan struct{}) int {
	n := 0
	for {
		select {
		case <-ch:
			n++
		default:
			return n
		}
	}
}
