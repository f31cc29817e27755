package netpolicy

import (
	"net/netip"

	"github.com/airlock/airlock/internal/model"
)

// The built-in profiles' names.
const (
	ProfileNone   = "none"
	ProfilePublic = "public"
)

// None is profile "none": no egress at all.
func None() Policy { return Policy{Version: Version, Default: Deny} }

// Public is profile "public": any public address over tcp; the Guard keeps
// private, link-local, metadata, host and sandbox addresses out, and IPv6
// stays off.
func Public() Policy { return Policy{Version: Version, Default: Allow} }

// Builtin returns the built-in profile called name.
func Builtin(name string) (Policy, bool) {
	switch name {
	case ProfileNone:
		return None(), true
	case ProfilePublic:
		return Public(), true
	}
	return Policy{}, false
}

// AllTraffic is E2B's ALL_TRAFFIC, the denyOut entry that makes a list an
// allow-list.
const AllTraffic = "0.0.0.0/0"

// FromE2B maps E2B's network settings onto V1, following E2B's documented
// semantics:
//
//   - allowInternetAccess defaults to true; false is the same as denyOut
//     [AllTraffic];
//   - allowOut entries (IPs, CIDRs, domain names, "*.example.com") take
//     precedence over denyOut: they become the first rule, an allow rule
//     with their domains and CIDRs;
//   - denyOut entries are IPs and CIDRs only (E2B refuses domains there, and
//     so does FromE2B); AllTraffic among them makes the default deny, the
//     others become a deny rule after the allow rule;
//   - otherwise the default is allow (Public, with the same guard).
//
// So FromE2B(nil, nil, nil) is Public(), FromE2B(&false, nil, nil) is None(),
// and allowOut ["pypi.org", "1.1.1.1"] with denyOut [AllTraffic] is
// {"default": "deny", "rules": [{"action": "allow", "domains": ["pypi.org"],
// "cidrs": ["1.1.1.1"]}]}.
//
// Where Airlock differs: a domain admits its name on every port (E2B filters
// names on 80 and 443 only), the guard keeps private and host addresses out
// even when allowOut lists 0.0.0.0/0, and "*.example.com" does not match
// example.com itself. Errors wrap model.ErrUnprocessable and name the entry
// (`allowOut[1]: …`).
func FromE2B(allowInternetAccess *bool, allowOut, denyOut []string) (Policy, error) {
	p := Public()
	if allowInternetAccess != nil && !*allowInternetAccess {
		p.Default = Deny
	}
	allow := Rule{Action: Allow}
	for i, e := range allowOut {
		if _, reason := parseCIDR(e); reason == "" {
			allow.CIDRs = append(allow.CIDRs, e)
			continue
		}
		if _, reason := checkPattern(e); reason != "" {
			if looksLikeAddress(e) {
				_, reason = parseCIDR(e)
			}
			return Policy{}, model.Errorf(model.ErrUnprocessable, "allowOut[%d]: %q %s", i, e, reason)
		}
		allow.Domains = append(allow.Domains, e)
	}
	deny := Rule{Action: Deny}
	for i, e := range denyOut {
		cp, reason := parseCIDR(e)
		switch {
		case reason != "" && !looksLikeAddress(e):
			return Policy{}, model.Errorf(model.ErrUnprocessable, "denyOut[%d]: %q is not an IP address or CIDR (denyOut takes no domain names; allow-list with allowOut and denyOut [%q] instead)", i, e, AllTraffic)
		case reason != "":
			return Policy{}, model.Errorf(model.ErrUnprocessable, "denyOut[%d]: %q %s", i, e, reason)
		case cp == netip.MustParsePrefix(AllTraffic):
			p.Default = Deny
		default:
			deny.CIDRs = append(deny.CIDRs, e)
		}
	}
	if len(allow.Domains)+len(allow.CIDRs) > 0 {
		p.Rules = append(p.Rules, allow)
	}
	if len(deny.CIDRs) > 0 {
		p.Rules = append(p.Rules, deny)
	}
	return p, p.Validate()
}

// looksLikeAddress guesses whether a refused entry was meant as an address
// (for the wording of the error).
func looksLikeAddress(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '/' || c == ':' {
			return true
		}
	}
	_, err := netip.ParseAddr(s)
	return err == nil
}

// E2B reports p in E2B's terms, for getInfo: allowInternet is whether the
// default is allow; allowOut lists the domains and CIDRs of allow rules;
// denyOut lists the CIDRs of deny rules, then AllTraffic when the default is
// deny. For a policy made by FromE2B, FromE2B(E2B()) gives it back. Other
// policies are reported approximately: E2B has no ports, protocols, TLS
// modes, injected headers, denied domains or rule order (its allowOut always
// wins), so those are left out.
func (p Policy) E2B() (allowInternet bool, allowOut, denyOut []string) {
	for _, r := range p.Rules {
		switch r.Action {
		case Allow:
			allowOut = append(allowOut, r.Domains...)
			allowOut = append(allowOut, r.CIDRs...)
		case Deny:
			denyOut = append(denyOut, r.CIDRs...)
		}
	}
	if p.Default == Deny {
		denyOut = append(denyOut, AllTraffic)
	}
	return p.Default == Allow, allowOut, denyOut
}
