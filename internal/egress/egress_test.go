package egress

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

const (
	sb1 = "127.0.0.2"
	sb2 = "127.0.0.3"
)

func policyAll() *testPolicy {
	return allow("allowed.test", "tls.test", "other.test", "alias.test", "short.test", "long.test", "big.test")
}

func TestDNS(t *testing.T) {
	e := newEnv(t)
	e.attach("sb1", sb1, policyAll())
	e.attach("sb2", sb2, allow("tls.test"))
	ip := netip.MustParseAddr("127.0.1.1")

	t.Run("allowed name resolves and is attributed to the sandbox that asked", func(t *testing.T) {
		r := e.query(sb1, "Allowed.Test", dns.TypeA)
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "127.0.1.1" {
			t.Fatalf("answer %v", r)
		}
		if got := e.gw.Lookup("sb1", ip); !reflect.DeepEqual(got, []string{"allowed.test"}) {
			t.Fatalf("Lookup sb1 = %v", got)
		}
		if got := e.gw.Lookup("sb2", ip); got != nil {
			t.Fatalf("Lookup sb2 = %v, want nothing", got)
		}
		if len(e.ev.find(KindDNS, true, "")) == 0 {
			t.Fatalf("no allowed dns event:\n%s", e.ev)
		}
	})
	t.Run("denied name is REFUSED with an event", func(t *testing.T) {
		r := e.query(sb1, "denied.test", dns.TypeA)
		if r.Rcode != dns.RcodeRefused || len(r.Answer) != 0 {
			t.Fatalf("answer %v", r)
		}
		evs := e.ev.find(KindDNS, false, "not allowed")
		if len(evs) == 0 || evs[len(evs)-1].Name != "denied.test" || evs[len(evs)-1].SandboxID != "sb1" {
			t.Fatalf("no denied dns event:\n%s", e.ev)
		}
	})
	t.Run("unknown source is REFUSED with an event", func(t *testing.T) {
		r := e.query("127.0.0.9", "allowed.test", dns.TypeA)
		if r.Rcode != dns.RcodeRefused {
			t.Fatalf("answer %v", r)
		}
		if evs := e.ev.find(KindDNS, false, "no sandbox's address"); len(evs) == 0 || evs[0].SandboxID != "" {
			t.Fatalf("no event:\n%s", e.ev)
		}
	})
	t.Run("other query types are REFUSED", func(t *testing.T) {
		for _, qt := range []uint16{dns.TypeTXT, dns.TypeMX, dns.TypeANY, dns.TypeHTTPS, dns.TypePTR} {
			if r := e.query(sb1, "allowed.test", qt); r.Rcode != dns.RcodeRefused {
				t.Fatalf("%s: %v", dns.Type(qt), r)
			}
		}
	})
	t.Run("two questions are FORMERR", func(t *testing.T) {
		m := new(dns.Msg)
		m.SetQuestion("allowed.test.", dns.TypeA)
		m.Question = append(m.Question, dns.Question{Name: "tls.test.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
		if r := e.exchange(sb1, "udp", m); r.Rcode != dns.RcodeFormatError {
			t.Fatalf("answer %v", r)
		}
	})
	t.Run("invalid name is REFUSED", func(t *testing.T) {
		if r := e.query(sb1, `bad\000name.test`, dns.TypeA); r.Rcode != dns.RcodeRefused {
			t.Fatalf("answer %v", r)
		}
	})
	t.Run("CNAME chain attributed to the asked name", func(t *testing.T) {
		r := e.query(sb1, "alias.test", dns.TypeA)
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 2 {
			t.Fatalf("answer %v", r)
		}
		names := e.gw.Lookup("sb1", ip)
		if !contains(names, "alias.test") || contains(names, "target.test") {
			t.Fatalf("Lookup = %v, want alias.test and not target.test", names)
		}
	})
	t.Run("sandbox EDNS options do not reach upstream", func(t *testing.T) {
		m := new(dns.Msg)
		m.SetQuestion("allowed.test.", dns.TypeA)
		m.SetEdns0(4096, true)
		o := m.IsEdns0()
		o.Option = append(o.Option, &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.ParseIP("192.0.2.0").To4()})
		if r := e.exchange(sb1, "udp", m); r.Rcode != dns.RcodeSuccess {
			t.Fatalf("answer %v", r)
		}
		e.up.mu.Lock()
		last, do := e.up.opts[len(e.up.opts)-1], e.up.do[len(e.up.do)-1]
		e.up.mu.Unlock()
		if len(last) != 0 || do {
			t.Fatalf("upstream saw options %v, DO %v", last, do)
		}
	})
	t.Run("truncated answer retried over TCP, bounded", func(t *testing.T) {
		m := new(dns.Msg)
		m.SetQuestion("big.test.", dns.TypeA)
		m.SetEdns0(1232, false)
		r := e.exchange(sb1, "udp", m)
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != maxAddrs {
			t.Fatalf("answer: rcode %d, %d records, want %d", r.Rcode, len(r.Answer), maxAddrs)
		}
		e.up.mu.Lock()
		tcp := e.up.tcp
		e.up.mu.Unlock()
		if tcp == 0 {
			t.Fatal("upstream saw no TCP query")
		}
		if got := e.gw.Lookup("sb1", netip.MustParseAddr("10.0.0.33")); got != nil {
			t.Fatalf("address beyond the bound attributed: %v", got)
		}
	})
	t.Run("DNS over TCP", func(t *testing.T) {
		m := new(dns.Msg)
		m.SetQuestion("tls.test.", dns.TypeA)
		if r := e.exchange(sb2, "tcp", m); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
			t.Fatalf("answer %v", r)
		}
		if got := e.gw.Lookup("sb2", netip.MustParseAddr("127.0.1.2")); !contains(got, "tls.test") {
			t.Fatalf("Lookup = %v", got)
		}
		m.SetQuestion("allowed.test.", dns.TypeA)
		if r := e.exchange(sb2, "tcp", m); r.Rcode != dns.RcodeRefused {
			t.Fatalf("answer %v", r)
		}
	})
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

func TestTTLClampAndExpiry(t *testing.T) {
	e := newEnv(t)
	e.attach("sb1", sb1, policyAll())
	ip := netip.MustParseAddr("127.0.1.1")
	r := e.query(sb1, "short.test", dns.TypeA)
	if ttl := r.Answer[0].Header().Ttl; ttl != 5 {
		t.Fatalf("short TTL handed out as %d, want 5", ttl)
	}
	r = e.query(sb1, "long.test", dns.TypeA)
	if ttl := r.Answer[0].Header().Ttl; ttl != 3600 {
		t.Fatalf("long TTL handed out as %d, want 3600", ttl)
	}
	e.clock.Add(4 * time.Second)
	if got := e.gw.Lookup("sb1", ip); !reflect.DeepEqual(got, []string{"long.test", "short.test"}) {
		t.Fatalf("after 4s: %v", got)
	}
	e.clock.Add(2 * time.Second)
	if got := e.gw.Lookup("sb1", ip); !reflect.DeepEqual(got, []string{"long.test"}) {
		t.Fatalf("after 6s: %v", got)
	}
	// An expired attribution no longer admits.
	c := e.dial(sb1, e.httpDst)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: short.test\r\n\r\n")
	expectReset(t, c)
	if len(e.ev.find(KindTCP, false, "was not resolved for short.test")) == 0 {
		t.Fatalf("no event:\n%s", e.ev)
	}
	e.clock.Add(time.Hour)
	if got := e.gw.Lookup("sb1", ip); got != nil {
		t.Fatalf("after an hour: %v", got)
	}
}

func TestProxyAllowed(t *testing.T) {
	e := newEnv(t)
	e.attach("sb1", sb1, policyAll())
	e.resolve(sb1, "allowed.test")
	e.resolve(sb1, "tls.test")

	body, err := get(e.client(sb1, e.httpDst), "http://allowed.test/")
	if err != nil || body != "host=allowed.test sni= body=0" {
		t.Fatalf("http: %q, %v\n%s", body, err, e.ev)
	}
	body, err = get(e.client(sb1, e.tlsDst), "https://tls.test/")
	if err != nil || body != "host=tls.test sni=tls.test body=0" {
		t.Fatalf("https: %q, %v\n%s", body, err, e.ev)
	}
	evs := e.ev.find(KindTCP, true, "")
	if len(evs) != 2 || evs[0].Host != "allowed.test" || evs[1].SNI != "tls.test" || evs[1].Rule != 1 || evs[1].Port != e.tlsDst.Port() {
		t.Fatalf("events:\n%s", e.ev)
	}
}

func TestProxyFronting(t *testing.T) {
	e := newEnv(t)
	e.attach("sb1", sb1, policyAll())
	e.attach("sb2", sb2, policyAll())
	e.resolve(sb1, "tls.test")
	e.resolve(sb1, "other.test")
	e.resolve(sb2, "allowed.test")

	handshake := func(src string, dst netip.AddrPort, sni string) error {
		c := e.dial(src, dst)
		return tls.Client(c, &tls.Config{ServerName: sni, RootCAs: e.pool}).Handshake()
	}
	// The control: SNI and address agree.
	if err := handshake(sb1, e.otherDst, "other.test"); err != nil {
		t.Fatalf("other.test at its own address: %v", err)
	}
	for _, tc := range []struct {
		name   string
		src    string
		dst    netip.AddrPort
		sni    string
		reason string
	}{
		// other.test's address serves tls.test too (one certificate): an
		// allowed SNI at an address handed out for another name.
		{"shared address", sb1, e.otherDst, "tls.test", "(it was for [other.test])"},
		// An address the sandbox never resolved (a forged answer).
		{"unresolved address", sb1, e.httpDst, "tls.test", "was not resolved for tls.test"},
		// Another sandbox's resolution is not this one's.
		{"other sandbox's answer", sb2, e.tlsDst, "tls.test", "was not resolved for tls.test"},
		{"denied SNI", sb1, e.tlsDst, "denied.test", "no rule allows"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := handshake(tc.src, tc.dst, tc.sni)
			if !isReset(err) {
				t.Fatalf("handshake: %v, want a reset", err)
			}
			if len(e.ev.find(KindTCP, false, tc.reason)) == 0 {
				t.Fatalf("no event %q:\n%s", tc.reason, e.ev)
			}
		})
	}
}

func isReset(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "broken pipe"))
}

func TestProxyRawIP(t *testing.T) {
	e := newEnv(t)
	e.attach("sb1", sb1, policyAll().withCIDR(e.bannerDst.Addr().String()+"/32"))
	t.Run("denied", func(t *testing.T) {
		c := e.dial(sb1, e.httpDst)
		io.WriteString(c, "\x00hello\r\n")
		expectReset(t, c)
		if evs := e.ev.find(KindTCP, false, "no rule allows"); len(evs) == 0 || evs[0].Name != "" {
			t.Fatalf("no event:\n%s", e.ev)
		}
	})
	t.Run("TLS without SNI denied", func(t *testing.T) {
		c := e.dial(sb1, e.tlsDst)
		err := tls.Client(c, &tls.Config{InsecureSkipVerify: true}).Handshake()
		if !isReset(err) {
			t.Fatalf("handshake: %v", err)
		}
	})
	t.Run("allowed by CIDR, server speaks first", func(t *testing.T) {
		c := e.dial(sb1, e.bannerDst)
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || line != "SSH-2.0-test\r\n" {
			t.Fatalf("banner %q, %v\n%s", line, err, e.ev)
		}
	})
	t.Run("IP-literal Host must be the destination", func(t *testing.T) {
		c := e.dial(sb1, e.bannerDst)
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: 127.0.1.1\r\n\r\n")
		expectReset(t, c)
		if len(e.ev.find(KindTCP, false, "is not the destination")) == 0 {
			t.Fatalf("no event:\n%s", e.ev)
		}
	})
}

func TestProxyRefusals(t *testing.T) {
	e := newEnv(t)
	p := policyAll()
	p.intercept["intercept.test"] = true
	e.up.mu.Lock()
	e.up.zone["intercept.test."] = []dns.RR{rr(t, "intercept.test. 300 IN A 127.0.1.2")}
	e.up.mu.Unlock()
	e.attach("sb1", sb1, p)
	e.resolve(sb1, "allowed.test")
	e.resolve(sb1, "intercept.test")
	big := strings.Repeat("a", 20<<10)
	for _, tc := range []struct{ name, req, reason string }{
		{"CONNECT", "CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n", "CONNECT refused"},
		{"absolute URI", "GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "absolute URI"},
		{"missing Host", "GET / HTTP/1.1\r\nAccept: */*\r\n\r\n", "0 Host headers"},
		{"two Hosts", "GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: denied.test\r\n\r\n", "2 Host headers"},
		{"HTTP/1.0 without Host", "GET / HTTP/1.0\r\n\r\n", "0 Host headers"},
		{"upgrade", "GET / HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n", "upgrade"},
		{"length and chunked", "POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", "both"},
		{"bare LF", "GET / HTTP/1.1\nHost: allowed.test\n\nGET / HTTP/1.1\r\nHost: denied.test\r\n\r\n", "bare CR"},
		{"HTTP/2 prior knowledge", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "HTTP/2.0"},
		{"oversized header", "GET / HTTP/1.1\r\nHost: allowed.test\r\nX-Big: " + big + "\r\n\r\n", "larger than 16 KiB"},
		{"overlong name", "GET / HTTP/1.1\r\nHost: " + strings.Repeat("a", 64) + ".test\r\n\r\n", "invalid Host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := e.dial(sb1, e.httpDst)
			go io.WriteString(c, tc.req) // may block on a big request the proxy stops reading
			expectReset(t, c)
			if len(e.ev.find(KindTCP, false, tc.reason)) == 0 {
				t.Fatalf("no event %q:\n%s", tc.reason, e.ev)
			}
		})
	}
	t.Run("oversized ClientHello", func(t *testing.T) {
		var protos []string
		for i := range 100 {
			protos = append(protos, fmt.Sprintf("%03d%s", i, strings.Repeat("x", 200)))
		}
		c := e.dial(sb1, e.tlsDst)
		err := tls.Client(c, &tls.Config{ServerName: "tls.test", RootCAs: e.pool, NextProtos: protos}).Handshake()
		if !isReset(err) {
			t.Fatalf("handshake: %v", err)
		}
		if len(e.ev.find(KindTCP, false, "ClientHello larger than 16 KiB")) == 0 {
			t.Fatalf("no event:\n%s", e.ev)
		}
	})
	t.Run("interception without an org CA", func(t *testing.T) {
		c := e.dial(sb1, e.tlsDst)
		err := tls.Client(c, &tls.Config{ServerName: "intercept.test", RootCAs: e.pool}).Handshake()
		if !isReset(err) {
			t.Fatalf("handshake: %v", err)
		}
		if len(e.ev.find(KindTCP, false, reasonNoInterception)) == 0 {
			t.Fatalf("no event:\n%s", e.ev)
		}
	})
	t.Run("unknown source", func(t *testing.T) {
		c := e.dial("127.0.0.9", e.httpDst)
		expectReset(t, c)
		if len(e.ev.find(KindTCP, false, "no sandbox's address")) == 0 {
			t.Fatalf("no event:\n%s", e.ev)
		}
	})
	t.Run("connection to the gateway itself", func(t *testing.T) {
		c := e.dial(sb1, e.proxyAddr)
		expectReset(t, c)
		if len(e.ev.find(KindTCP, false, "gateway itself")) == 0 {
			t.Fatalf("no event:\n%s", e.ev)
		}
	})
}

// roundTrip writes req on c and reads one response body.
func roundTrip(c net.Conn, br *bufio.Reader, req string) (string, error) {
	if _, err := io.WriteString(c, req); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestKeepAlive(t *testing.T) {
	e := newEnv(t)
	e.attach("sb1", sb1, policyAll())
	e.resolve(sb1, "allowed.test")
	e.resolve(sb1, "alias.test") // also 127.0.1.1
	e.resolve(sb1, "other.test") // 127.0.1.3
	c := e.dial(sb1, e.httpDst)
	br := bufio.NewReader(c)
	steps := []struct{ req, want string }{
		{"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "host=allowed.test sni= body=0"},
		{"POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 5\r\n\r\nhello", "host=allowed.test sni= body=5"},
		{"POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nX-T: 1\r\n\r\n", "host=allowed.test sni= body=5"},
		// Another name the sandbox resolved to this very address passes.
		{"GET / HTTP/1.1\r\nHost: alias.test:80\r\n\r\n", "host=alias.test:80 sni= body=0"},
	}
	for i, s := range steps {
		got, err := roundTrip(c, br, s.req)
		if err != nil || got != s.want {
			t.Fatalf("request %d: %q, %v\n%s", i, got, err, e.ev)
		}
	}
	if len(e.ev.find(KindHTTP, true, "")) != 1 {
		t.Fatalf("want one http event for the Host change:\n%s", e.ev)
	}
	// other.test is allowed, but was resolved to another address.
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: other.test\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	expectReset(t, c)
	evs := e.ev.find(KindHTTP, false, "Host changed on a kept-alive connection")
	if len(evs) != 1 || evs[0].Name != "other.test" {
		t.Fatalf("events:\n%s", e.ev)
	}
	// Pipelined: the second request's Host is judged too.
	c = e.dial(sb1, e.httpDst)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\nGET / HTTP/1.1\r\nHost: denied.test\r\n\r\n")
	expectReset(t, c)
	if len(e.ev.find(KindHTTP, false, "no rule allows \"denied.test\"")) != 1 {
		t.Fatalf("events:\n%s", e.ev)
	}
}

func TestUpdateAndDetach(t *testing.T) {
	e := newEnv(t)
	e.attach("sb1", sb1, policyAll())
	e.resolve(sb1, "allowed.test")
	e.resolve(sb1, "tls.test")

	open := func(dst netip.AddrPort, host string, useTLS bool) (net.Conn, *bufio.Reader) {
		var c net.Conn = e.dial(sb1, dst)
		if useTLS {
			c = tls.Client(c, &tls.Config{ServerName: host, RootCAs: e.pool})
		}
		br := bufio.NewReader(c)
		if _, err := roundTrip(c, br, "GET / HTTP/1.1\r\nHost: "+host+"\r\n\r\n"); err != nil {
			t.Fatalf("%s: %v\n%s", host, err, e.ev)
		}
		return c, br
	}
	hc, _ := open(e.httpDst, "allowed.test", false)
	tc, tbr := open(e.tlsDst, "tls.test", true)

	if err := e.gw.Update("sb1", allow("tls.test")); err != nil {
		t.Fatal(err)
	}
	expectReset(t, hc)
	if len(e.ev.find(KindTCP, false, "policy updated")) != 1 {
		t.Fatalf("events:\n%s", e.ev)
	}
	if _, err := roundTrip(tc, tbr, "GET / HTTP/1.1\r\nHost: tls.test\r\n\r\n"); err != nil {
		t.Fatalf("connection the new policy allows: %v", err)
	}
	// New connections follow the new policy at once.
	c := e.dial(sb1, e.httpDst)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	expectReset(t, c)
	if r := e.query(sb1, "allowed.test", dns.TypeA); r.Rcode != dns.RcodeRefused {
		t.Fatalf("dns after update: %v", r)
	}

	if err := e.gw.Update("nobody", allow()); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Update unknown: %v", err)
	}
	e.gw.Detach("sb1")
	if _, err := roundTrip(tc, tbr, "GET / HTTP/1.1\r\nHost: tls.test\r\n\r\n"); !isReset(err) {
		t.Fatalf("after Detach: %v", err)
	}
	if got := e.gw.Lookup("sb1", e.tlsDst.Addr()); got != nil {
		t.Fatalf("Lookup after Detach: %v", got)
	}
	if r := e.query(sb1, "tls.test", dns.TypeA); r.Rcode != dns.RcodeRefused {
		t.Fatalf("dns after Detach: %v", r)
	}
	// The address can be attached again, and starts with no attribution.
	e.attach("sb1b", sb1, allow("tls.test"))
	if err := e.gw.Attach("sb1b", netip.MustParseAddr("127.0.0.4"), allow()); !errors.Is(err, ErrExists) {
		t.Fatalf("Attach twice: %v", err)
	}
	c = e.dial(sb1, e.tlsDst)
	if err := tls.Client(c, &tls.Config{ServerName: "tls.test", RootCAs: e.pool}).Handshake(); !isReset(err) {
		t.Fatalf("handshake before resolving: %v", err)
	}
}

func TestOriginalDstDefault(t *testing.T) {
	l := listen(t, "127.0.0.1:0")
	go func() {
		c, err := net.Dial("tcp", l.Addr().String())
		if err == nil {
			defer c.Close()
			io.ReadAll(c)
		}
	}()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ap, err := OriginalDst(c)
	if err != nil {
		// Without conntrack (no nf_conntrack module here) there is no
		// original destination to read: the call must fail, not invent one.
		t.Skipf("no conntrack entry for an unredirected connection: %v", err)
	}
	if ap != addrPortOf(c.LocalAddr()) {
		t.Fatalf("OriginalDst = %v, want the local address %v (nothing redirected)", ap, c.LocalAddr())
	}
	if _, err := OriginalDst(&helloConn{src: c}); err == nil {
		t.Fatal("OriginalDst of a non-TCP conn succeeded")
	}
}

func TestCanonicalName(t *testing.T) {
	for in, want := range map[string]string{
		"Example.COM.": "example.com", "a_b.test": "a_b.test", "x": "x",
		"": "", ".": "", "a..b": "", "-": "-", "a b": "", "1.2.3.4": "", "::1": "",
		strings.Repeat("a", 64) + ".test": "", "é.test": "",
	} {
		got, ok := canonicalName(in)
		if got != want || ok != (want != "") {
			t.Errorf("canonicalName(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

func TestConcurrentSandboxes(t *testing.T) {
	e := newEnv(t)
	srcs := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"}
	for i, src := range srcs {
		e.attach(fmt.Sprint("sb", i), src, policyAll())
		e.resolve(src, "allowed.test")
		e.resolve(src, "tls.test")
	}
	errc := make(chan error, len(srcs)*20)
	var done = make(chan struct{})
	for _, src := range srcs {
		for j := range 10 {
			go func() {
				c, url, want := e.client(src, e.httpDst), "http://allowed.test/", "host=allowed.test sni= body=0"
				if j%2 == 1 {
					c, url, want = e.client(src, e.tlsDst), "https://tls.test/", "host=tls.test sni=tls.test body=0"
				}
				for range 5 {
					body, err := get(c, url)
					if err == nil && body != want {
						err = fmt.Errorf("body %q", body)
					}
					if err != nil {
						errc <- fmt.Errorf("%s %s: %w", src, url, err)
						return
					}
				}
				errc <- nil
			}()
		}
	}
	// Policy updates that keep everything allowed run alongside.
	go func() {
		defer close(done)
		for range 50 {
			if err := e.gw.Update("sb0", policyAll()); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for range len(srcs) * 10 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	<-done
	if n := len(e.ev.find(KindTCP, false, "")); n != 0 {
		t.Fatalf("%d denials:\n%s", n, e.ev)
	}
}

// TestProxyBodyFraming: request bodies with a Content-Length (spliced past
// what the proxy buffered) are framed exactly: a request pipelined right
// after a large body is still parsed and judged — an allowed one is
// answered, one whose Host is denied cuts the connection.
func TestProxyBodyFraming(t *testing.T) {
	e := newEnv(t)
	e.attach("sb1", sb1, policyAll())
	e.resolve(sb1, "allowed.test")
	const size = 1 << 20
	body := strings.Repeat("x", size)
	req := func(host string, n int) string {
		return fmt.Sprintf("POST /up HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n%s", host, n, body[:n])
	}
	// Three requests in one write: small body, large body, small body.
	c := e.dial(sb1, e.httpDst)
	br := bufio.NewReader(c)
	if _, err := io.WriteString(c, req("allowed.test", 10)+req("allowed.test", size)+req("allowed.test", 3)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"body=10", fmt.Sprintf("body=%d", size), "body=3"} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("want %s: %v\n%s", want, err, e.ev)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.HasSuffix(string(b), want) {
			t.Fatalf("got %q, want …%s", b, want)
		}
	}
	// A large body, then a request for a denied name on the same connection.
	c = e.dial(sb1, e.httpDst)
	br = bufio.NewReader(c)
	io.WriteString(c, req("allowed.test", size))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	io.WriteString(c, req("denied.test", 1))
	if _, err := http.ReadResponse(br, nil); err == nil {
		t.Fatal("the request for a denied name after a large body was answered")
	}
	if len(e.ev.find(KindHTTP, false, "Host changed on a kept-alive connection")) == 0 {
		t.Fatalf("no denial of the second request:\n%s", e.ev)
	}
}
