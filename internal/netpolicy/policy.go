// Package netpolicy is NetworkPolicyV1: the JSON document that says where a
// sandbox may connect, its validation, and the decisions the worker's egress
// gateway (internal/egress) and data path (internal/network) take from it. It
// is pure: no root, no network, no I/O besides parsing.
//
// # The document
//
//	{"version": 1, "default": "deny",
//	 "rules": [
//	   {"action": "allow", "domains": ["pypi.org", "*.pythonhosted.org"], "ports": [443]},
//	   {"action": "allow", "domains": ["api.openai.com"], "tls": "intercept",
//	    "inject": {"headers": {"Authorization": {"secret": "openai"}}}},
//	   {"action": "deny",  "cidrs": ["203.0.113.0/24"]},
//	   {"action": "allow", "cidrs": ["198.18.0.0/15"], "ports": [80, "8000-8100"], "protocols": ["tcp", "udp"]}]}
//
// Parse reads it strictly (unknown or repeated fields, a wrong type, more than
// MaxSize bytes are refused) and Validate checks it; every error wraps
// model.ErrUnprocessable and names the field, e.g.
// `rules[2].ports[0]: 70000 is not a port (1-65535)`.
//
// Fields of a rule: action ("allow" or "deny", required); domains (exact
// names, or "*.example.com", which matches every subdomain at any depth but
// not example.com itself; a wildcard is only ever a whole leading "*." label;
// IP literals are refused, they belong in cidrs); cidrs ("203.0.113.0/24", or
// a bare address for one host; host bits must be zero); ports (443 or
// "8000-8100"; none = every port); protocols ("tcp", "udp"; none = tcp only);
// tls ("passthrough", the default, or "intercept"); inject (headers the
// gateway adds to intercepted requests, each naming a secret). A rule names at
// least one domain or CIDR. tls "intercept" and inject are only for allow
// rules that admit by name alone (domains, no cidrs) over tcp, and inject
// needs "intercept" (a header is never added to traffic the gateway cannot
// read, nor sent in clear).
//
// # Evaluation
//
// A connection (Compiled.Conn: name, destination IP, port, protocol) is
// decided in this order:
//
//  1. The guard, on the IP first (IPv4-mapped IPv6 addresses are unmapped
//     before anything looks at them). Unroutable addresses (0/8, loopback,
//     multicast, broadcast, 240/4, ::, ::1, ff00::/8) are refused always.
//     The Guard's Blocked ranges (private, link-local and the metadata
//     address, CGNAT, ULA, …, the host's own addresses, the worker's sandbox
//     range) are refused unless the operator set Guard.AllowPrivateCIDRs AND
//     an allow rule admits the address by a CIDR that lies inside the
//     blocked range (10.1.0.0/16 names part of 10/8 explicitly; 0.0.0.0/0
//     does not). Such a policy still compiles without the operator's
//     permission — the guard then wins at decision time — because policies
//     are checked by the server, which does not know a worker's guard; the
//     server can refuse them up front with Guard.Check.
//  2. The rules, in order: the FIRST rule that matches decides. A rule
//     matches when its ports include the port (or it has none), its
//     protocols include the protocol (none means tcp), and either the name
//     matches one of its domains or the IP lies in one of its cidrs (a rule
//     with both matches either way). An empty name (a connect to a raw IP,
//     no name seen) matches no domain: only CIDR rules, or the default, can
//     admit it.
//  3. Otherwise the default: "allow" admits any address the guard left
//     through, over tcp only; "deny" refuses.
//
// IPv6 destinations are refused unless an allow rule admits them by an IPv6
// CIDR: neither a domain rule nor the default admits IPv6 (Compiled.AllowsIPv6
// says whether the data path should give the sandbox IPv6 at all). UDP is
// admitted only by a rule listing "udp".
//
// A domain rule admits a connection by NAME. The gateway separately checks
// that the destination IP was handed out for that name to that sandbox by its
// own DNS (the defence against forged answers and shared-IP fronting); that is
// not this package's business, but nothing here admits an IP because a name
// is allowed. Compiled.Name is the DNS stage (may the name be resolved at
// all, on any port: a deny rule with ports refuses only those ports, so it
// does not stop resolution) and Compiled.Reachable filters the addresses an
// answer may carry (the rebinding defence: an allowed name resolving to
// 10.0.0.1 is no way in).
//
// # Profiles and E2B
//
// None (default deny, no rules) and Public (default allow; the guard keeps
// private, host and sandbox addresses out) are the built-in profiles.
// FromE2B maps E2B's allowInternetAccess and network.allowOut/denyOut onto
// V1, and Policy.E2B maps back for getInfo; see FromE2B for the rules and
// docs/network.md for examples.
package netpolicy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/airlock/airlock/internal/model"
)

// Version is the only document version there is.
const Version = 1

// MaxSize bounds a policy document in bytes.
const MaxSize = 64 << 10

// MaxRules bounds the rules of one policy.
const MaxRules = 1000

// Action is what a rule, or the default, does with what it matches.
type Action string

const (
	Allow Action = "allow"
	Deny  Action = "deny"
)

// TLSMode is how the gateway treats TLS on an allowed connection.
type TLSMode string

const (
	// Passthrough (the default) forwards the TLS stream untouched after
	// reading its SNI.
	Passthrough TLSMode = "passthrough"
	// Intercept terminates TLS with a certificate of the org's Airlock CA and
	// re-originates it to the upstream, so headers can be injected.
	Intercept TLSMode = "intercept"
)

// Policy is a NetworkPolicyV1 document. Read documents with Parse:
// json.Unmarshal into a Policy is lenient (it ignores unknown fields and
// validates nothing).
type Policy struct {
	Version int    `json:"version"`
	Default Action `json:"default"`
	Rules   []Rule `json:"rules,omitempty"`
}

// Rule is one entry of a policy; see the package comment.
type Rule struct {
	Action    Action      `json:"action"`
	Domains   []string    `json:"domains,omitempty"`
	CIDRs     []string    `json:"cidrs,omitempty"`
	Ports     []PortRange `json:"ports,omitempty"`
	Protocols []string    `json:"protocols,omitempty"`
	TLS       TLSMode     `json:"tls,omitempty"`
	Inject    *Inject     `json:"inject,omitempty"`
}

// Inject is what the gateway adds to intercepted requests.
type Inject struct {
	Headers map[string]SecretRef `json:"headers,omitempty"`
}

// SecretRef names a secret of the sandbox's org; the value reaches only the
// gateway.
type SecretRef struct {
	Secret string `json:"secret"`
}

// PortRange is an inclusive range of ports; From == To is one port. In JSON
// it is a number (443) or a string ("8000-8100", or "443").
type PortRange struct{ From, To uint16 }

// Port is the range of the one port p.
func Port(p uint16) PortRange { return PortRange{p, p} }

func (r PortRange) String() string {
	if r.From == r.To {
		return strconv.Itoa(int(r.From))
	}
	return fmt.Sprintf("%d-%d", r.From, r.To)
}

// Contains reports whether port p is in the range.
func (r PortRange) Contains(p uint16) bool { return r.From <= p && p <= r.To }

// MarshalJSON writes one port as a number and a range as "from-to".
func (r PortRange) MarshalJSON() ([]byte, error) {
	if r.From == r.To {
		return strconv.AppendUint(nil, uint64(r.From), 10), nil
	}
	return json.Marshal(r.String())
}

// UnmarshalJSON reads a number or a "from-to" string and checks the range.
func (r *PortRange) UnmarshalJSON(b []byte) error {
	pr, reason := decodePort(b)
	if reason != "" {
		return model.Errorf(model.ErrUnprocessable, "port: %s", reason)
	}
	*r = pr
	return nil
}

// decodePort reads a JSON port; reason is "" or why it is not a port.
func decodePort(raw []byte) (PortRange, string) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return PortRange{}, "not a string"
		}
		from, to, isRange := strings.Cut(s, "-")
		a, ok1 := portNumber(from)
		b, ok2 := a, ok1
		if isRange {
			b, ok2 = portNumber(to)
		}
		switch {
		case !ok1 || !ok2:
			return PortRange{}, fmt.Sprintf("%q is not a port or range (want 443 or \"8000-8100\", 1-65535)", s)
		case a > b:
			return PortRange{}, fmt.Sprintf("%q is not a range (from > to)", s)
		}
		return PortRange{uint16(a), uint16(b)}, ""
	}
	if n, ok := portNumber(string(raw)); ok {
		return PortRange{uint16(n), uint16(n)}, ""
	}
	if len(raw) > 0 && (raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9') {
		return PortRange{}, fmt.Sprintf("%s is not a port (1-65535)", raw)
	}
	return PortRange{}, fmt.Sprintf("want a port number or a \"from-to\" string, got %s", kind(raw))
}

func portNumber(s string) (uint64, bool) {
	if s == "" || s[0] < '0' || s[0] > '9' {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 64)
	return n, err == nil && n >= 1 && n <= 65535
}

// Parse reads a policy document strictly and validates it.
func Parse(b []byte) (Policy, error) {
	if len(b) > MaxSize {
		return Policy{}, model.Errorf(model.ErrUnprocessable, "policy: %d bytes is over the limit of %d", len(b), MaxSize)
	}
	if err := scan(b); err != nil {
		return Policy{}, err
	}
	p, err := decodePolicy(b)
	if err != nil {
		return Policy{}, err
	}
	return p, p.Validate()
}

// scan checks the syntax, refuses repeated keys (compared case-insensitively,
// as encoding/json matches them: {"default":"deny","Default":"allow"} is two
// readings of one field) and bounds the nesting.
func scan(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := scanValue(dec, "policy", 0); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return model.Errorf(model.ErrUnprocessable, "policy: data after the document")
	}
	return nil
}

func scanValue(dec *json.Decoder, path string, depth int) error {
	if depth > 8 {
		return model.Errorf(model.ErrUnprocessable, "%s: nested too deep", path)
	}
	tok, err := dec.Token()
	if err != nil {
		return syntaxError(path, err)
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return syntaxError(path, err)
			}
			key := tok.(string)
			sub := member(path, key)
			if seen[strings.ToLower(key)] {
				return model.Errorf(model.ErrUnprocessable, "%s: repeated", sub)
			}
			seen[strings.ToLower(key)] = true
			if err := scanValue(dec, sub, depth+1); err != nil {
				return err
			}
		}
	case json.Delim('['):
		for i := 0; dec.More(); i++ {
			if err := scanValue(dec, fmt.Sprintf("%s[%d]", path, i), depth+1); err != nil {
				return err
			}
		}
	default:
		return nil
	}
	if _, err := dec.Token(); err != nil { // the closing delimiter
		return syntaxError(path, err)
	}
	return nil
}

func syntaxError(path string, err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return model.Errorf(model.ErrUnprocessable, "%s: not valid JSON: the document ends too early", path)
	}
	return model.Errorf(model.ErrUnprocessable, "%s: not valid JSON: %v", path, err)
}

var plainKey = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// member is the path of key inside the object at path.
func member(path, key string) string {
	if path == "policy" {
		path = ""
	}
	if !plainKey.MatchString(key) {
		return path + "[" + strconv.Quote(key) + "]"
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

// The decoder below walks the document by hand, so that every error names
// its field and so that unknown fields are refused by their exact name.

func decodePolicy(b []byte) (Policy, error) {
	var p Policy
	m, err := object("policy", b, "version", "default", "rules")
	if err != nil {
		return p, err
	}
	if err := value("version", m["version"], &p.Version); err != nil {
		return p, err
	}
	if err := value("default", m["default"], &p.Default); err != nil {
		return p, err
	}
	rules, err := array("rules", m["rules"])
	if err != nil {
		return p, err
	}
	for i, raw := range rules {
		r, err := decodeRule(fmt.Sprintf("rules[%d]", i), raw)
		if err != nil {
			return p, err
		}
		p.Rules = append(p.Rules, r)
	}
	return p, nil
}

func decodeRule(path string, raw json.RawMessage) (Rule, error) {
	var r Rule
	m, err := object(path, raw, "action", "domains", "cidrs", "ports", "protocols", "tls", "inject")
	if err != nil {
		return r, err
	}
	for _, f := range []struct {
		key string
		dst any
	}{{"action", &r.Action}, {"domains", &r.Domains}, {"cidrs", &r.CIDRs}, {"protocols", &r.Protocols}, {"tls", &r.TLS}} {
		if err := value(path+"."+f.key, m[f.key], f.dst); err != nil {
			return r, err
		}
	}
	ports, err := array(path+".ports", m["ports"])
	if err != nil {
		return r, err
	}
	for i, raw := range ports {
		pr, reason := decodePort(raw)
		if reason != "" {
			return r, model.Errorf(model.ErrUnprocessable, "%s.ports[%d]: %s", path, i, reason)
		}
		r.Ports = append(r.Ports, pr)
	}
	if raw, ok := m["inject"]; ok && !isNull(raw) {
		r.Inject, err = decodeInject(path+".inject", raw)
	}
	return r, err
}

func decodeInject(path string, raw json.RawMessage) (*Inject, error) {
	m, err := object(path, raw, "headers")
	if err != nil {
		return nil, err
	}
	in := &Inject{}
	headers, err := object(path+".headers", m["headers"])
	if err != nil {
		return nil, err
	}
	for name, raw := range headers {
		hp := member(path+".headers", name)
		ref, err := object(hp, raw, "secret")
		if err != nil {
			return nil, err
		}
		var s SecretRef
		if err := value(hp+".secret", ref["secret"], &s.Secret); err != nil {
			return nil, err
		}
		if in.Headers == nil {
			in.Headers = map[string]SecretRef{}
		}
		in.Headers[name] = s
	}
	return in, nil
}

// object reads a JSON object (or null, as nothing) into its members; with
// known given, any other key is refused.
func object(path string, raw json.RawMessage, known ...string) (map[string]json.RawMessage, error) {
	if raw == nil || isNull(raw) {
		return nil, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, model.Errorf(model.ErrUnprocessable, "%s: want an object, got %s", path, kind(raw))
	}
	if known != nil {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if !slices.Contains(known, k) {
				return nil, model.Errorf(model.ErrUnprocessable, "%s: unknown field (known: %s)", member(path, k), strings.Join(known, ", "))
			}
		}
	}
	return m, nil
}

// array reads a JSON array (or null, as nothing); an empty array is nil, so
// that a policy re-encodes to itself.
func array(path string, raw json.RawMessage) ([]json.RawMessage, error) {
	if raw == nil || isNull(raw) {
		return nil, nil
	}
	var a []json.RawMessage
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, model.Errorf(model.ErrUnprocessable, "%s: want an array, got %s", path, kind(raw))
	}
	if len(a) == 0 {
		return nil, nil
	}
	return a, nil
}

// value decodes a scalar or a list of strings at path.
func value(path string, raw json.RawMessage, dst any) error {
	if raw == nil || isNull(raw) {
		return nil
	}
	if list, ok := dst.(*[]string); ok {
		items, err := array(path, raw)
		if err != nil {
			return err
		}
		for i, it := range items {
			var s string
			if err := value(fmt.Sprintf("%s[%d]", path, i), it, &s); err != nil {
				return err
			}
			*list = append(*list, s)
		}
		return nil
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		want := "a string"
		if _, ok := dst.(*int); ok {
			want = "an integer"
		}
		return model.Errorf(model.ErrUnprocessable, "%s: want %s, got %s", path, want, kind(raw))
	}
	return nil
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// kind names a JSON value for an error: its text when short, else its type.
func kind(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) <= 24 {
		return string(raw)
	}
	switch raw[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a long string"
	}
	return "a long value"
}
