package netpolicy_test

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/netpolicy"
)

func TestFromE2B(t *testing.T) {
	yes, no := true, false
	allow := func(entries ...string) netpolicy.Rule {
		r := netpolicy.Rule{Action: netpolicy.Allow}
		for _, e := range entries {
			if _, err := netip.ParsePrefix(e); err == nil {
				r.CIDRs = append(r.CIDRs, e)
			} else if _, err := netip.ParseAddr(e); err == nil {
				r.CIDRs = append(r.CIDRs, e)
			} else {
				r.Domains = append(r.Domains, e)
			}
		}
		return r
	}
	deny := func(cidrs ...string) netpolicy.Rule { return netpolicy.Rule{Action: netpolicy.Deny, CIDRs: cidrs} }
	policy := func(def netpolicy.Action, rules ...netpolicy.Rule) netpolicy.Policy {
		return netpolicy.Policy{Version: 1, Default: def, Rules: rules}
	}
	for _, c := range []struct {
		name     string
		internet *bool
		allowOut []string
		denyOut  []string
		want     netpolicy.Policy
		// what E2B() reports back
		reportInternet bool
		reportAllow    []string
		reportDeny     []string
	}{
		{"default", nil, nil, nil, netpolicy.Public(), true, nil, nil},
		{"internet on", &yes, nil, nil, netpolicy.Public(), true, nil, nil},
		{"internet off", &no, nil, nil, netpolicy.None(), false, nil, []string{"0.0.0.0/0"}},
		{"deny all", nil, nil, []string{netpolicy.AllTraffic}, netpolicy.None(), false, nil, []string{"0.0.0.0/0"}},
		{"allow-list idiom", &yes, []string{"pypi.org", "1.1.1.1", "*.github.com", "8.8.8.0/24"}, []string{"0.0.0.0/0"},
			policy(netpolicy.Deny, allow("pypi.org", "1.1.1.1", "*.github.com", "8.8.8.0/24")),
			false, []string{"pypi.org", "*.github.com", "1.1.1.1", "8.8.8.0/24"}, []string{"0.0.0.0/0"}},
		{"internet off with exceptions", &no, []string{"api.example.com"}, nil,
			policy(netpolicy.Deny, allow("api.example.com")), false, []string{"api.example.com"}, []string{"0.0.0.0/0"}},
		{"deny some", nil, nil, []string{"8.8.8.8", "203.0.113.0/24"},
			policy(netpolicy.Allow, deny("8.8.8.8", "203.0.113.0/24")), true, nil, []string{"8.8.8.8", "203.0.113.0/24"}},
		{"allow wins over deny", nil, []string{"203.0.113.5"}, []string{"203.0.113.0/24", "0.0.0.0/0"},
			policy(netpolicy.Deny, allow("203.0.113.5"), deny("203.0.113.0/24")), false, []string{"203.0.113.5"}, []string{"203.0.113.0/24", "0.0.0.0/0"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := netpolicy.FromE2B(c.internet, c.allowOut, c.denyOut)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(p, c.want) {
				t.Fatalf("FromE2B = %+v, want %+v", p, c.want)
			}
			internet, allowOut, denyOut := p.E2B()
			if internet != c.reportInternet || !reflect.DeepEqual(allowOut, c.reportAllow) || !reflect.DeepEqual(denyOut, c.reportDeny) {
				t.Fatalf("E2B() = %v, %q, %q; want %v, %q, %q", internet, allowOut, denyOut, c.reportInternet, c.reportAllow, c.reportDeny)
			}
			// What getInfo reports maps back to the same policy.
			back, err := netpolicy.FromE2B(&internet, allowOut, denyOut)
			if err != nil || !reflect.DeepEqual(back, p) {
				t.Fatalf("FromE2B(E2B()) = %+v, %v; want %+v", back, err, p)
			}
		})
	}
}

func TestFromE2BDecisions(t *testing.T) {
	// E2B's precedence, through the decisions: allowOut wins over denyOut.
	p, err := netpolicy.FromE2B(nil, []string{"203.0.113.5", "pkg.example"}, []string{"203.0.113.0/24", "0.0.0.0/0"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := netpolicy.Compile(p, worker)
	if err != nil {
		t.Fatal(err)
	}
	check(t, c, map[conn]want{
		{"", "203.0.113.5", 443, "tcp"}:            {true, 0, "rule 0 allows 203.0.113.5/32"},
		{"", "203.0.113.6", 443, "tcp"}:            {false, 1, "rule 1 denies 203.0.113.0/24"},
		{"pkg.example", "203.0.113.9", 443, "tcp"}: {true, 0, "rule 0 allows pkg.example"},
		{"", "198.51.100.1", 443, "tcp"}:           {false, -1, "default deny"},
		{"", "203.0.113.7", 443, "tcp"}:            {false, -1, "host or sandbox address of this worker"}, // the guard first
	})
	// allowOut 0.0.0.0/0 is no way into private ranges.
	p, err = netpolicy.FromE2B(nil, []string{"0.0.0.0/0"}, []string{"0.0.0.0/0"})
	if err != nil {
		t.Fatal(err)
	}
	c, err = netpolicy.Compile(p, worker)
	if err != nil {
		t.Fatal(err)
	}
	check(t, c, map[conn]want{
		{"", "198.51.100.1", 443, "tcp"}:   {true, 0, "rule 0 allows 0.0.0.0/0"},
		{"", "169.254.169.254", 80, "tcp"}: {false, -1, "metadata"},
	})
}

func TestFromE2BErrors(t *testing.T) {
	for _, c := range []struct {
		allowOut, denyOut []string
		want              string
	}{
		{[]string{"ok.example", "*.*.x"}, nil, `allowOut[1]: "*.*.x" has a wildcard`},
		{[]string{"bad_name"}, nil, `allowOut[0]: "bad_name" has '_'`},
		{[]string{"10.0.0.1/8"}, nil, `allowOut[0]: "10.0.0.1/8" has host bits set`},
		{[]string{"1.2.3.4/33"}, nil, `allowOut[0]: "1.2.3.4/33" is not an IP address or CIDR`},
		{[]string{""}, nil, `allowOut[0]: "" is empty`},
		{nil, []string{"8.8.8.8", "evil.example"}, `denyOut[1]: "evil.example" is not an IP address or CIDR (denyOut takes no domain names`},
		{nil, []string{"10.0.0.1/8"}, `denyOut[0]: "10.0.0.1/8" has host bits set`},
	} {
		_, err := netpolicy.FromE2B(nil, c.allowOut, c.denyOut)
		if err == nil || !errors.Is(err, model.ErrUnprocessable) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("FromE2B(%q, %q) = %v, want %q", c.allowOut, c.denyOut, err, c.want)
		}
	}
}

func TestE2BReportOfOtherPolicies(t *testing.T) {
	// V1 policies E2B cannot say are reported approximately: ports,
	// protocols, TLS, denied domains are left out.
	p := mustParse(t, rules)
	internet, allowOut, denyOut := p.E2B()
	wantAllow := []string{"pkg.example", "*.cdn.example", "198.18.0.0/15", "ai.example", "2001:db8:1::/48", "six.example"}
	wantDeny := []string{"198.18.5.0/24", "0.0.0.0/0"}
	if internet || !reflect.DeepEqual(allowOut, wantAllow) || !reflect.DeepEqual(denyOut, wantDeny) {
		t.Errorf("E2B() = %v, %q, %q", internet, allowOut, denyOut)
	}
}
