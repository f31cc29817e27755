package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/egress"
	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/netpolicy"
	"github.com/airlock/airlock/internal/network"
	"github.com/airlock/airlock/internal/runtime/fake"
	"github.com/airlock/airlock/internal/worker"
)

// TestReasonCode pins the mapping of the gateway's reasons onto the
// fixed set of codes: reasons the real policy code produces (so that a
// rewording in netpolicy fails here) and the gateway's own words.
func TestReasonCode(t *testing.T) {
	mustCompile := func(doc string) *netpolicy.Compiled {
		t.Helper()
		p, err := netpolicy.Parse([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		c, err := netpolicy.Compile(p, netpolicy.DefaultGuard(netip.MustParsePrefix("198.51.100.7/32")))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	deny := mustCompile(`{"version":1,"default":"deny","rules":[{"action":"allow","domains":["ok.test"]},{"action":"deny","domains":["*.bad.test"]}]}`)
	allow := mustCompile(`{"version":1,"default":"allow"}`)
	ip := netip.MustParseAddr
	type dec struct {
		allowed bool
		rule    int
		reason  string
	}
	of := func(d netpolicy.Decision) dec { return dec{d.Allow, d.Rule, d.Reason} }
	cases := []struct {
		d    dec
		want string
	}{
		// netpolicy's own decisions.
		{of(deny.Name("ok.test")), model.NetCodeRule},
		{of(deny.Name("x.bad.test")), model.NetCodeRule},
		{of(deny.Name("other.test")), model.NetCodeDefault},
		{of(allow.Name("other.test")), model.NetCodeDefault},
		{of(deny.Conn("ok.test", ip("192.0.2.1"), 443, "tcp")), model.NetCodeRule},
		{of(deny.Conn("", ip("192.0.2.1"), 443, "tcp")), model.NetCodeDefault},
		{of(allow.Conn("", ip("192.0.2.1"), 443, "tcp")), model.NetCodeDefault},
		{of(allow.Conn("", ip("10.0.0.1"), 80, "tcp")), model.NetCodeGuard},
		{of(allow.Conn("", ip("169.254.169.254"), 80, "tcp")), model.NetCodeGuard},
		{of(allow.Conn("", ip("127.0.0.1"), 80, "tcp")), model.NetCodeGuard},
		{of(allow.Conn("", ip("198.51.100.7"), 80, "tcp")), model.NetCodeGuard}, // the host
		{of(allow.Conn("", ip("100.64.0.1"), 80, "tcp")), model.NetCodeGuard},
		{of(allow.Conn("", ip("192.0.2.1"), 0, "tcp")), model.NetCodeGuard},
		{of(allow.Conn("", ip("2001:db8::1"), 443, "tcp")), model.NetCodeProtocol},
		{of(allow.Conn("", ip("192.0.2.1"), 53, "udp")), model.NetCodeProtocol},
		{of(allow.Conn("a_b.test", ip("192.0.2.1"), 443, "tcp")), model.NetCodeProtocol},
		{of(allow.Reachable(ip("10.0.0.1"))), model.NetCodeGuard},
		// The gateway's words (internal/egress).
		{dec{false, -1, "sandbox detached"}, model.NetCodeUnattached},
		{dec{false, -1, "query from 100.64.0.9:5353, which is no sandbox's address"}, model.NetCodeUnattached},
		{dec{false, -1, "connection from 100.64.0.9:40000, which is no sandbox's address"}, model.NetCodeUnattached},
		{dec{false, -1, "opcode UPDATE is not served"}, model.NetCodeProtocol},
		{dec{false, -1, "2 questions in one query (one is served)"}, model.NetCodeProtocol},
		{dec{false, -1, "not a valid host name"}, model.NetCodeProtocol},
		{dec{false, -1, "class CHAOS is not served"}, model.NetCodeProtocol},
		{dec{false, -1, "query type TXT is not served (A, AAAA and CNAME are)"}, model.NetCodeProtocol},
		{dec{false, -1, "too many queries in flight"}, model.NetCodeLimit},
		{dec{false, -1, "sandbox has 4096 connections open (the most)"}, model.NetCodeLimit},
		{dec{false, -1, "upstream resolver failed: 192.0.2.53:53: i/o timeout"}, model.NetCodeUpstream},
		{dec{false, -1, "the name resolves only to addresses no connection may reach (DNS rebinding): 10.0.0.1 is private (10.0.0.0/8) and never reachable"}, model.NetCodeRebinding},
		{dec{false, -1, "addresses left out of the answer (DNS rebinding): 127.0.0.1 is loopback and never reachable"}, model.NetCodeRebinding},
		{dec{false, -1, "connection to the gateway itself"}, model.NetCodeGuard},
		{dec{false, -1, "nothing sent within 300ms: the connection names no host"}, model.NetCodeNoName},
		{dec{false, -1, "client closed before naming a host: EOF"}, model.NetCodeNoName},
		{dec{false, 0, "a domain rule cannot admit a connection that names no host"}, model.NetCodeNoName},
		{dec{false, 0, "192.0.2.5 was not resolved for ok.test by this sandbox (it was for [a.test])"}, model.NetCodeAttribution},
		{dec{false, -1, "Host 192.0.2.9 is not the destination 192.0.2.5"}, model.NetCodeAttribution},
		{dec{false, 0, "the rule intercepts TLS, but no org CA reached the gateway for this sandbox"}, model.NetCodeInterception},
		{dec{false, 0, "policy updated: the rule intercepts TLS, but no org CA reached the gateway for this sandbox"}, model.NetCodeInterception},
		{dec{false, 0, "policy updated: the connection's name is intercepted now (reconnect)"}, model.NetCodeInterception},
		{dec{false, 0, "policy updated: the connection's name is no longer intercepted (reconnect)"}, model.NetCodeInterception},
		{dec{false, -1, "interception: upstream certificate for a.test is not trusted: x509: certificate signed by unknown authority"}, model.NetCodeInterception},
		{dec{false, -1, "interception: TLS handshake with the sandbox failed (does it trust the org's Airlock CA?): EOF"}, model.NetCodeInterception},
		{dec{false, -1, `secret "openai" of header Authorization is not set for the sandbox's org`}, model.NetCodeInterception},
		{dec{false, -1, "Host b.test does not match the connection's SNI a.test"}, model.NetCodeAttribution},
		{dec{false, -1, "absolute URI for b.test on a connection to a.test"}, model.NetCodeProtocol},
		{dec{false, -1, "CONNECT through an intercepted connection"}, model.NetCodeProtocol},
		{dec{false, -1, "198.51.100.9 is an address of the host and never reachable"}, model.NetCodeGuard},
		{dec{false, -1, "no rule allows udp to this address"}, model.NetCodeProtocol},
		{dec{false, -1, "sandbox has 256 UDP flows open (the most)"}, model.NetCodeLimit},
		{dec{false, -1, "dial: dial udp 192.0.2.1:443: connect: network is unreachable"}, model.NetCodeUpstream},
		{dec{false, 1, "policy updated: rule 1 denies *.bad.test"}, model.NetCodeRule},
		{dec{false, -1, "Host changed on a kept-alive connection: default deny"}, model.NetCodeDefault},
		{dec{false, -1, "Host changed on a kept-alive connection: 192.0.2.5 was not resolved for b.test by this sandbox"}, model.NetCodeAttribution},
		{dec{false, -1, "TLS ClientHello larger than 16 KiB"}, model.NetCodeProtocol},
		{dec{false, -1, "malformed TLS ClientHello: tls: unexpected message"}, model.NetCodeProtocol},
		{dec{false, -1, "handshake ended without a ClientHello"}, model.NetCodeProtocol},
		{dec{false, -1, "nothing recognisable sent within 10s"}, model.NetCodeProtocol},
		{dec{false, -1, "HTTP request header larger than 16 KiB"}, model.NetCodeProtocol},
		{dec{false, -1, "client closed inside the request header: EOF"}, model.NetCodeProtocol},
		{dec{false, -1, "CONNECT refused: the gateway is not a forward proxy"}, model.NetCodeProtocol},
		{dec{false, -1, `request target "http://x/" refused: only origin-form (a path) is served, not a proxy's absolute URI`}, model.NetCodeProtocol},
		{dec{false, -1, "protocol upgrade over plain HTTP refused (use TLS)"}, model.NetCodeProtocol},
		{dec{false, -1, "request has 2 Host headers (exactly one is required)"}, model.NetCodeProtocol},
		{dec{false, -1, `Transfer-Encoding "gzip" refused (only one chunked is served)`}, model.NetCodeProtocol},
		{dec{false, -1, "chunked body: chunk not followed by CRLF"}, model.NetCodeProtocol},
		{dec{false, -1, "malformed HTTP request: bare CR, LF or NUL"}, model.NetCodeProtocol},
		// What the guest sends cannot pick the code: a quoted SNI is
		// judged by the words around it.
		{dec{false, -1, `invalid SNI "x DNS rebinding was not resolved for"`}, model.NetCodeProtocol},
		{dec{false, -1, "SO_ORIGINAL_DST: bad file descriptor"}, model.NetCodeOther},
		{dec{true, 0, "rule 0 allows ok.test"}, model.NetCodeRule},
		{dec{true, -1, "default allow"}, model.NetCodeDefault},
	}
	for _, c := range cases {
		if got := reasonCode(c.d.allowed, c.d.rule, c.d.reason); got != c.want {
			t.Errorf("reasonCode(%v, %d, %q) = %s, want %s", c.d.allowed, c.d.rule, c.d.reason, got, c.want)
		}
	}
}

// gatewayRig is a real egress gateway on loopback serving one sandbox's
// listeners, with the worker's recorder behind its OnEvent: the original
// destination of a connection is the one the test set before dialling it
// (one connection at a time), admitted connections reach one
// local HTTP server, the upstream resolver answers 192.0.2.10 for every
// name.
type gatewayRig struct {
	gw        *egress.Gateway
	dnsAddr   string
	proxyAddr string
	mu        sync.Mutex
	dst       netip.AddrPort // of the next connection
}

func startGatewayRig(t *testing.T, id, policy string, rec *egressRecorder) *gatewayRig {
	t.Helper()
	up, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	upSrv := &dns.Server{PacketConn: up, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		if q.Question[0].Qtype == dns.TypeA {
			rr, _ := dns.NewRR(q.Question[0].Name + " 60 IN A 192.0.2.10")
			m.Answer = append(m.Answer, rr)
		}
		_ = w.WriteMsg(m)
	})}
	go upSrv.ActivateAndServe()
	t.Cleanup(func() { upSrv.Shutdown() })

	web, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go (&http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello %s", r.Host) })}).Serve(web)
	t.Cleanup(func() { web.Close() })

	r := &gatewayRig{}
	r.gw = egress.New(egress.Config{
		Upstreams: []string{up.LocalAddr().String()},
		OnEvent:   rec.record,
		Logger:    newLogger("error"),
		OriginalDst: func(net.Conn) (netip.AddrPort, error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.dst, nil
		},
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if strings.HasPrefix(addr, "192.0.2.") {
				addr = web.Addr().String() // every admitted destination is the local server
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	})
	t.Cleanup(func() { r.gw.Close() })
	p, err := netpolicy.Parse([]byte(policy))
	if err != nil {
		t.Fatal(err)
	}
	c, err := netpolicy.Compile(p, netpolicy.DefaultGuard())
	if err != nil {
		t.Fatal(err)
	}
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dl, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.gw.AttachListeners(id, egress.FromPolicy(c), pl, dl, nil); err != nil {
		t.Fatal(err)
	}
	r.dnsAddr, r.proxyAddr = dl.LocalAddr().String(), pl.Addr().String()
	return r
}

// query asks the gateway one question and returns the rcode.
func (r *gatewayRig) query(t *testing.T, name string, qtype uint16) int {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	in, err := dns.Exchange(m, r.dnsAddr)
	if err != nil {
		t.Fatalf("query %s: %v", name, err)
	}
	return in.Rcode
}

// get sends one HTTP request for host through the proxy as a connection
// to dst, and returns the answer's first line ("" when reset).
func (r *gatewayRig) get(t *testing.T, dst, host string) string {
	t.Helper()
	r.mu.Lock()
	r.dst = netip.MustParseAddrPort(dst)
	r.mu.Unlock()
	c, err := net.Dial("tcp", r.proxyAddr)
	if errors.Is(err, syscall.ECONNRESET) {
		// The gateway resets a denied connection as soon as it accepts
		// it; on a loaded machine the reset can arrive before the dial
		// has read the socket's status.
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host)
	line, _ := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line)
}

// TestEgressRecorderFromRealGateway: the decisions of a real gateway
// (DNS and proxy on loopback) reach the sandbox's network log with their
// codes, its denials are queued for the server, and /metrics counts them
// by kind, decision and code.
func TestEgressRecorderFromRealGateway(t *testing.T) {
	const id = "sb-rig"
	nl := worker.NewNetLog()
	m := newMetrics()
	rec := &egressRecorder{log: nl, metrics: m}
	r := startGatewayRig(t, id, `{"version":1,"default":"deny","rules":[{"action":"allow","domains":["ok.test"]},{"action":"deny","domains":["bad.test"]}]}`, rec)

	if rc := r.query(t, "ok.test", dns.TypeA); rc != dns.RcodeSuccess {
		t.Errorf("ok.test: rcode %d", rc)
	}
	for _, q := range []struct {
		name  string
		qtype uint16
	}{{"bad.test", dns.TypeA}, {"else.test", dns.TypeA}, {"ok.test", dns.TypeTXT}} {
		if rc := r.query(t, q.name, q.qtype); rc != dns.RcodeRefused {
			t.Errorf("%s type %d: rcode %d, want REFUSED", q.name, q.qtype, rc)
		}
	}
	if got := r.get(t, "192.0.2.10:80", "ok.test"); got != "HTTP/1.1 200 OK" {
		t.Errorf("allowed request: %q", got)
	}
	if got := r.get(t, "192.0.2.11:80", "ok.test"); got != "" {
		t.Errorf("request to an address not resolved for ok.test: %q, want a reset", got)
	}
	if got := r.get(t, "10.0.0.1:80", "ok.test"); got != "" {
		t.Errorf("request to a private address: %q, want a reset", got)
	}

	type row struct{ kind, decision, name, ip, code string }
	want := []row{
		{"dns", "allowed", "ok.test", "192.0.2.10", "rule"},
		{"dns", "denied", "bad.test", "", "rule"},
		{"dns", "denied", "else.test", "", "default"},
		{"dns", "denied", "ok.test", "", "protocol"},
		{"tcp", "allowed", "ok.test", "192.0.2.10", "rule"},
		{"tcp", "denied", "ok.test", "192.0.2.11", "attribution"},
		{"tcp", "denied", "", "10.0.0.1", "guard"},
	}
	p, ok := nl.Page(id, 0, 0)
	if !ok {
		t.Fatal("no network log for the sandbox")
	}
	var got []row
	for _, e := range p.Entries {
		got = append(got, row{e.Kind, e.Decision, e.Name, e.IP, e.Code})
		if e.Reason == "" || e.Time.IsZero() {
			t.Errorf("entry %d has no reason or time: %+v", e.Seq, e)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("network log:\n got %v\nwant %v", got, want)
	}
	if ds := nl.Take(100); len(ds) != 5 || ds[0].Name != "bad.test" || ds[0].Reason != "rule 1 denies bad.test" || ds[0].Rule != 1 {
		t.Errorf("queued denials: %+v", ds)
	}

	addr, err := serveMetrics(t.Context(), "127.0.0.1:0", m, newLogger("error"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, line := range []string{
		`airlock_egress_decisions_total{decision="allowed",kind="dns",reason="rule"} 1`,
		`airlock_egress_decisions_total{decision="denied",kind="dns",reason="rule"} 1`,
		`airlock_egress_decisions_total{decision="denied",kind="dns",reason="default"} 1`,
		`airlock_egress_decisions_total{decision="denied",kind="dns",reason="protocol"} 1`,
		`airlock_egress_decisions_total{decision="allowed",kind="tcp",reason="rule"} 1`,
		`airlock_egress_decisions_total{decision="denied",kind="tcp",reason="attribution"} 1`,
		`airlock_egress_decisions_total{decision="denied",kind="tcp",reason="guard"} 1`,
		`airlock_egress_decisions_total{decision="denied",kind="http",reason="rule"} 0`,
		"go_goroutines ",
	} {
		if !strings.Contains(string(body), line) {
			t.Errorf("/metrics lacks %q", line)
		}
	}
	if strings.Contains(string(body), "ok.test") || strings.Contains(string(body), "192.0.2") {
		t.Error("/metrics carries names or addresses")
	}
}

// TestNetworkLogOnFakeStack: decisions recorded on the worker of the
// stack of `airlock up` are read through GET
// /v1/sandboxes/{id}/network/log (service → worker data plane), org
// scoped, through suspend and wake; a denial arrives on the sandbox's SSE
// stream as network.denied; a flood of denials is merged and
// rate-limited, with every denial accounted for in count and suppressed;
// a deleted sandbox has an empty log with a note.
func TestNetworkLogOnFakeStack(t *testing.T) {
	nl := worker.NewNetLog()
	s := startFakeStack(t, func(c *worker.Config) { c.NetLog = nl })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rec := &egressRecorder{log: nl}

	sb, op, err := s.c.CreateSandbox(ctx, client.CreateSandboxRequest{Runtime: fake.Name, Resources: model.Resources{VCPUs: 1, MemoryMiB: 256}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if op, err = s.c.WaitOperation(ctx, op.ID); err != nil || op.State != model.OpSucceeded {
		t.Fatalf("create: %v %+v", err, op)
	}
	denials := make(chan model.NetDenial, 1024)
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	go func() {
		for ev, err := range s.c.Events(sctx, sb.ID, 0) {
			if err != nil {
				return
			}
			if ev.Type != events.TypeNetworkDenied {
				continue
			}
			var d model.NetDenial
			if err := json.Unmarshal(ev.Data, &d); err != nil || ev.SandboxID != sb.ID {
				t.Errorf("network.denied event: %v %+v", err, ev)
			}
			denials <- d
		}
	}()
	next := func(what string) model.NetDenial {
		t.Helper()
		select {
		case d := <-denials:
			return d
		case <-ctx.Done():
			t.Fatalf("no network.denied event for %s", what)
			return model.NetDenial{}
		}
	}

	rec.record(egress.Event{SandboxID: sb.ID, Kind: egress.KindDNS, Name: "ok.test", IP: netip.MustParseAddr("192.0.2.10"), Allowed: true, Rule: 0, Reason: "rule 0 allows ok.test"})
	rec.record(egress.Event{SandboxID: sb.ID, Kind: egress.KindDNS, Name: "evil.test", Rule: -1, Reason: "default deny"})
	d := next("evil.test")
	if d.Name != "evil.test" || d.Kind != "dns" || d.Decision != "denied" || d.Rule != -1 || d.Code != "default" || d.Reason != "default deny" || d.Count != 1 || d.Seq != 2 || d.Time.IsZero() {
		t.Errorf("network.denied: %+v", d)
	}

	lg, err := s.c.NetworkLog(ctx, sb.ID, 0, 0)
	if err != nil || len(lg.Entries) != 2 || lg.Next != 2 || lg.Entries[0].Decision != "allowed" || lg.Entries[1].Name != "evil.test" {
		t.Fatalf("network log: %+v %v", lg, err)
	}
	if lg, err = s.c.NetworkLog(ctx, sb.ID, 1, 0); err != nil || len(lg.Entries) != 1 || lg.Entries[0].Seq != 2 {
		t.Errorf("after 1: %+v %v", lg, err)
	}
	var ae *client.APIError
	if _, err := s.c.NetworkLog(ctx, sb.ID, 0, 5000); !errors.As(err, &ae) || ae.Status != http.StatusUnprocessableEntity {
		t.Errorf("limit 5000: %v, want 422", err)
	}

	// Another org's key does not see it.
	org, err := s.c.CreateOrg(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	k, err := s.c.CreateKey(ctx, org.ID, client.CreateKeyRequest{Name: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.New(s.c.BaseURL, k.Secret).NetworkLog(ctx, sb.ID, 0, 0); !errors.As(err, &ae) || ae.Status != http.StatusNotFound {
		t.Errorf("another org's key: %v, want 404", err)
	}

	// A flood of distinct denied names: merged and rate-limited on the
	// worker and the server, never lost from the log.
	const flood = 1000
	for i := range flood {
		rec.record(egress.Event{SandboxID: sb.ID, Kind: egress.KindDNS, Name: fmt.Sprintf("flood%d.test", i), Rule: -1, Reason: "default deny"})
	}
	recorded := 2 + flood
	published, accounted := 1, 1
	for probe := 0; ; probe++ {
		rec.record(egress.Event{SandboxID: sb.ID, Kind: egress.KindDNS, Name: fmt.Sprintf("probe%d.test", probe), Rule: -1, Reason: "default deny"})
		recorded++
		done := false
		for !done {
			select {
			case d := <-denials:
				published++
				accounted += d.Count + int(d.Suppressed)
				done = d.Suppressed > 0
			case <-time.After(300 * time.Millisecond): // no event yet: probe again (the limits refill by the second)
				done = true
			case <-ctx.Done():
				t.Fatalf("no event reported the suppressed denials (%d published)", published)
			}
		}
		if accounted >= 1+flood {
			break
		}
	}
	t.Logf("%d denials recorded, %d network.denied events published, %d accounted for", recorded-1, published, accounted)
	if published > 1+20+(recorded-2-flood) {
		t.Errorf("%d events published for %d denials: the rate limit did not hold", published, recorded-1)
	}
	if accounted > recorded-1 {
		t.Errorf("events account for %d denials, more than the %d recorded", accounted, recorded-1)
	}
	if lg, err = s.c.NetworkLog(ctx, sb.ID, 0, 0); err != nil || lg.Next != int64(recorded) || len(lg.Entries) != model.NetLogSize || lg.Missed != int64(recorded-model.NetLogSize) {
		t.Errorf("the log after the flood: next %d (want %d), %d entries, missed %d: %v", lg.Next, recorded, len(lg.Entries), lg.Missed, err)
	}

	// Suspend and wake on the same worker: the log stays.
	s.do(t, ctx, "suspend", sb.ID, s.c.SuspendSandbox, model.StateSuspended)
	if lg, err = s.c.NetworkLog(ctx, sb.ID, int64(recorded-1), 0); err != nil || len(lg.Entries) != 1 {
		t.Errorf("suspended: %+v %v", lg, err)
	}
	if got, _ := s.c.GetSandbox(ctx, sb.ID); got.State != model.StateSuspended {
		t.Errorf("reading the log woke the sandbox: %s", got.State)
	}
	s.do(t, ctx, "wake", sb.ID, s.c.WakeSandbox, model.StateRunning)
	if lg, err = s.c.NetworkLog(ctx, sb.ID, int64(recorded-1), 0); err != nil || len(lg.Entries) != 1 {
		t.Errorf("woken: %+v %v", lg, err)
	}

	// Deleted: on no worker, an empty log that says so.
	s.do(t, ctx, "delete", sb.ID, s.c.DeleteSandbox, model.StateDeleted)
	if lg, err = s.c.NetworkLog(ctx, sb.ID, 0, 0); err != nil || len(lg.Entries) != 0 || !strings.Contains(lg.Note, "on no worker") {
		t.Errorf("deleted: %+v %v", lg, err)
	}
}

func TestSandboxCIDR(t *testing.T) {
	l, err := linkOf("100.64.0.0/30")
	if err != nil || l != network.DefaultLink {
		t.Fatalf("the default --sandbox-cidr: %+v %v, want %+v", l, err, network.DefaultLink)
	}
	l, err = linkOf("10.200.0.8/29")
	if err != nil || l.Gateway.String() != "10.200.0.9" || l.Guest.String() != "10.200.0.10/29" {
		t.Fatalf("10.200.0.8/29: %+v %v", l, err)
	}
	for _, bad := range []string{"x", "2001:db8::/64", "10.0.0.0/31", "10.0.0.0/32"} {
		if _, err := linkOf(bad); err == nil || !strings.Contains(err.Error(), "--sandbox-cidr") {
			t.Errorf("%q: %v, want an error naming --sandbox-cidr", bad, err)
		}
	}
}
