package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// DNS limits.
const (
	// upstreamUDPSize is the EDNS0 buffer size advertised upstream (the
	// DNS flag day 2020 value: no IP fragmentation).
	upstreamUDPSize = 1232
	// maxUpstreamRRs: an upstream answer with more records in all
	// sections is refused (SERVFAIL). An answer can never exceed 64 KiB:
	// UDP reads use a upstreamUDPSize buffer, TCP's length prefix is 16
	// bits.
	maxUpstreamRRs = 256
	// maxAddrs is how many A/AAAA records one answer hands out (and
	// attributes); the rest are dropped.
	maxAddrs = 32
	// maxChain bounds the CNAME chain followed in an answer.
	maxChain = 8
	// dnsTimeout bounds one forwarded query over every upstream.
	dnsTimeout = 5 * time.Second
	// upstreamTimeout bounds one exchange with one upstream.
	upstreamTimeout = 2 * time.Second
)

// ServeDNS answers the sandboxes' DNS queries arriving on pc (UDP) until
// pc is closed or the gateway is; it then returns an error wrapping
// net.ErrClosed, or ErrClosed.
func (g *Gateway) ServeDNS(pc net.PacketConn) error {
	return g.serveDNS(&dns.Server{PacketConn: pc, UDPSize: 4096}, pc, pc.Close)
}

// ServeDNSTCP answers DNS over TCP on l, like ServeDNS.
func (g *Gateway) ServeDNSTCP(l net.Listener) error {
	return g.serveDNS(&dns.Server{Listener: l}, l, l.Close)
}

func (g *Gateway) serveDNS(srv *dns.Server, key any, closeFn func() error) error {
	return g.serveDNSFor(srv, key, closeFn, nil)
}

// serveDNSFor serves srv; with sb set every query is sb's, whatever its
// source (its own listener: see AttachListeners).
func (g *Gateway) serveDNSFor(srv *dns.Server, key any, closeFn func() error, sb *sandbox) error {
	if !g.serving(key, closeFn) {
		return ErrClosed
	}
	defer g.unserving(key)
	srv.Handler = dns.HandlerFunc(g.handleDNS)
	if sb != nil {
		srv.Handler = dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) { g.answerDNS(w, req, sb) })
	}
	// Every request reaches handleDNS, which answers malformed ones
	// itself (with an event); only responses are dropped, so the
	// gateway is never a reflector.
	srv.MsgAcceptFunc = func(dh dns.Header) dns.MsgAcceptAction {
		if dh.Bits&(1<<15) != 0 {
			return dns.MsgIgnore
		}
		return dns.MsgAccept
	}
	srv.MsgInvalidFunc = func([]byte, error) {}
	err := srv.ActivateAndServe()
	if g.isClosed() {
		return ErrClosed
	}
	if err == nil {
		err = net.ErrClosed
	}
	return fmt.Errorf("egress dns: %w", err)
}

func remoteAddr(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.UDPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	case *net.TCPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

func (g *Gateway) handleDNS(w dns.ResponseWriter, req *dns.Msg) {
	g.answerDNS(w, req, g.sandboxByAddr(remoteAddr(w.RemoteAddr())))
}

// answerDNS answers req, a query of sb (nil: from no sandbox's address).
func (g *Gateway) answerDNS(w dns.ResponseWriter, req *dns.Msg, sb *sandbox) {
	src := remoteAddr(w.RemoteAddr())
	reply := func(rcode int, ev Event) {
		ev.Kind = KindDNS
		g.emit(ev)
		m := new(dns.Msg)
		m.SetRcode(req, rcode)
		m.Question = req.Question
		if len(m.Question) > 1 {
			m.Question = nil
		}
		m.RecursionAvailable = true
		if req.IsEdns0() != nil {
			m.SetEdns0(upstreamUDPSize, false)
		}
		_ = w.WriteMsg(m)
	}
	name := ""
	if len(req.Question) == 1 {
		name = req.Question[0].Name
	}
	if sb == nil {
		reply(dns.RcodeRefused, Event{Name: name, Reason: fmt.Sprintf("query from %v, which is no sandbox's address", src), Rule: -1})
		return
	}
	policy, _, detached := sb.snapshot()
	if detached {
		reply(dns.RcodeRefused, Event{SandboxID: sb.id, Name: name, Reason: "sandbox detached", Rule: -1})
		return
	}
	ev := Event{SandboxID: sb.id, Kind: KindDNS, Name: name, Rule: -1}
	if req.Opcode != dns.OpcodeQuery {
		ev.Reason = fmt.Sprintf("opcode %s is not served", dns.OpcodeToString[req.Opcode])
		reply(dns.RcodeNotImplemented, ev)
		return
	}
	if len(req.Question) != 1 {
		ev.Reason = fmt.Sprintf("%d questions in one query (one is served)", len(req.Question))
		reply(dns.RcodeFormatError, ev)
		return
	}
	q := req.Question[0]
	cname, ok := canonicalName(q.Name)
	if !ok {
		ev.Name = strings.ToValidUTF8(q.Name, "?")
		ev.Reason = "not a valid host name"
		reply(dns.RcodeRefused, ev)
		return
	}
	ev.Name = cname
	if q.Qclass != dns.ClassINET {
		ev.Reason = fmt.Sprintf("class %s is not served", dns.Class(q.Qclass))
		reply(dns.RcodeRefused, ev)
		return
	}
	switch q.Qtype {
	case dns.TypeA, dns.TypeAAAA, dns.TypeCNAME:
	default:
		// TXT, MX, SRV, HTTPS/SVCB (which would carry ECH keys and
		// address hints around the attribution), ANY, PTR …: a sandbox
		// reaches the network by name → address only.
		ev.Reason = fmt.Sprintf("query type %s is not served (A, AAAA and CNAME are)", dns.Type(q.Qtype))
		reply(dns.RcodeRefused, ev)
		return
	}
	d := policy.Name(cname)
	ev.Rule = d.Rule
	if !d.Allow {
		ev.Reason = d.Reason
		if ev.Reason == "" {
			ev.Reason = "name not allowed by policy"
		}
		reply(dns.RcodeRefused, ev)
		return
	}
	select {
	case sb.dnsInflight <- struct{}{}:
		defer func() { <-sb.dnsInflight }()
	default:
		ev.Reason = "too many queries in flight"
		reply(dns.RcodeRefused, ev)
		return
	}

	ctx, cancel := context.WithTimeout(context.Background(), dnsTimeout)
	defer cancel()
	up, err := g.forward(ctx, q)
	if err != nil {
		g.log.Warn("egress dns: upstream failed", "sandbox", sb.id, "name", cname, "err", err)
		ev.Reason = "upstream resolver failed: " + err.Error()
		reply(dns.RcodeServerFailure, ev)
		return
	}
	m, addrs := sanitize(req, q, up)
	if g.checksReach(policy) && len(addrs) > 0 {
		// DNS rebinding: an allowed name that resolves to an address no
		// connection may reach (private, loopback, the host's) does not
		// hand that address out.
		var kept []addrTTL
		var denied []string
		for _, a := range addrs {
			if d := g.reachable(policy, a.ip); d.Allow {
				kept = append(kept, a)
			} else {
				denied = append(denied, d.Reason)
			}
		}
		if len(denied) > 0 {
			m.Answer = slices.DeleteFunc(m.Answer, func(rr dns.RR) bool {
				var ip net.IP
				switch rr := rr.(type) {
				case *dns.A:
					ip = rr.A
				case *dns.AAAA:
					ip = rr.AAAA
				default:
					return false
				}
				a, _ := netip.AddrFromSlice(ip)
				return !g.reachable(policy, a.Unmap()).Allow
			})
			if len(kept) == 0 {
				ev.Reason = "the name resolves only to addresses no connection may reach (DNS rebinding): " + strings.Join(denied, "; ")
				reply(dns.RcodeRefused, ev)
				return
			}
			g.emit(Event{Kind: KindDNS, SandboxID: sb.id, Name: cname, Rule: -1,
				Reason: "addresses left out of the answer (DNS rebinding): " + strings.Join(denied, "; ")})
			addrs = kept
		}
	}
	now := g.now()
	for _, a := range addrs {
		g.record(sb, cname, a.ip, now.Add(a.ttl))
	}
	ev.Allowed, ev.Reason = true, d.Reason
	if len(addrs) > 0 {
		ev.IP = addrs[0].ip
	}
	g.emit(ev)
	if req.IsEdns0() != nil {
		m.SetEdns0(upstreamUDPSize, false)
	}
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
		size := dns.MinMsgSize
		if o := req.IsEdns0(); o != nil && int(o.UDPSize()) > size {
			size = min(int(o.UDPSize()), upstreamUDPSize)
		}
		m.Truncate(size)
	}
	_ = w.WriteMsg(m)
}

// forward asks the upstream resolvers q in a fresh query: a new id,
// recursion desired, EDNS0 with our buffer size and no option of the
// sandbox's (no client subnet, cookie, padding or DO bit passes).
func (g *Gateway) forward(ctx context.Context, q dns.Question) (*dns.Msg, error) {
	if len(g.cfg.Upstreams) == 0 {
		return nil, errors.New("no upstream resolver configured")
	}
	m := new(dns.Msg)
	m.SetQuestion(q.Name, q.Qtype)
	m.SetEdns0(upstreamUDPSize, false)
	var errs []error
	for _, up := range g.cfg.Upstreams {
		r, err := g.exchange(ctx, "udp", up, m)
		if err == nil && r.Truncated {
			r, err = g.exchange(ctx, "tcp", up, m)
		}
		if err == nil {
			err = checkReply(m, r)
		}
		if err == nil {
			return r, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", up, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

func (g *Gateway) exchange(ctx context.Context, network, addr string, m *dns.Msg) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, upstreamTimeout)
	defer cancel()
	c, err := g.dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	co := &dns.Conn{Conn: c, UDPSize: upstreamUDPSize}
	cl := &dns.Client{Net: network, UDPSize: upstreamUDPSize, Timeout: upstreamTimeout}
	r, _, err := cl.ExchangeWithConnContext(ctx, m, co)
	return r, err
}

func checkReply(q, r *dns.Msg) error {
	switch {
	case !r.Response:
		return errors.New("answer is not a response")
	case len(r.Question) != 1 || !strings.EqualFold(r.Question[0].Name, q.Question[0].Name) ||
		r.Question[0].Qtype != q.Question[0].Qtype:
		return errors.New("answer is for another question")
	case len(r.Answer)+len(r.Ns)+len(r.Extra) > maxUpstreamRRs:
		return fmt.Errorf("answer holds more than %d records", maxUpstreamRRs)
	case r.Rcode != dns.RcodeSuccess && r.Rcode != dns.RcodeNameError:
		return fmt.Errorf("answer code %s", dns.RcodeToString[r.Rcode])
	}
	return nil
}

type addrTTL struct {
	ip  netip.Addr
	ttl time.Duration
}

func clampTTL(ttl uint32) time.Duration {
	d := time.Duration(ttl) * time.Second
	return min(max(d, MinTTL), MaxTTL)
}

// sanitize builds the sandbox's answer from the upstream's: only the
// CNAME chain that starts at the asked name and the A/AAAA records of
// the names on it (at most maxAddrs), TTLs clamped to [MinTTL, MaxTTL],
// no authority or additional section. It returns the addresses to
// attribute to the asked name.
func sanitize(req *dns.Msg, q dns.Question, up *dns.Msg) (*dns.Msg, []addrTTL) {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Question = []dns.Question{q}
	m.Rcode = up.Rcode
	m.RecursionAvailable = true
	cur := dns.CanonicalName(q.Name)
	chain := map[string]bool{cur: true}
	for range maxChain {
		next := ""
		for _, rr := range up.Answer {
			if c, ok := rr.(*dns.CNAME); ok && dns.CanonicalName(c.Hdr.Name) == cur && c.Hdr.Class == dns.ClassINET {
				next = dns.CanonicalName(c.Target)
				c := *c
				c.Hdr.Ttl = uint32(clampTTL(c.Hdr.Ttl) / time.Second)
				m.Answer = append(m.Answer, &c)
				break
			}
		}
		if next == "" || chain[next] {
			break
		}
		chain[next] = true
		cur = next
	}
	var addrs []addrTTL
	for _, rr := range up.Answer {
		if len(addrs) >= maxAddrs {
			break
		}
		h := rr.Header()
		if h.Class != dns.ClassINET || !chain[dns.CanonicalName(h.Name)] {
			continue
		}
		var ip netip.Addr
		switch rr := rr.(type) {
		case *dns.A:
			if q.Qtype != dns.TypeA {
				continue
			}
			ip, _ = netip.AddrFromSlice(rr.A.To4())
			a := *rr
			a.Hdr.Ttl = uint32(clampTTL(a.Hdr.Ttl) / time.Second)
			m.Answer = append(m.Answer, &a)
		case *dns.AAAA:
			if q.Qtype != dns.TypeAAAA {
				continue
			}
			ip, _ = netip.AddrFromSlice(rr.AAAA.To16())
			a := *rr
			a.Hdr.Ttl = uint32(clampTTL(a.Hdr.Ttl) / time.Second)
			m.Answer = append(m.Answer, &a)
		default:
			continue
		}
		if ip.IsValid() {
			addrs = append(addrs, addrTTL{ip.Unmap(), clampTTL(h.Ttl)})
		}
	}
	return m, addrs
}
