package egress

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// testPolicy allows names, names to intercept and CIDRs.
type testPolicy struct {
	names     map[string]bool
	intercept map[string]bool
	inject    map[string]string // header → secret, on intercepted names
	cidrs     []netip.Prefix
	udpCIDRs  []netip.Prefix  // udp by address
	udpNames  map[string]bool // udp by name
}

var _ Policy = (*testPolicy)(nil)

func allow(names ...string) *testPolicy {
	p := &testPolicy{names: map[string]bool{}, intercept: map[string]bool{}}
	for _, n := range names {
		p.names[n] = true
	}
	return p
}

func (p *testPolicy) withCIDR(s string) *testPolicy {
	p.cidrs = append(p.cidrs, netip.MustParsePrefix(s))
	return p
}

func (p *testPolicy) Name(n string) Decision {
	if p.names[n] || p.intercept[n] {
		return Decision{Allow: true, Rule: 1}
	}
	return Decision{Rule: -1, Reason: "name " + n + " not allowed"}
}

func (p *testPolicy) Conn(name string, ip netip.Addr, port uint16, proto string) Decision {
	if proto == "udp" {
		for _, c := range p.udpCIDRs {
			if c.Contains(ip) {
				return Decision{Allow: true, Rule: 4, Reason: "udp cidr"}
			}
		}
		if name != "" && p.udpNames[name] {
			return Decision{Allow: true, Rule: 5, ByName: true, Reason: "udp name"}
		}
		return Decision{Rule: -1, Reason: fmt.Sprintf("no udp rule for %q %v:%d", name, ip, port)}
	}
	if name != "" && p.names[name] {
		return Decision{Allow: true, Rule: 1, ByName: true, TLS: "passthrough"}
	}
	if name != "" && p.intercept[name] {
		return Decision{Allow: true, Rule: 3, ByName: true, TLS: "intercept", Inject: p.inject}
	}
	for _, c := range p.cidrs {
		if c.Contains(ip) {
			return Decision{Allow: true, Rule: 2}
		}
	}
	return Decision{Rule: -1, Reason: fmt.Sprintf("no rule allows %q %v:%d", name, ip, port)}
}

// clock is a settable Config.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// events collects the gateway's events.
type events struct {
	mu  sync.Mutex
	evs []Event
}

func (e *events) add(ev Event) { e.mu.Lock(); e.evs = append(e.evs, ev); e.mu.Unlock() }

// find returns the events matching kind, allowed and a reason substring.
func (e *events) find(kind string, allowed bool, reason string) []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []Event
	for _, ev := range e.evs {
		if ev.Kind == kind && ev.Allowed == allowed && strings.Contains(ev.Reason, reason) {
			out = append(out, ev)
		}
	}
	return out
}

func (e *events) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var b strings.Builder
	for _, ev := range e.evs {
		fmt.Fprintf(&b, "  %s sb=%q name=%q sni=%q host=%q %v:%d allowed=%v rule=%d %q\n", ev.Kind, ev.SandboxID, ev.Name, ev.SNI, ev.Host, ev.IP, ev.Port, ev.Allowed, ev.Rule, ev.Reason)
	}
	return b.String()
}

// dstTable is the tests' OriginalDst: the destination each client
// connection (by its local address) stands for.
type dstTable struct {
	mu   sync.Mutex
	cond *sync.Cond
	m    map[netip.AddrPort]netip.AddrPort
}

func newDstTable() *dstTable {
	d := &dstTable{m: map[netip.AddrPort]netip.AddrPort{}}
	d.cond = sync.NewCond(&d.mu)
	return d
}

func (d *dstTable) set(client, dst netip.AddrPort) {
	d.mu.Lock()
	d.m[client] = dst
	d.mu.Unlock()
	d.cond.Broadcast()
}

func (d *dstTable) originalDst(c net.Conn) (netip.AddrPort, error) {
	client := addrPortOf(c.RemoteAddr())
	deadline := time.Now().Add(10 * time.Second)
	t := time.AfterFunc(10*time.Second, d.cond.Broadcast)
	defer t.Stop()
	d.mu.Lock()
	defer d.mu.Unlock()
	for {
		if dst, ok := d.m[client]; ok {
			return dst, nil
		}
		if time.Now().After(deadline) {
			return netip.AddrPort{}, fmt.Errorf("test: no destination for %v", client)
		}
		d.cond.Wait()
	}
}

// upstream is an authoritative DNS server for the test names.
type upstream struct {
	addr string
	mu   sync.Mutex
	zone map[string][]dns.RR
	opts [][]dns.EDNS0 // the EDNS0 options of every query seen
	do   []bool
	tcp  int // queries over TCP
}

func (u *upstream) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	q := r.Question[0]
	u.mu.Lock()
	if o := r.IsEdns0(); o != nil {
		u.opts = append(u.opts, o.Option)
		u.do = append(u.do, o.Do())
	} else {
		u.opts = append(u.opts, nil)
		u.do = append(u.do, false)
	}
	_, tcp := w.RemoteAddr().(*net.TCPAddr)
	if tcp {
		u.tcp++
	}
	rrs, ok := u.zone[strings.ToLower(q.Name)]
	u.mu.Unlock()
	if !ok {
		m.Rcode = dns.RcodeNameError
	}
	for _, rr := range rrs {
		if rr.Header().Rrtype == q.Qtype || rr.Header().Rrtype == dns.TypeCNAME {
			m.Answer = append(m.Answer, rr)
		}
	}
	// A CNAME's target records, as a recursive resolver would add them.
	for _, rr := range m.Answer {
		if c, ok := rr.(*dns.CNAME); ok {
			for _, t := range u.zone[c.Target] {
				if t.Header().Rrtype == q.Qtype {
					m.Answer = append(m.Answer, t)
				}
			}
		}
	}
	if !tcp {
		size := dns.MinMsgSize
		if o := r.IsEdns0(); o != nil {
			size = int(o.UDPSize())
		}
		m.Truncate(size)
	}
	_ = w.WriteMsg(m)
}

func rr(t testing.TB, s string) dns.RR {
	r, err := dns.NewRR(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func startUpstream(t testing.TB) *upstream {
	u := &upstream{zone: map[string][]dns.RR{}}
	add := func(s string) { r := rr(t, s); n := r.Header().Name; u.zone[n] = append(u.zone[n], r) }
	add("allowed.test. 300 IN A 127.0.1.1")
	add("denied.test. 300 IN A 127.0.1.1")
	add("tls.test. 300 IN A 127.0.1.2")
	add("other.test. 300 IN A 127.0.1.3")
	add("alias.test. 300 IN CNAME target.test.")
	add("target.test. 300 IN A 127.0.1.1")
	add("short.test. 1 IN A 127.0.1.1")
	add("long.test. 86400 IN A 127.0.1.1")
	add("allowed.test. 300 IN TXT \"hello\"")
	for i := range 100 {
		add(fmt.Sprintf("big.test. 300 IN A 10.0.0.%d", i+1))
	}
	var pc net.PacketConn
	var l net.Listener
	for range 20 {
		var err error
		pc, err = net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l, err = net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			break
		}
		pc.Close()
		pc = nil
	}
	if pc == nil {
		t.Fatal("no UDP+TCP port pair for the upstream DNS server")
	}
	u.addr = pc.LocalAddr().String()
	su := &dns.Server{PacketConn: pc, Handler: u}
	st := &dns.Server{Listener: l, Handler: u}
	go su.ActivateAndServe()
	go st.ActivateAndServe()
	t.Cleanup(func() { pc.Close(); l.Close() })
	return u
}

// testCA signs the TLS test servers' certificate.
func testCA(t testing.TB, names ...string) (tls.Certificate, *x509.CertPool) {
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "egress test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTpl, caTpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

// env is a gateway on loopback with its test "internet": an HTTP
// server on 127.0.1.1, TLS servers on 127.0.1.2 (tls.test) and
// 127.0.1.3 (other.test, the same certificate: a shared CDN address),
// a server-speaks-first one on 127.0.1.4, and the upstream DNS server.
type env struct {
	t         testing.TB
	gw        *Gateway
	up        *upstream
	ev        *events
	clock     *clock
	dsts      *dstTable
	dnsAddr   string
	dnsTCP    string
	proxyAddr netip.AddrPort
	httpDst   netip.AddrPort
	tlsDst    netip.AddrPort
	otherDst  netip.AddrPort
	bannerDst netip.AddrPort
	pool      *x509.CertPool
	hostAddr  atomic.Pointer[netip.Addr] // what Config.IsHostAddr says is the host's (setHost)
}

// setHost makes ip the host's address for the gateway (invalid: none).
func (e *env) setHost(ip netip.Addr) { e.hostAddr.Store(&ip) }

func (e *env) isHost(ip netip.Addr) bool {
	h := e.hostAddr.Load()
	return h != nil && h.IsValid() && *h == ip
}

func listen(t testing.TB, addr string) net.Listener {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func newEnv(t testing.TB) *env {
	e := &env{t: t, up: startUpstream(t), ev: &events{}, clock: &clock{t: time.Unix(1_700_000_000, 0)}, dsts: newDstTable()}
	e.gw = New(Config{
		Upstreams:   []string{e.up.addr},
		OriginalDst: e.dsts.originalDst,
		OnEvent:     e.ev.add,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		Now:         e.clock.Now,
		IsHostAddr:  e.isHost,
	})
	t.Cleanup(func() { e.gw.Close() })

	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/headers" { // what reached the upstream
			fmt.Fprintf(w, "proto=%s host=%s authorization=%q x-guest=%q", r.Proto, r.Host, r.Header.Get("Authorization"), r.Header.Get("X-Guest"))
			return
		}
		n, _ := io.Copy(io.Discard, r.Body)
		sni := ""
		if r.TLS != nil {
			sni = r.TLS.ServerName
		}
		fmt.Fprintf(w, "host=%s sni=%s body=%d", r.Host, sni, n)
	})
	hl := listen(t, "127.0.1.1:0")
	go (&http.Server{Handler: echo}).Serve(hl)
	e.httpDst = addrPortOf(hl.Addr())

	cert, pool := testCA(t, "tls.test", "other.test")
	e.pool = pool
	for _, a := range []struct {
		ip  string
		dst *netip.AddrPort
	}{{"127.0.1.2:0", &e.tlsDst}, {"127.0.1.3:0", &e.otherDst}} {
		l := listen(t, a.ip)
		srv := &http.Server{Handler: echo, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, ErrorLog: log.New(io.Discard, "", 0)}
		go srv.ServeTLS(l, "", "")
		*a.dst = addrPortOf(l.Addr())
	}
	bl := listen(t, "127.0.1.4:0")
	go func() {
		for {
			c, err := bl.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "SSH-2.0-test\r\n")
			c.Close()
		}
	}()
	e.bannerDst = addrPortOf(bl.Addr())

	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.dnsAddr = pc.LocalAddr().String()
	go e.gw.ServeDNS(pc)
	dl := listen(t, "127.0.0.1:0")
	e.dnsTCP = dl.Addr().String()
	go e.gw.ServeDNSTCP(dl)
	pl := listen(t, "127.0.0.1:0")
	e.proxyAddr = addrPortOf(pl.Addr())
	go e.gw.ServeProxy(pl)
	return e
}

func (e *env) attach(id, addr string, p Policy) {
	if err := e.gw.Attach(id, netip.MustParseAddr(addr), p); err != nil {
		e.t.Fatal(err)
	}
}

// query asks the gateway's DNS from src.
func (e *env) query(src, name string, qtype uint16) *dns.Msg {
	e.t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	return e.exchange(src, "udp", m)
}

func (e *env) exchange(src, network string, m *dns.Msg) *dns.Msg {
	e.t.Helper()
	c := &dns.Client{Net: network, Timeout: 10 * time.Second}
	addr := e.dnsAddr
	if network == "udp" {
		c.Dialer = &net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP(src)}}
	} else {
		c.Dialer = &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		addr = e.dnsTCP
	}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		e.t.Fatalf("dns %v from %s: %v", m.Question, src, err)
	}
	return r
}

func (e *env) resolve(src, name string) {
	e.t.Helper()
	if r := e.query(src, name, dns.TypeA); r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
		e.t.Fatalf("resolve %s from %s: %v", name, src, r)
	}
}

// dial connects from src to the proxy as a connection redirected from dst.
func (e *env) dial(src string, dst netip.AddrPort) net.Conn {
	e.t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", e.proxyAddr.String())
	if errors.Is(err, syscall.ECONNRESET) {
		// The gateway reset the connection before connect(2) returned.
		return resetPipe{err}
	}
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	e.dsts.set(addrPortOf(c.LocalAddr()), dst)
	// A safety net against a hung test, not an assertion on time.
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	return c
}

// resetPipe is a connection the peer reset while it was being made.
type resetPipe struct{ err error }

func (r resetPipe) Read([]byte) (int, error)         { return 0, r.err }
func (r resetPipe) Write([]byte) (int, error)        { return 0, r.err }
func (r resetPipe) Close() error                     { return nil }
func (r resetPipe) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (r resetPipe) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (r resetPipe) SetDeadline(time.Time) error      { return nil }
func (r resetPipe) SetReadDeadline(time.Time) error  { return nil }
func (r resetPipe) SetWriteDeadline(time.Time) error { return nil }

// client is an HTTP client whose every connection goes from src through
// the proxy as one redirected from dst.
func (e *env) client(src string, dst netip.AddrPort) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return e.dial(src, dst), nil
		},
		TLSClientConfig:   &tls.Config{RootCAs: e.pool},
		DisableKeepAlives: true,
	}}
}

func get(c *http.Client, url string) (string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// expectReset reads c until an error and fails unless it is an RST.
func expectReset(t testing.TB, c net.Conn) {
	t.Helper()
	buf := make([]byte, 4096)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("read: %v, want connection reset", err)
		}
		return
	}
}
