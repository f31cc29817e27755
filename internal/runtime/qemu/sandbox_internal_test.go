package qemu

import (
	"net"
	"testing"
	"time"
)

// TestCloseRace closes a handle and its open agent connection at the same
// time, as a worker does when a restored guest's agent never answers (the
// handle is closed while the HTTP/2 client closes its connection). Both
// must return; an earlier version closed the connection while holding the
// handle's lock, which the connection's Close also takes, and deadlocked.
func TestCloseRace(t *testing.T) {
	for i := range 2000 {
		s := &sandbox{id: "sb-x", free: make(chan struct{}, 1), closed: make(chan struct{})}
		a, b := net.Pipe()
		hc := &hostConn{Conn: a, s: s}
		s.active = hc
		done := make(chan struct{}, 2)
		go func() { s.Close(); done <- struct{}{} }()
		go func() { hc.Close(); done <- struct{}{} }()
		for range 2 {
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatalf("round %d: Close of the handle and of its connection deadlocked", i)
			}
		}
		b.Close()
		select {
		case <-s.free: // the connection gave its token back
		default:
			t.Fatalf("round %d: the closed connection did not give the handle's token back", i)
		}
	}
}
