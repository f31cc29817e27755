package netpolicy

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/airlock/airlock/internal/model"
)

// Guard holds the addresses no policy reaches by itself: whatever the rules
// and the default say, a connection to a Blocked address is refused, unless
// AllowPrivateCIDRs (the operator's permission) is set AND an allow rule
// names the address by a CIDR inside the blocked range. The unroutable
// addresses (see DefaultGuard) are refused even then.
type Guard struct {
	Blocked           []netip.Prefix
	AllowPrivateCIDRs bool
}

type labelled struct {
	prefix netip.Prefix
	label  string
}

// unroutable is refused always: these are no destination a gateway could
// sensibly connect to on a sandbox's behalf.
var unroutable = []labelled{
	{pfx("0.0.0.0/8"), "\"this network\""},
	{pfx("127.0.0.0/8"), "loopback"},
	{pfx("224.0.0.0/4"), "multicast"},
	{pfx("255.255.255.255/32"), "broadcast"},
	{pfx("240.0.0.0/4"), "reserved"},
	{pfx("::/128"), "unspecified"},
	{pfx("::1/128"), "loopback"},
	{pfx("ff00::/8"), "multicast"},
}

// blockable is the rest of DefaultGuard, with the words a Decision uses.
var blockable = []labelled{
	{pfx("10.0.0.0/8"), "private"},
	{pfx("172.16.0.0/12"), "private"},
	{pfx("192.168.0.0/16"), "private"},
	{pfx("100.64.0.0/10"), "shared address space, CGNAT"},
	{pfx("169.254.0.0/16"), "link-local"},
	{pfx("192.0.0.0/24"), "IETF protocol assignments"},
	{pfx("fc00::/7"), "unique local"},
	{pfx("fe80::/10"), "link-local"},
	{pfx("fec0::/10"), "site-local"},
	{pfx("::ffff:0:0/96"), "IPv4-mapped"}, // decisions unmap first; listed for packet filters
	{pfx("64:ff9b::/96"), "NAT64 (embeds IPv4)"},
	{pfx("64:ff9b:1::/48"), "NAT64 (embeds IPv4)"},
	{pfx("2002::/16"), "6to4 (embeds IPv4)"},
	{pfx("2001::/32"), "Teredo (embeds IPv4)"},
	{pfx("100::/64"), "discard-only"},
}

// metadata are the cloud instance-metadata addresses, named in reasons.
var metadata = map[netip.Addr]bool{
	netip.MustParseAddr("169.254.169.254"): true,
	netip.MustParseAddr("fd00:ec2::254"):   true,
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// DefaultGuard blocks private (10/8, 172.16/12, 192.168/16), loopback,
// link-local (with 169.254.169.254, the cloud metadata address), CGNAT
// 100.64/10 (where sandbox addresses come from), 0/8, 192.0.0/24, multicast,
// broadcast, reserved 240/4, and their IPv6 kin (::, ::1, fc00::/7,
// fe80::/10, fec0::/10, ff00::/8, and the ranges that embed IPv4 addresses:
// ::ffff:0:0/96 — decisions unmap such addresses and judge the IPv4 one —
// NAT64, 6to4, Teredo). Documentation and benchmark ranges (192.0.2/24,
// 198.51.100/24, 203.0.113/24, 198.18/15) are NOT blocked: tests use them as
// "the internet". extra is the host's own addresses and the worker's sandbox
// range; IPv4-mapped prefixes among them are unmapped.
func DefaultGuard(extra ...netip.Prefix) Guard {
	var g Guard
	for _, l := range unroutable {
		g.Blocked = append(g.Blocked, l.prefix)
	}
	for _, l := range blockable {
		g.Blocked = append(g.Blocked, l.prefix)
	}
	for _, p := range extra {
		g.Blocked = append(g.Blocked, unmapPrefix(p))
	}
	return g
}

// unmapPrefix turns an IPv4-mapped prefix narrower than ::ffff:0:0/96 into
// its IPv4 form (::ffff:0:0/96 itself stays: it would be 0.0.0.0/0).
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() > 96 {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96).Masked()
	}
	return p.Masked()
}

// Check refuses, naming the field, the CIDR rules of p that name a blocked
// range when the guard does not permit it. Compile does not: the guard wins
// at decision time instead. Check is for a server that knows its operator's
// setting and would rather answer 422 than accept a rule that never applies.
func (g Guard) Check(p Policy) error {
	if g.AllowPrivateCIDRs {
		return nil
	}
	for i, r := range p.Rules {
		if r.Action != Allow {
			continue
		}
		for j, c := range r.CIDRs {
			cp, reason := parseCIDR(c)
			if reason != "" {
				continue // Validate names it
			}
			for _, b := range g.Blocked {
				b = unmapPrefix(b)
				if b.IsValid() && cp.Bits() >= b.Bits() && b.Contains(cp.Addr()) {
					return model.Errorf(model.ErrUnprocessable, "rules[%d].cidrs[%d]: %q lies in %s (%s), which this installation does not let policies reach", i, j, c, b, labelOf(b))
				}
			}
		}
	}
	return nil
}

// labelOf words a blocked prefix.
func labelOf(p netip.Prefix) string {
	for _, l := range unroutable {
		if l.prefix == p {
			return l.label
		}
	}
	for _, l := range blockable {
		if l.prefix == p {
			return l.label
		}
	}
	return "a host or sandbox address of this worker"
}

// guard is a Guard ready to answer: the blocked prefixes, most specific first.
type guard struct {
	blocked      []labelled
	allowPrivate bool
}

func compileGuard(g Guard) (guard, error) {
	out := guard{allowPrivate: g.AllowPrivateCIDRs}
	for i, p := range g.Blocked {
		if !p.IsValid() {
			return out, model.Errorf(model.ErrInvalid, "guard: blocked[%d] is not a prefix", i)
		}
		p = unmapPrefix(p)
		out.blocked = append(out.blocked, labelled{p, labelOf(p)})
	}
	// Most specific first, so that the first prefix holding an address is
	// the narrowest (the ones holding an address are nested).
	slices.SortStableFunc(out.blocked, func(a, b labelled) int { return b.prefix.Bits() - a.prefix.Bits() })
	return out, nil
}

// never words ip when it is unroutable.
func never(ip netip.Addr) (string, bool) {
	for _, l := range unroutable {
		if l.prefix.Contains(ip) {
			return fmt.Sprintf("%s is %s and never reachable", ip, l.label), true
		}
	}
	return "", false
}

// lookup returns the narrowest blocked prefix holding ip.
func (g guard) lookup(ip netip.Addr) (labelled, bool) {
	for _, l := range g.blocked {
		if l.prefix.Contains(ip) {
			return l, true
		}
	}
	return labelled{}, false
}

// words says why ip, in blocked range l, is refused.
func (l labelled) words(ip netip.Addr) string {
	if metadata[ip] {
		return fmt.Sprintf("%s is %s (metadata)", ip, l.label)
	}
	return fmt.Sprintf("%s is %s (%s)", ip, l.label, l.prefix)
}
