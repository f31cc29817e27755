package egress

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// chanRelay is a UDPRelay a test drives: datagrams in through send,
// replies out through got.
type chanRelay struct {
	in     chan relayed
	got    chan relayed
	once   sync.Once
	closed chan struct{}
}

type relayed struct {
	b        []byte
	src, dst netip.AddrPort // in: guest src → original dst; out: from → to
}

func newChanRelay() *chanRelay {
	return &chanRelay{in: make(chan relayed, 16), got: make(chan relayed, 16), closed: make(chan struct{})}
}

func (r *chanRelay) ReadFrom(b []byte) (int, netip.AddrPort, netip.AddrPort, error) {
	select {
	case d := <-r.in:
		return copy(b, d.b), d.src, d.dst, nil
	case <-r.closed:
		return 0, netip.AddrPort{}, netip.AddrPort{}, net.ErrClosed
	}
}

func (r *chanRelay) WriteFrom(b []byte, from, to netip.AddrPort) error {
	r.got <- relayed{append([]byte(nil), b...), from, to}
	return nil
}

func (r *chanRelay) Close() error { r.once.Do(func() { close(r.closed) }); return nil }

func (r *chanRelay) reply(t *testing.T) (relayed, bool) {
	t.Helper()
	select {
	case d := <-r.got:
		return d, true
	case <-time.After(2 * time.Second): // a safety net: a denied datagram has no reply
		return relayed{}, false
	}
}

// udpEcho serves UDP echo on addr and returns its address.
func udpEcho(t *testing.T, addr string) netip.AddrPort {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(append([]byte("echo:"), buf[:n]...), from)
		}
	}()
	return addrPortOf(pc.LocalAddr())
}

func (p *testPolicy) withUDP(cidr string, names ...string) *testPolicy {
	if cidr != "" {
		p.udpCIDRs = append(p.udpCIDRs, netip.MustParsePrefix(cidr))
	}
	if p.udpNames == nil {
		p.udpNames = map[string]bool{}
	}
	for _, n := range names {
		p.udpNames[n] = true
	}
	return p
}

func TestUDP(t *testing.T) {
	e := newEnv(t)
	byAddr := udpEcho(t, "127.0.1.5:0")
	byName := udpEcho(t, "127.0.1.6:0")
	denied := udpEcho(t, "127.0.1.7:0")
	e.up.mu.Lock()
	e.up.zone["udp.test."] = []dns.RR{rr(t, "udp.test. 300 IN A 127.0.1.6")}
	e.up.mu.Unlock()
	p := allow("allowed.test", "udp.test").withUDP("127.0.1.5/32", "udp.test")
	e.attach("sb1", sb1, p)
	r := newChanRelay()
	done := make(chan error, 1)
	go func() { done <- e.gw.ServeUDP("sb1", r) }()
	guest := netip.MustParseAddrPort("100.64.0.2:40000")

	send := func(dst netip.AddrPort, msg string) (relayed, bool) {
		r.in <- relayed{[]byte(msg), guest, dst}
		return r.reply(t)
	}
	t.Run("a UDP rule by address relays both ways", func(t *testing.T) {
		for _, msg := range []string{"one", "two"} { // the second rides the flow
			got, ok := send(byAddr, msg)
			if !ok || string(got.b) != "echo:"+msg || got.src != byAddr || got.dst != guest {
				t.Fatalf("reply %+v %v", got, ok)
			}
		}
		if evs := e.ev.find(KindUDP, true, ""); len(evs) != 1 || evs[0].IP != byAddr.Addr() {
			t.Fatalf("want one allowed udp event:\n%s", e.ev)
		}
	})
	t.Run("by name only after the gateway resolved it for the sandbox", func(t *testing.T) {
		if _, ok := send(byName, "early"); ok {
			t.Fatal("relayed to a name's address before it was resolved")
		}
		e.resolve(sb1, "udp.test")
		got, ok := send(byName, "late")
		if !ok || string(got.b) != "echo:late" {
			t.Fatalf("reply %+v %v\n%s", got, ok, e.ev)
		}
		if evs := e.ev.find(KindUDP, true, "udp name"); len(evs) != 1 || evs[0].Name != "udp.test" {
			t.Fatalf("events:\n%s", e.ev)
		}
	})
	t.Run("denied, reported once per flow", func(t *testing.T) {
		for range 3 {
			if _, ok := send(denied, "x"); ok {
				t.Fatal("relayed to a denied address")
			}
		}
		if evs := e.ev.find(KindUDP, false, "no udp rule"); len(evs) != 2 { // "early" above, and this flow once
			t.Fatalf("want 2 udp denials:\n%s", e.ev)
		}
	})
	t.Run("host addresses are never reachable", func(t *testing.T) {
		e.setHost(byAddr.Addr())
		defer e.setHost(netip.Addr{})
		if _, ok := send(netip.AddrPortFrom(byAddr.Addr(), byAddr.Port()+1), "host"); ok {
			t.Fatal("relayed to a host address")
		}
		if len(e.ev.find(KindUDP, false, "address of the host")) == 0 {
			t.Fatalf("no denial:\n%s", e.ev)
		}
	})
	t.Run("an update closes the flows it denies", func(t *testing.T) {
		if err := e.gw.Update("sb1", allow("allowed.test")); err != nil {
			t.Fatal(err)
		}
		if len(e.ev.find(KindUDP, false, "policy updated")) < 2 {
			t.Fatalf("flows not closed:\n%s", e.ev)
		}
		if _, ok := send(byAddr, "after"); ok {
			t.Fatal("relayed after the update denied it")
		}
	})
	e.gw.Detach("sb1")
	if err := <-done; err == nil || !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "closed") {
		t.Fatalf("ServeUDP after detach: %v", err)
	}
}
