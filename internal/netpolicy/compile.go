package netpolicy

import (
	"fmt"
	"maps"
	"net/netip"
	"strings"
)

// Compiled is a validated policy under a guard, ready to decide. It is
// immutable and safe for concurrent use.
type Compiled struct {
	rules []rule
	def   Action
	guard guard
	ipv6  bool
}

// rule is a Rule ready to match.
type rule struct {
	allow    bool
	exact    map[string]bool // canonical names
	wild     map[string]bool // ".example.com" for "*.example.com"
	prefixes []netip.Prefix
	ports    []PortRange // none: every port
	tcp, udp bool
	tls      TLSMode
	inject   *Inject
}

// Decision is the answer to one question put to a Compiled policy.
type Decision struct {
	Allow bool
	// Rule is the index of the deciding rule, -1 for the default or the guard.
	Rule int
	// Reason says why in words for logs and events: "rule 2 denies
	// *.evil.com", "default deny", "169.254.169.254 is link-local (metadata)
	// and never reachable".
	Reason string
	// TLS and Inject are the deciding allow rule's (TLS is never empty on an
	// allowed connection). Inject is shared: read it, do not modify it.
	TLS    TLSMode
	Inject *Inject
	// ByName is set when a domain rule admitted the connection by its name
	// (not its address): the gateway then also requires that its DNS
	// handed the destination address to this sandbox for that name.
	ByName bool
}

// Compile validates p and prepares it for decisions under g.
func Compile(p Policy, g Guard) (*Compiled, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	cg, err := compileGuard(g)
	if err != nil {
		return nil, err
	}
	c := &Compiled{def: p.Default, guard: cg}
	for _, r := range p.Rules {
		cr := rule{
			allow: r.Action == Allow,
			exact: map[string]bool{},
			wild:  map[string]bool{},
			ports: append([]PortRange(nil), r.Ports...),
			tcp:   len(r.Protocols) == 0,
			tls:   r.TLS,
		}
		if cr.tls == "" {
			cr.tls = Passthrough
		}
		for _, d := range r.Domains {
			pat, _ := checkPattern(d)
			if suffix, ok := strings.CutPrefix(pat, "*"); ok {
				cr.wild[suffix] = true
			} else {
				cr.exact[pat] = true
			}
		}
		for _, s := range r.CIDRs {
			p, _ := parseCIDR(s)
			cr.prefixes = append(cr.prefixes, p)
			c.ipv6 = c.ipv6 || cr.allow && p.Addr().Is6()
		}
		for _, proto := range r.Protocols {
			cr.tcp = cr.tcp || proto == "tcp"
			cr.udp = cr.udp || proto == "udp"
		}
		if r.Inject != nil {
			cr.inject = &Inject{Headers: maps.Clone(r.Inject.Headers)}
		}
		c.rules = append(c.rules, cr)
	}
	return c, nil
}

// AllowsIPv6 reports whether any allow rule names an IPv6 CIDR: without one
// no IPv6 destination is ever admitted, and the data path can leave the
// sandbox without IPv6.
func (c *Compiled) AllowsIPv6() bool { return c.ipv6 }

// matchName returns the pattern of r matching the canonical name n.
func (r *rule) matchName(n string) (string, bool) {
	if r.exact[n] {
		return n, true
	}
	for i := strings.IndexByte(n, '.'); i >= 0; {
		if r.wild[n[i:]] {
			return "*" + n[i:], true
		}
		j := strings.IndexByte(n[i+1:], '.')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return "", false
}

func (r *rule) matchAddr(ip netip.Addr) (netip.Prefix, bool) {
	for _, p := range r.prefixes {
		if p.Contains(ip) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

func (r *rule) matchPort(port uint16) bool {
	if len(r.ports) == 0 {
		return true
	}
	for _, pr := range r.ports {
		if pr.Contains(port) {
			return true
		}
	}
	return false
}

func (r *rule) matchProto(proto string) bool {
	return proto == "tcp" && r.tcp || proto == "udp" && r.udp
}

func (r *rule) verb() string {
	if r.allow {
		return "allows"
	}
	return "denies"
}

// decide is the Decision of rule i on its match what.
func (c *Compiled) decide(i int, what string) Decision {
	r := &c.rules[i]
	d := Decision{Allow: r.allow, Rule: i, Reason: fmt.Sprintf("rule %d %s %s", i, r.verb(), what)}
	if r.allow {
		d.TLS, d.Inject = r.tls, r.inject
	}
	return d
}

func refuse(reason string) Decision { return Decision{Rule: -1, Reason: reason} }

// explicit reports whether prefix p names part of blocked range b.
func explicit(p netip.Prefix, b netip.Prefix) bool {
	return p.Bits() >= b.Bits() && b.Contains(p.Addr())
}

// Conn decides a connection from the sandbox to ip:port over proto ("tcp" or
// "udp"; "" is tcp) for name, the name the gateway saw (TLS SNI, HTTP Host)
// or "" for a connect to a raw IP. The guard is checked on ip first; then
// the first matching rule decides; then the default. See the package comment.
func (c *Compiled) Conn(name string, ip netip.Addr, port uint16, proto string) Decision {
	ip = ip.Unmap()
	switch {
	case !ip.IsValid():
		return refuse("no destination address")
	case ip.Zone() != "":
		return refuse(fmt.Sprintf("%s is a scoped address and never reachable", ip))
	case port == 0:
		return refuse("port 0 is never reachable")
	}
	if proto == "" {
		proto = "tcp"
	}
	if proto != "tcp" && proto != "udp" {
		return refuse(fmt.Sprintf("protocol %q is never admitted", proto))
	}
	if name != "" {
		n, reason := normalize(name)
		if reason != "" {
			return refuse(fmt.Sprintf("name %q %s", name, reason))
		}
		name = n
	}
	if why, ok := never(ip); ok {
		return refuse(why)
	}
	blk, blocked := c.guard.lookup(ip)
	if blocked && !c.guard.allowPrivate {
		return refuse(blk.words(ip) + " and never reachable")
	}
	for i := range c.rules {
		r := &c.rules[i]
		if !r.matchPort(port) || !r.matchProto(proto) {
			continue
		}
		pat, byName := "", false
		if name != "" {
			pat, byName = r.matchName(name)
		}
		p, byAddr := r.matchAddr(ip)
		switch {
		case !byName && !byAddr:
			continue
		case !r.allow && byName:
			return c.decide(i, pat)
		case !r.allow:
			return c.decide(i, p.String())
		case blocked:
			// Only a CIDR inside the blocked range admits it; any other
			// allow rule does not count for this address.
			if byAddr && explicit(p, blk.prefix) {
				d := c.decide(i, p.String())
				d.Reason += " (" + blk.words(ip) + "; private CIDRs permitted by the operator)"
				return d
			}
		case ip.Is6():
			if byAddr {
				return c.decide(i, p.String())
			}
		case byName:
			d := c.decide(i, pat)
			d.ByName = true
			return d
		default:
			return c.decide(i, p.String())
		}
	}
	switch {
	case blocked:
		return refuse(blk.words(ip) + " and no CIDR rule names it")
	case ip.Is6():
		return refuse(fmt.Sprintf("%s is IPv6, which only a CIDR rule admits", ip))
	case c.def == Allow && proto == "tcp":
		return Decision{Allow: true, Rule: -1, Reason: "default allow", TLS: Passthrough}
	case c.def == Allow:
		return refuse("default allow admits tcp only; udp needs a rule")
	}
	return refuse("default deny")
}

// Name decides the DNS stage: may the sandbox resolve name at all, whatever
// port it then connects to. The first rule with a domain matching name
// decides, except that a deny rule limited to some ports, or to udp, does
// not stop resolution (other connections may be allowed); then the default. CIDR rules play
// no part: they admit by address. Conn remains the authority on each
// connection, and Reachable on each address an answer carries.
func (c *Compiled) Name(name string) Decision {
	n, reason := normalize(name)
	if reason != "" {
		return refuse(fmt.Sprintf("name %q %s", name, reason))
	}
	for i := range c.rules {
		r := &c.rules[i]
		pat, ok := r.matchName(n)
		if !ok || !r.allow && (len(r.ports) > 0 || !r.tcp) {
			continue
		}
		return c.decide(i, pat)
	}
	if c.def == Allow {
		return Decision{Allow: true, Rule: -1, Reason: "default allow", TLS: Passthrough}
	}
	return refuse("default deny")
}

// Reachable decides whether ip may be a destination at all, on any port: the
// filter the gateway's DNS applies to the addresses of an answer (an allowed
// name that resolves to a private, loopback or host address, DNS rebinding,
// must not hand that address out). It applies the guard and the IPv6 rule:
// a blocked address is reachable only with the operator's permission and an
// allow rule naming it by CIDR, an IPv6 address only with an allow rule
// naming it by CIDR; any other address is reachable (the name was admitted
// by Name; Conn decides each connection).
func (c *Compiled) Reachable(ip netip.Addr) Decision {
	ip = ip.Unmap()
	if !ip.IsValid() || ip.Zone() != "" {
		return refuse("no destination address")
	}
	if why, ok := never(ip); ok {
		return refuse(why)
	}
	blk, blocked := c.guard.lookup(ip)
	if blocked && !c.guard.allowPrivate {
		return refuse(blk.words(ip) + " and never reachable")
	}
	if blocked || ip.Is6() {
		for i := range c.rules {
			r := &c.rules[i]
			if p, ok := r.matchAddr(ip); ok && r.allow && (!blocked || explicit(p, blk.prefix)) {
				return c.decide(i, p.String())
			}
		}
		if blocked {
			return refuse(blk.words(ip) + " and no CIDR rule names it")
		}
		return refuse(fmt.Sprintf("%s is IPv6, which only a CIDR rule admits", ip))
	}
	return Decision{Allow: true, Rule: -1, Reason: fmt.Sprintf("%s is a public address", ip), TLS: Passthrough}
}
