package netpolicy_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/netpolicy"
)

const full = `{"version": 1, "default": "deny", "rules": [
  {"action": "allow", "domains": ["pypi.org", "*.pythonhosted.org"], "ports": [443, "8000-8100"]},
  {"action": "allow", "domains": ["api.openai.com"], "tls": "intercept",
   "inject": {"headers": {"Authorization": {"secret": "openai"}}}},
  {"action": "deny", "cidrs": ["203.0.113.0/24", "2001:db8::/32"]},
  {"action": "allow", "cidrs": ["198.18.0.1"], "protocols": ["tcp", "udp"], "tls": "passthrough"}]}`

func TestParse(t *testing.T) {
	p, err := netpolicy.Parse([]byte(full))
	if err != nil {
		t.Fatal(err)
	}
	want := netpolicy.Policy{Version: 1, Default: netpolicy.Deny, Rules: []netpolicy.Rule{
		{Action: netpolicy.Allow, Domains: []string{"pypi.org", "*.pythonhosted.org"}, Ports: []netpolicy.PortRange{{443, 443}, {8000, 8100}}},
		{Action: netpolicy.Allow, Domains: []string{"api.openai.com"}, TLS: netpolicy.Intercept,
			Inject: &netpolicy.Inject{Headers: map[string]netpolicy.SecretRef{"Authorization": {Secret: "openai"}}}},
		{Action: netpolicy.Deny, CIDRs: []string{"203.0.113.0/24", "2001:db8::/32"}},
		{Action: netpolicy.Allow, CIDRs: []string{"198.18.0.1"}, Protocols: []string{"tcp", "udp"}, TLS: netpolicy.Passthrough},
	}}
	if !reflect.DeepEqual(p, want) {
		t.Fatalf("Parse =\n%#v\nwant\n%#v", p, want)
	}
	// It re-encodes to the same policy.
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if p2, err := netpolicy.Parse(b); err != nil || !reflect.DeepEqual(p2, p) {
		t.Fatalf("re-parse of %s = %#v, %v", b, p2, err)
	}
}

func TestParseErrorsNameTheField(t *testing.T) {
	rule := func(r string) string {
		return `{"version":1,"default":"deny","rules":[{"action":"allow","domains":["a.example"]},` + r + `]}`
	}
	for _, c := range []struct{ doc, want string }{
		{`{"version":2,"default":"deny"}`, `version: 2 is not supported (want 1)`},
		{`{"default":"deny"}`, `version: missing (want 1)`},
		{`{"version":"1","default":"deny"}`, `version: want an integer, got "1"`},
		{`{"version":1}`, `default: missing`},
		{`{"version":1,"default":"maybe"}`, `default: "maybe" is not "allow" or "deny"`},
		{`{"version":1,"default":"deny","extra":true}`, `extra: unknown field (known: version, default, rules)`},
		{`{"version":1,"Version":1,"default":"deny"}`, `Version: repeated`},
		{`{"version":1,"default":"deny"} {}`, `policy: data after the document`},
		{`{"version":1,"default":"deny"`, `policy: not valid JSON`},
		{`[1]`, `policy: want an object, got [1]`},
		{`{"version":1,"default":"deny","rules":{}}`, `rules: want an array, got {}`},
		{rule(`{"action":"permit","domains":["x.example"]}`), `rules[1].action: "permit" is not "allow" or "deny"`},
		{rule(`{"domains":["x.example"]}`), `rules[1].action: missing`},
		{rule(`{"action":"allow"}`), `rules[1]: names no destination`},
		{rule(`{"action":"allow","domain":["x.example"]}`), `rules[1].domain: unknown field`},
		{rule(`{"action":"allow","domains":"x.example"}`), `rules[1].domains: want an array, got "x.example"`},
		{rule(`{"action":"allow","domains":["ok.example","*.*.x"]}`), `rules[1].domains[1]: "*.*.x" has a wildcard that is not the leading "*." label`},
		{rule(`{"action":"allow","domains":["a.*.x"]}`), `rules[1].domains[0]: "a.*.x" has a wildcard`},
		{rule(`{"action":"allow","domains":["*"]}`), `rules[1].domains[0]: "*" has a wildcard`},
		{rule(`{"action":"allow","domains":["1.2.3.4"]}`), `rules[1].domains[0]: "1.2.3.4" is an IP address, not a name`},
		{rule(`{"action":"allow","domains":["-a.example"]}`), `rules[1].domains[0]: "-a.example" has a label that starts or ends with a hyphen`},
		{rule(`{"action":"allow","domains":["a..example"]}`), `rules[1].domains[0]: "a..example" has an empty label`},
		{rule(`{"action":"allow","domains":["a_b.example"]}`), `rules[1].domains[0]: "a_b.example" has '_'`},
		{rule(`{"action":"allow","domains":["` + strings.Repeat("a", 64) + `.example"]}`), `rules[1].domains[0]: "aaaa`},
		{rule(`{"action":"allow","domains":[7]}`), `rules[1].domains[0]: want a string, got 7`},
		{rule(`{"action":"allow","cidrs":["10.0.0.1/8"]}`), `rules[1].cidrs[0]: "10.0.0.1/8" has host bits set (did you mean 10.0.0.0/8?)`},
		{rule(`{"action":"allow","cidrs":["example.com"]}`), `rules[1].cidrs[0]: "example.com" is not an IP address or CIDR`},
		{rule(`{"action":"allow","cidrs":["::ffff:10.0.0.0/104"]}`), `rules[1].cidrs[0]: "::ffff:10.0.0.0/104" is an IPv4-mapped IPv6 prefix`},
		{rule(`{"action":"allow","cidrs":["fe80::1%eth0"]}`), `rules[1].cidrs[0]: "fe80::1%eth0" has a zone`},
		{rule(`{"action":"allow","domains":["x.example"],"ports":[443,70000]}`), `rules[1].ports[1]: 70000 is not a port (1-65535)`},
		{rule(`{"action":"allow","domains":["x.example"],"ports":[0]}`), `rules[1].ports[0]: 0 is not a port (1-65535)`},
		{rule(`{"action":"allow","domains":["x.example"],"ports":["8100-8000"]}`), `rules[1].ports[0]: "8100-8000" is not a range (from > to)`},
		{rule(`{"action":"allow","domains":["x.example"],"ports":["http"]}`), `rules[1].ports[0]: "http" is not a port or range`},
		{rule(`{"action":"allow","domains":["x.example"],"ports":[true]}`), `rules[1].ports[0]: want a port number or a "from-to" string, got true`},
		{rule(`{"action":"allow","domains":["x.example"],"ports":[44.3]}`), `rules[1].ports[0]: 44.3 is not a port`},
		{rule(`{"action":"allow","domains":["x.example"],"protocols":["icmp"]}`), `rules[1].protocols[0]: "icmp" is not "tcp" or "udp"`},
		{rule(`{"action":"allow","domains":["x.example"],"protocols":["udp","udp"]}`), `rules[1].protocols[1]: "udp" repeated`},
		{rule(`{"action":"allow","domains":["x.example"],"tls":"mitm"}`), `rules[1].tls: "mitm" is not "passthrough" or "intercept"`},
		{rule(`{"action":"deny","domains":["x.example"],"tls":"intercept"}`), `rules[1].tls: intercept is only for allow rules`},
		{rule(`{"action":"allow","cidrs":["198.18.0.0/15"],"tls":"intercept"}`), `rules[1].tls: intercept needs domains`},
		{rule(`{"action":"allow","domains":["x.example"],"cidrs":["198.18.0.0/15"],"tls":"intercept"}`), `rules[1].cidrs: a rule with "tls": "intercept" admits by name only`},
		{rule(`{"action":"allow","domains":["x.example"],"protocols":["udp"],"tls":"intercept"}`), `rules[1].tls: intercept needs tcp`},
		{rule(`{"action":"allow","domains":["x.example"],"inject":{"headers":{"X-Key":{"secret":"k"}}}}`), `rules[1].inject: needs "tls": "intercept"`},
		{rule(`{"action":"allow","domains":["x.example"],"tls":"intercept","inject":{}}`), `rules[1].inject.headers: no headers`},
		{rule(`{"action":"allow","domains":["x.example"],"tls":"intercept","inject":{"header":{}}}`), `rules[1].inject.header: unknown field`},
		{rule(`{"action":"allow","domains":["x.example"],"tls":"intercept","inject":{"headers":{"Bad Name":{"secret":"k"}}}}`), `rules[1].inject.headers["Bad Name"]: "Bad Name" is not an HTTP header name`},
		{rule(`{"action":"allow","domains":["x.example"],"tls":"intercept","inject":{"headers":{"Host":{"secret":"k"}}}}`), `rules[1].inject.headers.Host: Host frames the request`},
		{rule(`{"action":"allow","domains":["x.example"],"tls":"intercept","inject":{"headers":{"X-Key":{"secret":"Bad!"}}}}`), `rules[1].inject.headers.X-Key.secret: "Bad!" is not a secret name`},
		{rule(`{"action":"allow","domains":["x.example"],"tls":"intercept","inject":{"headers":{"X-Key":{"secret":"k","other":1}}}}`), `rules[1].inject.headers.X-Key.other: unknown field`},
		{rule(`{"action":"allow","domains":["x.example"],"tls":"intercept","inject":{"headers":{"X-Key":{"secret":"k"},"x-key":{"secret":"j"}}}}`), `rules[1].inject.headers.x-key: repeated`},
		{`{"version":1,"default":"deny","rules":[[[[[[[[[[1]]]]]]]]]]}`, `nested too deep`},
		{`{"version":1,"default":"deny","rules":[` + strings.Repeat(`{"action":"deny","cidrs":["198.18.0.0/15"]},`, 2000) + `]}`, `bytes is over the limit of 65536`},
	} {
		_, err := netpolicy.Parse([]byte(c.doc))
		if err == nil {
			t.Errorf("Parse(%.80s) = nil error, want %q", c.doc, c.want)
			continue
		}
		if !errors.Is(err, model.ErrUnprocessable) {
			t.Errorf("Parse(%.80s): %v does not wrap ErrUnprocessable", c.doc, err)
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%.80s) = %q, want it to contain %q", c.doc, err, c.want)
		}
	}
}

func TestValidateBuiltPolicies(t *testing.T) {
	// Policies built in Go, not parsed, are held to the same rules.
	many := netpolicy.Policy{Version: 1, Default: netpolicy.Deny}
	for range netpolicy.MaxRules + 1 {
		many.Rules = append(many.Rules, netpolicy.Rule{Action: netpolicy.Deny, CIDRs: []string{"198.18.0.0/15"}})
	}
	for _, c := range []struct {
		p    netpolicy.Policy
		want string
	}{
		{many, "rules: 1001 rules, at most 1000"},
		{netpolicy.Policy{Version: 1, Default: netpolicy.Allow, Rules: []netpolicy.Rule{{Action: netpolicy.Allow, Domains: []string{"a.example"}, Ports: []netpolicy.PortRange{{90, 80}}}}}, "rules[0].ports[0]: 90-80 is not a range"},
		{netpolicy.Policy{Version: 1, Default: netpolicy.Allow, Rules: []netpolicy.Rule{{Action: netpolicy.Allow, Domains: []string{"a.example"}, TLS: netpolicy.Intercept,
			Inject: &netpolicy.Inject{Headers: map[string]netpolicy.SecretRef{"Content-Length": {Secret: "k"}}}}}}, "rules[0].inject.headers.Content-Length: Content-Length frames the request"},
	} {
		err := c.p.Validate()
		if err == nil || !errors.Is(err, model.ErrUnprocessable) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate = %v, want %q", err, c.want)
		}
	}
	for _, p := range []netpolicy.Policy{netpolicy.None(), netpolicy.Public()} {
		if err := p.Validate(); err != nil {
			t.Errorf("%+v: %v", p, err)
		}
	}
}

func TestPortRangeJSON(t *testing.T) {
	for _, c := range []struct {
		in   string
		want netpolicy.PortRange
		out  string
	}{
		{`443`, netpolicy.Port(443), `443`},
		{`"443"`, netpolicy.Port(443), `443`},
		{`"8000-8100"`, netpolicy.PortRange{8000, 8100}, `"8000-8100"`},
		{`"1-65535"`, netpolicy.PortRange{1, 65535}, `"1-65535"`},
		{`65535`, netpolicy.Port(65535), `65535`},
	} {
		var r netpolicy.PortRange
		if err := json.Unmarshal([]byte(c.in), &r); err != nil || r != c.want {
			t.Errorf("Unmarshal(%s) = %v, %v; want %v", c.in, r, err, c.want)
			continue
		}
		if b, err := json.Marshal(r); err != nil || string(b) != c.out {
			t.Errorf("Marshal(%v) = %s, %v; want %s", r, b, err, c.out)
		}
	}
	for _, bad := range []string{`0`, `65536`, `-1`, `"0-10"`, `"10-"`, `"-10"`, `"a-b"`, `"20-10"`, `"+80"`, `1e2`, `null`, `[80]`, `" 80"`} {
		var r netpolicy.PortRange
		err := json.Unmarshal([]byte(bad), &r)
		if err == nil {
			t.Errorf("Unmarshal(%s) = %v, want an error", bad, r)
		} else if !errors.Is(err, model.ErrUnprocessable) {
			t.Errorf("Unmarshal(%s): %v does not wrap ErrUnprocessable", bad, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(full))
	f.Add([]byte(`{"version":1,"default":"allow"}`))
	f.Add([]byte(`{"version":1,"default":"deny","rules":[{"action":"allow","domains":["*.A.example."],"ports":["1-2",3],"protocols":["udp"]}]}`))
	f.Add([]byte(`{"version":1,"default":"deny","rules":[{"action":"deny","cidrs":["::/0","0.0.0.0/0"]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := netpolicy.Parse(b)
		if err != nil {
			if !errors.Is(err, model.ErrUnprocessable) {
				t.Fatalf("Parse error %v does not wrap ErrUnprocessable", err)
			}
			return
		}
		out, err := json.Marshal(p)
		if err != nil {
			t.Fatalf("Marshal(%#v): %v", p, err)
		}
		p2, err := netpolicy.Parse(out)
		if err != nil {
			t.Fatalf("re-parse of %s: %v", out, err)
		}
		if !reflect.DeepEqual(p, p2) {
			t.Fatalf("re-parse differs:\n%#v\n%#v", p, p2)
		}
		if _, err := netpolicy.Compile(p, netpolicy.DefaultGuard()); err != nil {
			t.Fatalf("Compile of a parsed policy: %v", err)
		}
	})
}
