package egress

import (
	"bufio"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestAttachListenerSets: one sandbox served on an IPv4 and an IPv6 set
// of listeners (an egress network with IPv6): both answer DNS under its
// policy, the IPv6 proxy admits an IPv6 destination its CIDR rule
// allows, events name the sandbox, and Detach closes every listener.
func TestAttachListenerSets(t *testing.T) {
	e := newEnv(t)
	pl6, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	defer pl6.Close()
	pc6, err := net.ListenPacket("udp6", "[::1]:0")
	if err != nil {
		t.Fatal(err)
	}
	dl6 := listen(t, "[::1]:0")
	pc4, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	banner := listen(t, "[::1]:0")
	go func() {
		for {
			c, err := banner.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "SSH-2.0-six\r\n")
			c.Close()
		}
	}()
	p := allow("allowed.test").withCIDR("::1/128")
	if err := e.gw.AttachListenerSets("sb6", p, Listeners{DNS: pc4}, Listeners{Proxy: pl6, DNS: pc6, DNSTCP: dl6}); err != nil {
		t.Fatal(err)
	}
	ask := func(network, addr, name string) *dns.Msg {
		t.Helper()
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		r, _, err := (&dns.Client{Net: network, Timeout: 10 * time.Second}).Exchange(m, addr)
		if err != nil {
			t.Fatalf("dns %s over %s to %s: %v", name, network, addr, err)
		}
		return r
	}
	for _, q := range []struct{ network, addr string }{{"udp", pc6.LocalAddr().String()}, {"tcp", dl6.Addr().String()}, {"udp", pc4.LocalAddr().String()}} {
		if r := ask(q.network, q.addr, "allowed.test"); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
			t.Errorf("allowed.test over %s to %s: %v", q.network, q.addr, r)
		}
		if r := ask(q.network, q.addr, "denied.test"); r.Rcode != dns.RcodeRefused {
			t.Errorf("denied.test over %s to %s: rcode %s", q.network, q.addr, dns.RcodeToString[r.Rcode])
		}
	}

	c, err := net.Dial("tcp6", pl6.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e.dsts.set(addrPortOf(c.LocalAddr()), addrPortOf(banner.Addr()))
	_ = c.SetDeadline(time.Now().Add(30 * time.Second)) // a safety net, not an assertion
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "SSH-2.0-six\r\n" {
		t.Fatalf("banner through the IPv6 proxy listener: %q, %v\n%s", line, err, e.ev)
	}
	if evs := e.ev.find(KindTCP, true, ""); len(evs) == 0 || evs[len(evs)-1].SandboxID != "sb6" || !evs[len(evs)-1].IP.Is6() {
		t.Errorf("no allowed IPv6 connection event of sb6:\n%s", e.ev)
	}

	e.gw.Detach("sb6")
	if c, err := net.Dial("tcp6", pl6.Addr().String()); err == nil {
		c.Close()
		t.Error("the IPv6 proxy listener still accepts after Detach")
	}
	pc6.SetReadDeadline(time.Now().Add(time.Second))
	if _, _, err := pc6.ReadFrom(make([]byte, 1)); err == nil || !isClosed(err) {
		t.Errorf("the IPv6 DNS socket after Detach: %v, want closed", err)
	}
	if _, _, err := pc4.ReadFrom(make([]byte, 1)); err == nil || !isClosed(err) {
		t.Errorf("the IPv4 DNS socket after Detach: %v, want closed", err)
	}
}

func isClosed(err error) bool { return errors.Is(err, net.ErrClosed) }
