package netpolicy

import (
	"fmt"
	"net/netip"
	"regexp"
	"sort"
	"strings"

	"github.com/airlock/airlock/internal/model"
)

// Validate checks a policy. The error wraps model.ErrUnprocessable and names
// the first field at fault, e.g. `rules[0].domains[1]: "*.*.x" …`.
func (p Policy) Validate() error {
	switch {
	case p.Version == 0:
		return invalid("version", "missing (want %d)", Version)
	case p.Version != Version:
		return invalid("version", "%d is not supported (want %d)", p.Version, Version)
	}
	if err := checkAction("default", p.Default); err != nil {
		return err
	}
	if len(p.Rules) > MaxRules {
		return invalid("rules", "%d rules, at most %d", len(p.Rules), MaxRules)
	}
	for i, r := range p.Rules {
		if err := r.validate(fmt.Sprintf("rules[%d]", i)); err != nil {
			return err
		}
	}
	return nil
}

func (r Rule) validate(path string) error {
	if err := checkAction(path+".action", r.Action); err != nil {
		return err
	}
	if len(r.Domains) == 0 && len(r.CIDRs) == 0 {
		return invalid(path, "names no destination (give domains, cidrs or both)")
	}
	for i, d := range r.Domains {
		if _, reason := checkPattern(d); reason != "" {
			return invalid(fmt.Sprintf("%s.domains[%d]", path, i), "%q %s", d, reason)
		}
	}
	for i, c := range r.CIDRs {
		if _, reason := parseCIDR(c); reason != "" {
			return invalid(fmt.Sprintf("%s.cidrs[%d]", path, i), "%q %s", c, reason)
		}
	}
	for i, pr := range r.Ports {
		fp := fmt.Sprintf("%s.ports[%d]", path, i)
		switch {
		case pr.From == 0:
			return invalid(fp, "0 is not a port (1-65535)")
		case pr.From > pr.To:
			return invalid(fp, "%d-%d is not a range (from > to)", pr.From, pr.To)
		}
	}
	tcp := len(r.Protocols) == 0
	for i, proto := range r.Protocols {
		fp := fmt.Sprintf("%s.protocols[%d]", path, i)
		if proto != "tcp" && proto != "udp" {
			return invalid(fp, "%q is not \"tcp\" or \"udp\"", proto)
		}
		for _, earlier := range r.Protocols[:i] {
			if earlier == proto {
				return invalid(fp, "%q repeated", proto)
			}
		}
		tcp = tcp || proto == "tcp"
	}
	switch r.TLS {
	case "", Passthrough:
	case Intercept:
		switch {
		case r.Action != Allow:
			return invalid(path+".tls", "intercept is only for allow rules")
		case len(r.Domains) == 0:
			return invalid(path+".tls", "intercept needs domains (the certificate is made for the name)")
		case len(r.CIDRs) > 0:
			return invalid(path+".cidrs", "a rule with \"tls\": \"intercept\" admits by name only; move the CIDRs to a rule of their own")
		case !tcp:
			return invalid(path+".tls", "intercept needs tcp in protocols")
		}
	default:
		return invalid(path+".tls", "%q is not \"passthrough\" or \"intercept\"", r.TLS)
	}
	if r.Inject != nil {
		if r.TLS != Intercept {
			return invalid(path+".inject", "needs \"tls\": \"intercept\" on the same rule (headers are only added to traffic the gateway terminates)")
		}
		if err := r.Inject.validate(path + ".inject"); err != nil {
			return err
		}
	}
	return nil
}

var secretName = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// framing headers carry the request's own structure; the gateway never sets
// them for a policy.
var framing = map[string]bool{
	"host": true, "content-length": true, "transfer-encoding": true, "connection": true,
	"keep-alive": true, "upgrade": true, "te": true, "trailer": true, "proxy-connection": true,
}

func (in *Inject) validate(path string) error {
	if len(in.Headers) == 0 {
		return invalid(path+".headers", "no headers (drop inject, or name at least one)")
	}
	names := make([]string, 0, len(in.Headers))
	for name := range in.Headers {
		names = append(names, name)
	}
	sort.Strings(names)
	seen := map[string]bool{}
	for _, name := range names {
		hp := member(path+".headers", name)
		switch lower := strings.ToLower(name); {
		case !isToken(name):
			return invalid(hp, "%q is not an HTTP header name", name)
		case framing[lower]:
			return invalid(hp, "%s frames the request and cannot be injected", name)
		case seen[lower]:
			return invalid(hp, "repeated (header names are case-insensitive)")
		default:
			seen[lower] = true
		}
		if s := in.Headers[name].Secret; !secretName.MatchString(s) {
			return invalid(hp+".secret", "%q is not a secret name ([a-z0-9][a-z0-9_.-]{0,62})", s)
		}
	}
	return nil
}

// isToken reports whether s is an RFC 9110 token (a header field name).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

func checkAction(path string, a Action) error {
	switch a {
	case Allow, Deny:
		return nil
	case "":
		return invalid(path, "missing (\"allow\" or \"deny\")")
	}
	return invalid(path, "%q is not \"allow\" or \"deny\"", a)
}

// parseCIDR reads a cidrs entry: a prefix with no host bits, or one address.
// reason is "" or why it is refused.
func parseCIDR(s string) (netip.Prefix, string) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		switch {
		case err != nil:
			return p, "is not an IP address or CIDR"
		case p.Addr().Is4In6():
			return p, "is an IPv4-mapped IPv6 prefix; write it in IPv4 form"
		case p != p.Masked():
			return p, fmt.Sprintf("has host bits set (did you mean %s?)", p.Masked())
		}
		return p, ""
	}
	a, err := netip.ParseAddr(s)
	switch {
	case err != nil:
		return netip.Prefix{}, "is not an IP address or CIDR"
	case a.Zone() != "":
		return netip.Prefix{}, "has a zone; write the address alone"
	case a.Is4In6():
		return netip.Prefix{}, "is an IPv4-mapped IPv6 address; write it in IPv4 form"
	}
	return netip.PrefixFrom(a, a.BitLen()), ""
}

func invalid(path, format string, args ...any) error {
	return model.Errorf(model.ErrUnprocessable, "%s: %s", path, fmt.Sprintf(format, args...))
}
