package egress

import (
	"net/netip"

	"github.com/airlock/airlock/internal/netpolicy"
)

// FromPolicy is a compiled NetworkPolicyV1 as the gateway asks it.
func FromPolicy(c *netpolicy.Compiled) Policy { return compiled{c} }

type compiled struct{ c *netpolicy.Compiled }

func (p compiled) Name(name string) Decision { return decision(p.c.Name(name)) }

func (p compiled) Conn(name string, ip netip.Addr, port uint16, proto string) Decision {
	return decision(p.c.Conn(name, ip, port, proto))
}

func (p compiled) Reachable(ip netip.Addr) Decision { return decision(p.c.Reachable(ip)) }

// AllowsIPv6 reports whether p is a compiled NetworkPolicyV1 (FromPolicy)
// with an allow rule naming an IPv6 CIDR (netpolicy's AllowsIPv6).
func AllowsIPv6(p Policy) bool {
	c, ok := p.(compiled)
	return ok && c.c.AllowsIPv6()
}

func decision(d netpolicy.Decision) Decision {
	out := Decision{Allow: d.Allow, Rule: d.Rule, Reason: d.Reason, TLS: string(d.TLS), ByName: d.ByName}
	if d.Inject != nil && len(d.Inject.Headers) > 0 {
		out.Inject = make(map[string]string, len(d.Inject.Headers))
		for h, ref := range d.Inject.Headers {
			out.Inject[h] = ref.Secret
		}
	}
	return out
}
