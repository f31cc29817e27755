package notify

import (
	"testing"
	"time"
)

func TestNotifyWakesAllWaiters(t *testing.T) {
	var b Broadcaster
	c1, c2 := b.C(), b.C()
	select {
	case <-c1:
		t.Fatal("woken before Notify")
	default:
	}
	b.Notify()
	for i, c := range []<-chan struct{}{c1, c2} {
		select {
		case <-c:
		case <-time.After(time.Second):
			t.Fatalf("waiter %d not woken", i)
		}
	}
	select {
	case <-b.C():
		t.Fatal("a channel taken after Notify must wait for the next one")
	default:
	}
}
