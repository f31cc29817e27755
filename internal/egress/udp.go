package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
)

// UDP other than DNS: a policy rule listing "udp" in its protocols admits
// datagrams to its addresses (a CIDR rule) or to the addresses the
// gateway's DNS handed this sandbox for its names (a domain rule); nothing
// else — the default, even "allow", never admits UDP. The data path hands
// the gateway each datagram with its original destination (UDPRelay: a
// transparent socket in the sandbox's gateway namespace); the gateway
// judges the first datagram of each flow (guest address and port, original
// destination), relays the flow through a socket of its own dialled from
// the host to that destination, and sends the replies back as if from the
// destination. A flow idle for udpIdle is forgotten; an Update closes the
// flows the new policy denies.

// UDP limits.
const (
	// maxUDPFlows bounds one sandbox's open UDP flows.
	maxUDPFlows = 256
	// udpIdle forgets a flow that carried nothing either way this long.
	udpIdle = 60 * time.Second
	// maxDatagram bounds a datagram read.
	maxDatagram = 64 << 10
	// udpDenyQuiet is how long a denied flow stays quiet in the events
	// (a guest retrying a denied destination is reported once per flow
	// per this interval, not per datagram).
	udpDenyQuiet = 10 * time.Second
	maxUDPDenied = 1024
)

// UDPRelay is a sandbox's redirected UDP: what the guest sends, each
// datagram with its original destination, and the way back to the guest.
type UDPRelay interface {
	// ReadFrom reads one datagram the guest sent to dst from src.
	ReadFrom(b []byte) (n int, src, dst netip.AddrPort, err error)
	// WriteFrom sends b to the guest's to as if from from (the flow's
	// original destination).
	WriteFrom(b []byte, from, to netip.AddrPort) error
	Close() error
}

type udpKey struct{ src, dst netip.AddrPort }

type udpFlow struct {
	key      udpKey
	up       net.Conn
	lastSeen time.Time // guarded by the sandbox's udpMu
	closed   bool
}

// udpState is a sandbox's UDP flows.
type udpState struct {
	mu     sync.Mutex
	relay  UDPRelay
	flows  map[udpKey]*udpFlow
	denied map[udpKey]time.Time // last denial event per flow
}

// ServeUDP relays sandbox sandboxID's UDP through r until r fails, the
// sandbox is detached (which closes r) or the gateway closes.
func (g *Gateway) ServeUDP(sandboxID string, r UDPRelay) error {
	sb := g.sandboxByID(sandboxID)
	if sb == nil {
		r.Close()
		return fmt.Errorf("udp %q: %w", sandboxID, ErrNotFound)
	}
	sb.mu.Lock()
	if sb.detached || sb.udp != nil {
		sb.mu.Unlock()
		r.Close()
		return fmt.Errorf("udp %q: %w", sandboxID, ErrExists)
	}
	st := &udpState{relay: r, flows: map[udpKey]*udpFlow{}, denied: map[udpKey]time.Time{}}
	sb.udp = st
	sb.mu.Unlock()
	if !g.serving(r, r.Close) {
		return ErrClosed
	}
	defer g.unserving(r)
	buf := make([]byte, maxDatagram)
	for {
		n, src, dst, err := r.ReadFrom(buf)
		if err != nil {
			g.closeUDP(sb)
			if g.isClosed() {
				return ErrClosed
			}
			return fmt.Errorf("egress udp: %w", err)
		}
		g.udpDatagram(sb, st, buf[:n], src, netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port()))
	}
}

func (g *Gateway) udpDatagram(sb *sandbox, st *udpState, b []byte, src, dst netip.AddrPort) {
	k := udpKey{src, dst}
	now := g.now()
	st.mu.Lock()
	f := st.flows[k]
	if f != nil {
		f.lastSeen = now
		st.mu.Unlock()
		_, _ = f.up.Write(b) // a lost datagram is UDP's business
		return
	}
	st.mu.Unlock()

	policy, _, detached := sb.snapshot()
	if detached {
		return
	}
	ev := Event{SandboxID: sb.id, Kind: KindUDP, IP: dst.Addr(), Port: dst.Port(), Rule: -1}
	d, name, reason := g.decideUDP(sb, policy, dst)
	ev.Rule, ev.Name = d.Rule, name
	if reason == "" {
		st.mu.Lock()
		if len(st.flows) >= maxUDPFlows {
			reason = fmt.Sprintf("sandbox has %d UDP flows open (the most)", maxUDPFlows)
		}
		st.mu.Unlock()
	}
	if reason != "" {
		st.mu.Lock()
		last, seen := st.denied[k]
		quiet := seen && now.Sub(last) < udpDenyQuiet
		if !quiet {
			if len(st.denied) >= maxUDPDenied {
				clear(st.denied)
			}
			st.denied[k] = now
		}
		st.mu.Unlock()
		if !quiet {
			ev.Reason = reason
			g.emit(ev)
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	up, err := g.dial(ctx, "udp", dst.String())
	cancel()
	if err != nil {
		ev.Reason = "dial: " + err.Error()
		g.emit(ev)
		return
	}
	f = &udpFlow{key: k, up: up, lastSeen: now}
	st.mu.Lock()
	if sb.isDetached() || st.flows[k] != nil {
		st.mu.Unlock()
		up.Close()
		return
	}
	st.flows[k] = f
	st.mu.Unlock()
	ev.Allowed, ev.Reason = true, d.Reason
	g.emit(ev)
	_, _ = up.Write(b)
	go g.udpReplies(sb, st, f)
}

// udpReplies sends the upstream's datagrams to the guest until the flow
// idles out or is closed.
func (g *Gateway) udpReplies(sb *sandbox, st *udpState, f *udpFlow) {
	defer g.closeFlow(st, f)
	buf := make([]byte, maxDatagram)
	for {
		_ = f.up.SetReadDeadline(time.Now().Add(udpIdle))
		n, err := f.up.Read(buf)
		if n > 0 {
			st.mu.Lock()
			f.lastSeen = g.now()
			st.mu.Unlock()
			if err := st.relay.WriteFrom(buf[:n], f.key.dst, f.key.src); err != nil {
				g.log.Debug("egress udp: reply to the guest", "sandbox", sb.id, "err", err)
			}
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				st.mu.Lock()
				idle := g.now().Sub(f.lastSeen) >= udpIdle
				st.mu.Unlock()
				if !idle && !f.isClosed(st) {
					continue // the guest kept sending
				}
			}
			return
		}
	}
}

func (f *udpFlow) isClosed(st *udpState) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return f.closed
}

func (g *Gateway) closeFlow(st *udpState, f *udpFlow) {
	st.mu.Lock()
	if st.flows[f.key] == f {
		delete(st.flows, f.key)
	}
	f.closed = true
	st.mu.Unlock()
	f.up.Close()
}

// closeUDP closes sb's flows and relay.
func (g *Gateway) closeUDP(sb *sandbox) {
	sb.mu.Lock()
	st := sb.udp
	sb.mu.Unlock()
	if st == nil {
		return
	}
	st.mu.Lock()
	flows := make([]*udpFlow, 0, len(st.flows))
	for _, f := range st.flows {
		flows = append(flows, f)
	}
	st.mu.Unlock()
	for _, f := range flows {
		g.closeFlow(st, f)
	}
	st.relay.Close()
}

// decideUDP judges a flow to dst: the host's addresses and the guard
// first; then a UDP rule by address; then by any name this sandbox
// resolved to that address.
func (g *Gateway) decideUDP(sb *sandbox, policy Policy, dst netip.AddrPort) (Decision, string, string) {
	ip := dst.Addr()
	if g.checksReach(policy) {
		if d := g.reachable(policy, ip); !d.Allow {
			return d, "", d.Reason
		}
	}
	d := policy.Conn("", ip, dst.Port(), "udp")
	if d.Allow && !d.ByName {
		return d, "", ""
	}
	for _, name := range g.Lookup(sb.id, ip) {
		if dn := policy.Conn(name, ip, dst.Port(), "udp"); dn.Allow {
			return dn, name, ""
		}
	}
	if d.Reason == "" || d.Allow {
		d.Reason = "no rule allows udp to this address"
	}
	return d, "", d.Reason
}

// updateUDP closes the flows p denies; Update calls it.
func (g *Gateway) updateUDP(sb *sandbox, p Policy) {
	sb.mu.Lock()
	st := sb.udp
	sb.mu.Unlock()
	if st == nil {
		return
	}
	st.mu.Lock()
	flows := make([]*udpFlow, 0, len(st.flows))
	for _, f := range st.flows {
		flows = append(flows, f)
	}
	clear(st.denied)
	st.mu.Unlock()
	for _, f := range flows {
		if d, _, reason := g.decideUDP(sb, p, f.key.dst); reason != "" {
			g.emit(Event{SandboxID: sb.id, Kind: KindUDP, IP: f.key.dst.Addr(), Port: f.key.dst.Port(), Rule: d.Rule, Reason: "policy updated: " + reason})
			g.closeFlow(st, f)
		}
	}
}
