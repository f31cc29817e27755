package egress

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"reflect"
	"sort"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Policy is what the gateway asks of a sandbox's policy
// (netpolicy.Compiled implements it). Both methods must be safe for
// concurrent use and fast: they run on the data path.
type Policy interface {
	// Name decides whether the sandbox may resolve name (the DNS stage).
	// name is canonical: lower case, no trailing dot.
	Name(name string) Decision
	// Conn decides a connection to ip:port over proto ("tcp"). name is
	// the connection's SNI or HTTP Host (canonical), or "" for a
	// connection that named nothing (a raw-IP connect).
	Conn(name string, ip netip.Addr, port uint16, proto string) Decision
}

// Reacher is an optional power of a Policy: Reachable denies an address
// whatever name a connection to it or a DNS answer carrying it has (the
// guard: private, loopback, link-local, the host's own). The gateway
// leaves such addresses out of DNS answers and resets a connection to one
// at once, without waiting for its SNI or Host.
type Reacher interface {
	Reachable(ip netip.Addr) Decision
}

// Decision is a policy's answer.
type Decision struct {
	Allow bool
	// Rule is the index of the rule that decided (-1 or any value the
	// policy documents for its default).
	Rule   int
	Reason string
	// TLS is the matching rule's TLS mode: "passthrough" (or "") or
	// "intercept".
	TLS string
	// Inject maps the headers an intercepted request gets to the names
	// of the secrets (Interception.Secrets) that are their values.
	Inject map[string]string
	// ByName says the decision came from a domain rule. A connection
	// allowed ByName is admitted only when its destination IP was handed
	// to this sandbox by the gateway's DNS for that very name (DNS
	// attribution); an allow that is not ByName (a CIDR rule, a default
	// allow) admits by address.
	ByName bool
}

// Event kinds.
const (
	KindDNS  = "dns"
	KindTCP  = "tcp"
	KindHTTP = "http"
	KindUDP  = "udp"
)

// Event records one allowed or denied decision of the gateway.
type Event struct {
	Time      time.Time
	SandboxID string // "" when the source address belongs to no sandbox
	Kind      string // KindDNS, KindTCP or KindHTTP
	// Name is the DNS name asked (dns) or the name the connection was
	// judged by (tcp: SNI or Host; http: the request's Host).
	Name    string
	SNI     string
	Host    string
	IP      netip.Addr
	Port    uint16
	Allowed bool
	Rule    int
	Reason  string
}

// Config configures a Gateway. The zero value works for everything but
// DNS forwarding, which needs Upstreams.
type Config struct {
	// Upstreams are the resolvers ("ip:port") queries are forwarded to,
	// tried in order; UDP first, TCP when the answer is truncated.
	Upstreams []string
	// Dial dials upstream resolvers and the destinations of admitted
	// connections (nil: a net.Dialer).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// OriginalDst returns a redirected connection's original destination
	// (nil: SO_ORIGINAL_DST of the *net.TCPConn, IPv4 and IPv6).
	OriginalDst func(c net.Conn) (netip.AddrPort, error)
	// OnEvent receives every allowed and denied decision (nil: none). It
	// is called inline on the goroutine that decided, before the decision
	// takes effect (before the reply or reset is sent), so it must not
	// block: hand the event to a buffered channel or a ring and return.
	OnEvent func(Event)
	// Logger receives operational messages (nil: slog.Default()).
	Logger *slog.Logger
	// UpstreamRoots verify the upstreams of intercepted connections
	// (nil: the system roots). An operator's bundle (--egress-ca-bundle)
	// is added to the system roots by the caller.
	UpstreamRoots *x509.CertPool
	// IsHostAddr reports whether ip is, at the moment of asking, an
	// address of the host the gateway runs on (nil: none known). Such an
	// address is never reachable, whatever the policy — checked on every
	// connection and DNS answer, so an address the host gains after the
	// policies were compiled (a new interface, a DHCP lease) is covered.
	IsHostAddr func(ip netip.Addr) bool
	// Now is the clock of DNS attribution expiry (nil: time.Now).
	Now func() time.Time
}

// Errors of Attach, Update and the Serve methods.
var (
	ErrExists   = errors.New("egress: sandbox or address already attached")
	ErrNotFound = errors.New("egress: sandbox not attached")
	ErrInvalid  = errors.New("egress: invalid argument")
	ErrClosed   = errors.New("egress: gateway closed")
)

// Limits of the gateway. They bound what one sandbox can make the
// gateway hold.
const (
	// MinTTL and MaxTTL clamp the lifetime of a DNS attribution (and the
	// TTL handed to the sandbox, so its cache never outlives the
	// attribution): below 5 s a client that resolves and then connects
	// would race the expiry; above an hour a stale answer would keep
	// admitting an address the name moved away from.
	MinTTL = 5 * time.Second
	MaxTTL = time.Hour
	// maxRecords bounds one sandbox's attributions (ip, name) pairs.
	maxRecords = 16384
	// maxConns bounds one sandbox's open proxied connections.
	maxConns = 4096
	// maxDNSInflight bounds one sandbox's queries being forwarded.
	maxDNSInflight = 128
)

// Gateway is one worker's egress gateway: a DNS resolver and a
// transparent TCP proxy serving every sandbox attached to it.
type Gateway struct {
	cfg         Config
	log         *slog.Logger
	now         func() time.Time
	dial        func(ctx context.Context, network, addr string) (net.Conn, error)
	originalDst func(c net.Conn) (netip.AddrPort, error)

	mu        sync.RWMutex
	byAddr    map[netip.Addr]*sandbox
	byID      map[string]*sandbox
	closed    bool
	listeners map[any]func() error // what Serve* are serving, for Close
}

// New returns a gateway with no sandbox attached.
func New(cfg Config) *Gateway {
	g := &Gateway{
		cfg:         cfg,
		log:         cfg.Logger,
		now:         cfg.Now,
		dial:        cfg.Dial,
		originalDst: cfg.OriginalDst,
		byAddr:      map[netip.Addr]*sandbox{},
		byID:        map[string]*sandbox{},
		listeners:   map[any]func() error{},
	}
	if g.log == nil {
		g.log = slog.Default()
	}
	if g.now == nil {
		g.now = time.Now
	}
	if g.dial == nil {
		var d net.Dialer
		g.dial = d.DialContext
	}
	if g.originalDst == nil {
		g.originalDst = OriginalDst
	}
	return g
}

// sandbox is one attached sandbox's state.
type sandbox struct {
	id   string
	addr netip.Addr

	// mu guards policy, gen, conns, detached and every conn's name: a
	// connection's admission and Update's sweep agree through gen.
	mu       sync.Mutex
	policy   Policy
	gen      uint64
	conns    map[*proxyConn]struct{}
	detached bool
	udp      *udpState // ServeUDP's, nil until then

	recMu   sync.Mutex
	records map[netip.Addr]map[string]time.Time // ip → name → expiry
	nrec    int

	dnsInflight chan struct{} // a semaphore of maxDNSInflight

	listeners []io.Closer // its own (AttachListeners), closed by close
}

func (sb *sandbox) snapshot() (Policy, uint64, bool) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.policy, sb.gen, sb.detached
}

// Attach makes the gateway serve the sandbox whose packets come from
// addr on this worker, under policy p. The data path's anti-spoofing
// rules are what make the source address a trustworthy identity.
func (g *Gateway) Attach(sandboxID string, addr netip.Addr, p Policy) error {
	addr = addr.Unmap()
	if sandboxID == "" || !addr.IsValid() || p == nil {
		return fmt.Errorf("attach %q %v: %w", sandboxID, addr, ErrInvalid)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return ErrClosed
	}
	if _, ok := g.byID[sandboxID]; ok {
		return fmt.Errorf("attach %q: %w", sandboxID, ErrExists)
	}
	if other, ok := g.byAddr[addr]; ok {
		return fmt.Errorf("attach %q: address %v is %q's: %w", sandboxID, addr, other.id, ErrExists)
	}
	sb := &sandbox{
		id: sandboxID, addr: addr, policy: p,
		conns:       map[*proxyConn]struct{}{},
		records:     map[netip.Addr]map[string]time.Time{},
		dnsInflight: make(chan struct{}, maxDNSInflight),
	}
	g.byID[sandboxID] = sb
	g.byAddr[addr] = sb
	return nil
}

// AttachListeners makes the gateway serve sandbox sandboxID, under policy
// p, on listeners of its own (internal/network's egress networks: sockets
// in the sandbox's gateway namespace, which only its guest reaches). The
// listener, not the source address, identifies the sandbox, so every
// sandbox may use the same address. Any listener may be nil. They are
// served until Detach (or Close), which closes them.
func (g *Gateway) AttachListeners(sandboxID string, p Policy, proxy net.Listener, dnsUDP net.PacketConn, dnsTCP net.Listener) error {
	return g.AttachListenerSets(sandboxID, p, Listeners{Proxy: proxy, DNS: dnsUDP, DNSTCP: dnsTCP})
}

// Listeners are one address family's sockets of a sandbox (any may be nil).
type Listeners struct {
	Proxy  net.Listener   // redirected TCP connections
	DNS    net.PacketConn // DNS over UDP
	DNSTCP net.Listener   // DNS over TCP
}

// AttachListenerSets is AttachListeners with several sets of listeners
// for the same sandbox (its IPv4 and its IPv6 ones), all served alike.
func (g *Gateway) AttachListenerSets(sandboxID string, p Policy, sets ...Listeners) error {
	if sandboxID == "" || p == nil {
		return fmt.Errorf("attach %q: %w", sandboxID, ErrInvalid)
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return ErrClosed
	}
	if _, ok := g.byID[sandboxID]; ok {
		g.mu.Unlock()
		return fmt.Errorf("attach %q: %w", sandboxID, ErrExists)
	}
	sb := &sandbox{
		id: sandboxID, policy: p,
		conns:       map[*proxyConn]struct{}{},
		records:     map[netip.Addr]map[string]time.Time{},
		dnsInflight: make(chan struct{}, maxDNSInflight),
	}
	for _, set := range sets {
		for _, c := range []io.Closer{set.Proxy, set.DNS, set.DNSTCP} {
			if c != nil && !reflect.ValueOf(c).IsNil() {
				sb.listeners = append(sb.listeners, c)
			}
		}
	}
	g.byID[sandboxID] = sb
	g.mu.Unlock()
	for _, set := range sets {
		if proxy := set.Proxy; proxy != nil && !reflect.ValueOf(proxy).IsNil() {
			go g.serveProxyFor(proxy, sb)
		}
		if dnsUDP := set.DNS; dnsUDP != nil && !reflect.ValueOf(dnsUDP).IsNil() {
			go g.serveDNSFor(&dns.Server{PacketConn: dnsUDP, UDPSize: 4096}, dnsUDP, dnsUDP.Close, sb)
		}
		if dnsTCP := set.DNSTCP; dnsTCP != nil && !reflect.ValueOf(dnsTCP).IsNil() {
			go g.serveDNSFor(&dns.Server{Listener: dnsTCP}, dnsTCP, dnsTCP.Close, sb)
		}
	}
	return nil
}

// Update replaces the sandbox's policy. New DNS queries and connections
// follow p at once; open connections that p denies (judged by the name
// and address they were admitted for, or their latest HTTP Host) are
// closed before Update returns. DNS attributions are kept: they record
// what was handed out, not what is allowed.
func (g *Gateway) Update(sandboxID string, p Policy) error {
	if p == nil {
		return fmt.Errorf("update %q: nil policy: %w", sandboxID, ErrInvalid)
	}
	sb := g.sandboxByID(sandboxID)
	if sb == nil {
		return fmt.Errorf("update %q: %w", sandboxID, ErrNotFound)
	}
	type open struct {
		pc               *proxyConn
		name             string
		tls, intercepted bool
	}
	sb.mu.Lock()
	if sb.detached {
		sb.mu.Unlock()
		return fmt.Errorf("update %q: %w", sandboxID, ErrNotFound)
	}
	sb.policy = p
	sb.gen++
	conns := make([]open, 0, len(sb.conns))
	for pc := range sb.conns {
		if pc.admitted { // the others are being admitted and will see p
			conns = append(conns, open{pc, pc.name, pc.tls, pc.intercepted})
		}
	}
	sb.mu.Unlock()
	// A connection admitted or re-checked after the gen++ above sees p
	// itself; the ones listed here were judged under an older policy.
	ic := interceptionOf(p)
	for _, o := range conns {
		d := p.Conn(o.name, o.pc.dst.Addr(), o.pc.dst.Port(), "tcp")
		intercept := d.TLS == tlsIntercept
		if d.Allow && (!o.tls || o.intercepted == intercept) && (!intercept || ic != nil) {
			continue
		}
		reason := "policy updated: " + d.Reason
		switch {
		case d.Allow && intercept && ic == nil:
			reason = "policy updated: " + reasonNoInterception
		case d.Allow && intercept:
			reason = "policy updated: the connection's name is intercepted now (reconnect)"
		case d.Allow:
			reason = "policy updated: the connection's name is no longer intercepted (reconnect)"
		}
		g.emit(Event{SandboxID: sb.id, Kind: KindTCP, Name: o.name, IP: o.pc.dst.Addr(), Port: o.pc.dst.Port(), Rule: d.Rule, Reason: reason})
		o.pc.cut()
	}
	g.updateUDP(sb, p)
	return nil
}

func (sb *sandbox) isDetached() bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.detached
}

// Detach stops serving the sandbox: its open connections are closed and
// its DNS attributions forgotten; its address becomes unknown.
func (g *Gateway) Detach(sandboxID string) {
	g.mu.Lock()
	sb := g.byID[sandboxID]
	if sb != nil {
		delete(g.byID, sandboxID)
		if g.byAddr[sb.addr] == sb {
			delete(g.byAddr, sb.addr)
		}
	}
	g.mu.Unlock()
	if sb != nil {
		sb.close()
	}
}

func (sb *sandbox) close() {
	for _, l := range sb.listeners {
		l.Close()
	}
	sb.mu.Lock()
	sb.detached = true
	conns := sb.conns
	sb.conns = map[*proxyConn]struct{}{}
	st := sb.udp
	sb.mu.Unlock()
	for pc := range conns {
		pc.cut()
	}
	if st != nil {
		st.relay.Close() // ServeUDP then closes the flows
	}
	sb.recMu.Lock()
	sb.records, sb.nrec = map[netip.Addr]map[string]time.Time{}, 0
	sb.recMu.Unlock()
}

// Close stops every Serve method (they return ErrClosed), detaches every
// sandbox and closes their connections.
func (g *Gateway) Close() error {
	g.mu.Lock()
	g.closed = true
	closers := g.listeners
	g.listeners = map[any]func() error{}
	sbs := g.byID
	g.byID, g.byAddr = map[string]*sandbox{}, map[netip.Addr]*sandbox{}
	g.mu.Unlock()
	var errs []error
	for _, c := range closers {
		if err := c(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	for _, sb := range sbs {
		sb.close()
	}
	return errors.Join(errs...)
}

// serving registers what a Serve method serves so Close can stop it; it
// returns false when the gateway is closed already.
func (g *Gateway) serving(key any, closeFn func() error) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.listeners[key] = closeFn
	return true
}

func (g *Gateway) unserving(key any) {
	g.mu.Lock()
	delete(g.listeners, key)
	g.mu.Unlock()
}

func (g *Gateway) isClosed() bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.closed
}

func (g *Gateway) sandboxByID(id string) *sandbox {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.byID[id]
}

func (g *Gateway) sandboxByAddr(a netip.Addr) *sandbox {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.byAddr[a.Unmap()]
}

// Lookup returns the names the gateway's DNS handed to the sandbox for
// ip whose attribution has not expired, sorted.
func (g *Gateway) Lookup(sandboxID string, ip netip.Addr) (names []string) {
	sb := g.sandboxByID(sandboxID)
	if sb == nil {
		return nil
	}
	now := g.now()
	sb.recMu.Lock()
	for name, exp := range sb.records[ip.Unmap()] {
		if now.Before(exp) {
			names = append(names, name)
		}
	}
	sb.recMu.Unlock()
	sort.Strings(names)
	return names
}

// attributed reports whether the gateway's DNS handed ip to the sandbox
// for name and the attribution has not expired.
func (g *Gateway) attributed(sb *sandbox, name string, ip netip.Addr) bool {
	now := g.now()
	sb.recMu.Lock()
	defer sb.recMu.Unlock()
	exp, ok := sb.records[ip.Unmap()][name]
	return ok && now.Before(exp)
}

// record attributes ip to name for the sandbox until exp. When the
// sandbox holds maxRecords attributions, expired ones are swept first
// and then arbitrary ones evicted: a sandbox that floods its resolver
// with allowed names loses its own older attributions, nobody else's.
func (g *Gateway) record(sb *sandbox, name string, ip netip.Addr, exp time.Time) {
	ip = ip.Unmap()
	sb.recMu.Lock()
	defer sb.recMu.Unlock()
	if sb.records == nil {
		return
	}
	names := sb.records[ip]
	if _, ok := names[name]; !ok && sb.nrec >= maxRecords {
		now := g.now()
		for a, ns := range sb.records {
			for n, e := range ns {
				if !now.Before(e) {
					delete(ns, n)
					sb.nrec--
				}
			}
			if len(ns) == 0 {
				delete(sb.records, a)
			}
		}
	evict:
		for a, ns := range sb.records {
			for n := range ns {
				if sb.nrec < maxRecords {
					break evict
				}
				delete(ns, n)
				sb.nrec--
			}
			if len(ns) == 0 {
				delete(sb.records, a)
			}
		}
		names = sb.records[ip]
	}
	if names == nil {
		names = map[string]time.Time{}
		sb.records[ip] = names
	}
	if old, ok := names[name]; !ok {
		sb.nrec++
	} else if old.After(exp) {
		return // a longer attribution stands
	}
	names[name] = exp
}

// checksReach reports whether addresses are judged before names under
// policy (a Reacher, or the host's addresses known).
func (g *Gateway) checksReach(policy Policy) bool {
	_, ok := policy.(Reacher)
	return ok || g.cfg.IsHostAddr != nil
}

// reachable judges ip alone: the host's own addresses first, then the
// policy's guard.
func (g *Gateway) reachable(policy Policy, ip netip.Addr) Decision {
	if g.cfg.IsHostAddr != nil && g.cfg.IsHostAddr(ip.Unmap()) {
		return Decision{Rule: -1, Reason: fmt.Sprintf("%v is an address of the host and never reachable", ip.Unmap())}
	}
	if r, ok := policy.(Reacher); ok {
		return r.Reachable(ip)
	}
	return Decision{Allow: true, Rule: -1}
}

func (g *Gateway) emit(ev Event) {
	if ev.Time.IsZero() {
		ev.Time = g.now()
	}
	if ev.Allowed {
		g.log.Debug("egress allowed", "sandbox", ev.SandboxID, "kind", ev.Kind, "name", ev.Name, "ip", ev.IP, "port", ev.Port, "rule", ev.Rule)
	} else {
		g.log.Debug("egress denied", "sandbox", ev.SandboxID, "kind", ev.Kind, "name", ev.Name, "ip", ev.IP, "port", ev.Port, "rule", ev.Rule, "reason", ev.Reason)
	}
	if g.cfg.OnEvent != nil {
		g.cfg.OnEvent(ev)
	}
}

// canonicalName lower-cases name and strips one trailing dot; ok is
// false for anything that is not a plausible host name (letters, digits,
// '-', '_', dots between non-empty labels of at most 63 bytes, 253
// bytes in all). IP literals are not names.
func canonicalName(name string) (string, bool) {
	if len(name) > 0 && name[len(name)-1] == '.' {
		name = name[:len(name)-1]
	}
	if name == "" || len(name) > 253 {
		return "", false
	}
	b := []byte(name)
	label := 0
	for i, c := range b {
		switch {
		case 'A' <= c && c <= 'Z':
			b[i] = c + 'a' - 'A'
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '_':
		case c == '.':
			if label == 0 {
				return "", false
			}
			label = -1
		default:
			return "", false
		}
		label++
		if label > 63 {
			return "", false
		}
	}
	if label == 0 {
		return "", false
	}
	s := string(b)
	if _, err := netip.ParseAddr(s); err == nil {
		return "", false
	}
	return s, true
}
