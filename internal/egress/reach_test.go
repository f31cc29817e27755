package egress

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// reachPolicy is a testPolicy whose Reachable blocks a range, as
// netpolicy's guard blocks private addresses.
type reachPolicy struct {
	*testPolicy
	blocked netip.Prefix
}

func (p reachPolicy) Reachable(ip netip.Addr) Decision {
	if p.blocked.Contains(ip) {
		return Decision{Rule: -1, Reason: ip.String() + " is blocked"}
	}
	return Decision{Allow: true, Rule: -1}
}

// TestReachableFilters: with a policy that knows unreachable addresses
// (Reacher), DNS leaves them out of answers (REFUSED when nothing is left:
// DNS rebinding), and a connection to one is reset at once, without
// waiting for its SNI or Host.
func TestReachableFilters(t *testing.T) {
	e := newEnv(t)
	e.up.mu.Lock()
	for _, s := range []string{"rebind.test. 300 IN A 10.0.0.1", "mixed.test. 300 IN A 127.0.1.1", "mixed.test. 300 IN A 10.0.0.2"} {
		r := rr(t, s)
		e.up.zone[r.Header().Name] = append(e.up.zone[r.Header().Name], r)
	}
	e.up.mu.Unlock()
	e.attach("sb-1", "127.0.0.2", reachPolicy{allow("rebind.test", "mixed.test"), netip.MustParsePrefix("10.0.0.0/8")})

	if r := e.query("127.0.0.2", "rebind.test", dns.TypeA); r.Rcode != dns.RcodeRefused || len(r.Answer) != 0 {
		t.Errorf("a name resolving only to a blocked address: rcode %s, answer %v; want REFUSED", dns.RcodeToString[r.Rcode], r.Answer)
	}
	if evs := e.ev.find(KindDNS, false, "DNS rebinding"); len(evs) == 0 {
		t.Errorf("no rebinding event: %s", e.ev)
	}
	r := e.query("127.0.0.2", "mixed.test", dns.TypeA)
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || !strings.Contains(r.Answer[0].String(), "127.0.1.1") {
		t.Errorf("a mixed answer: %v; want only 127.0.1.1", r.Answer)
	}
	if names := e.gw.Lookup("sb-1", netip.MustParseAddr("10.0.0.2")); len(names) != 0 {
		t.Errorf("the blocked address was attributed: %v", names)
	}

	// A client that sends nothing to a blocked address is reset for being
	// blocked, not after the wait for its name.
	c := e.dial("127.0.0.2", netip.MustParseAddrPort("10.0.0.5:22"))
	buf := make([]byte, 1)
	if _, err := c.Read(buf); err == nil {
		t.Fatal("the connection to a blocked address was not closed")
	}
	if evs := e.ev.find(KindTCP, false, "10.0.0.5 is blocked"); len(evs) == 0 {
		t.Errorf("the connection was not denied as blocked: %s", e.ev)
	}
}
