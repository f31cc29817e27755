package netpolicy_test

import (
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/netpolicy"
)

// The worker of these tests: its public address is 203.0.113.7 and its
// sandboxes live in 100.64.0.0/16. 198.18.0.0/15 and 198.51.100.0/24 play
// the internet.
var worker = netpolicy.DefaultGuard(netip.MustParsePrefix("203.0.113.7/32"), netip.MustParsePrefix("100.64.0.0/16"))

func compile(t *testing.T, doc string, g netpolicy.Guard) *netpolicy.Compiled {
	t.Helper()
	p, err := netpolicy.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	c, err := netpolicy.Compile(p, g)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type conn struct {
	name  string
	ip    string
	port  uint16
	proto string
}

type want struct {
	allow  bool
	rule   int
	reason string // the Reason, or a part of it
}

func check(t *testing.T, c *netpolicy.Compiled, cases map[conn]want) {
	t.Helper()
	for in, w := range cases {
		var ip netip.Addr
		if in.ip != "" {
			ip = netip.MustParseAddr(in.ip)
		}
		d := c.Conn(in.name, ip, in.port, in.proto)
		if d.Allow != w.allow || d.Rule != w.rule || !strings.Contains(d.Reason, w.reason) {
			t.Errorf("Conn(%q, %s, %d, %q) = %+v, want allow=%v rule=%d reason~%q", in.name, in.ip, in.port, in.proto, d, w.allow, w.rule, w.reason)
		}
		if d.Allow && d.TLS == "" {
			t.Errorf("Conn(%q, %s, %d, %q): allowed with no TLS mode", in.name, in.ip, in.port, in.proto)
		}
	}
}

const rules = `{"version": 1, "default": "deny", "rules": [
  {"action": "deny",  "domains": ["*.evil.example"]},
  {"action": "allow", "domains": ["pkg.example", "*.cdn.example"], "ports": [443, "8000-8100"]},
  {"action": "deny",  "cidrs": ["198.18.5.0/24"]},
  {"action": "allow", "cidrs": ["198.18.0.0/15"], "protocols": ["tcp", "udp"]},
  {"action": "allow", "domains": ["ai.example"], "tls": "intercept", "inject": {"headers": {"Authorization": {"secret": "openai"}}}},
  {"action": "allow", "cidrs": ["2001:db8:1::/48"]},
  {"action": "allow", "domains": ["six.example"]}]}`

func TestConnRules(t *testing.T) {
	c := compile(t, rules, worker)
	check(t, c, map[conn]want{
		// First match decides, by name, port and protocol.
		{"pkg.example", "198.51.100.1", 443, "tcp"}:   {true, 1, "rule 1 allows pkg.example"},
		{"PKG.Example.", "198.51.100.1", 443, ""}:     {true, 1, "rule 1 allows pkg.example"},
		{"pkg.example", "198.51.100.1", 8050, "tcp"}:  {true, 1, "rule 1 allows pkg.example"},
		{"pkg.example", "198.51.100.1", 80, "tcp"}:    {false, -1, "default deny"},
		{"pkg.example", "198.51.100.1", 443, "udp"}:   {false, -1, "default deny"},
		{"a.b.cdn.example", "198.51.100.1", 443, ""}:  {true, 1, "rule 1 allows *.cdn.example"},
		{"cdn.example", "198.51.100.1", 443, ""}:      {false, -1, "default deny"},
		{"x.evil.example", "198.18.0.1", 443, "tcp"}:  {false, 0, "rule 0 denies *.evil.example"}, // before the CIDR allow
		{"", "198.18.0.9", 22, "tcp"}:                 {true, 3, "rule 3 allows 198.18.0.0/15"},
		{"", "198.18.0.9", 53, "udp"}:                 {true, 3, "rule 3 allows 198.18.0.0/15"},
		{"", "198.18.5.9", 22, "tcp"}:                 {false, 2, "rule 2 denies 198.18.5.0/24"},
		{"unlisted.example", "198.18.0.9", 443, ""}:   {true, 3, "rule 3 allows 198.18.0.0/15"}, // a rule with cidrs admits by address
		{"", "198.51.100.1", 443, "tcp"}:              {false, -1, "default deny"},
		{"", "::ffff:198.18.0.9", 22, "tcp"}:          {true, 3, "rule 3 allows 198.18.0.0/15"}, // unmapped
		{"", "2001:db8:1::5", 443, "tcp"}:             {true, 5, "rule 5 allows 2001:db8:1::/48"},
		{"six.example", "2001:db8:2::1", 443, "tcp"}:  {false, -1, "2001:db8:2::1 is IPv6, which only a CIDR rule admits"},
		{"six.example", "198.51.100.1", 443, "tcp"}:   {true, 6, "rule 6 allows six.example"},
		{"pkg.example", "198.51.100.1", 443, "icmp"}:  {false, -1, `protocol "icmp" is never admitted`},
		{"pkg.example", "198.51.100.1", 0, "tcp"}:     {false, -1, "port 0"},
		{"bad_name.example", "198.51.100.1", 443, ""}: {false, -1, `name "bad_name.example" has '_'`},
		{"pkg.example", "", 443, "tcp"}:               {false, -1, "no destination address"},
		{"198.51.100.1", "198.51.100.1", 443, "tcp"}:  {false, -1, "is an IP address, not a name"},
		{"", "198.51.100.1", 443, "tcp"}:              {false, -1, "default deny"},
		{"ai.example", "198.51.100.1", 443, "tcp"}:    {true, 4, "rule 4 allows ai.example"},
	})
	d := c.Conn("ai.example", netip.MustParseAddr("198.51.100.1"), 443, "tcp")
	if d.TLS != netpolicy.Intercept || d.Inject == nil || d.Inject.Headers["Authorization"].Secret != "openai" {
		t.Errorf("intercept rule: %+v", d)
	}
	if d := c.Conn("pkg.example", netip.MustParseAddr("198.51.100.1"), 443, "tcp"); d.TLS != netpolicy.Passthrough || d.Inject != nil {
		t.Errorf("passthrough rule: %+v", d)
	}
	if !c.AllowsIPv6() {
		t.Error("AllowsIPv6 = false with an IPv6 allow CIDR")
	}
}

func TestConnGuard(t *testing.T) {
	for name, doc := range map[string]string{
		"public": `{"version":1,"default":"allow"}`,
		// Rules that would admit everything by name or by a broad CIDR
		// still do not reach what the guard blocks.
		"broad": `{"version":1,"default":"allow","rules":[{"action":"allow","domains":["pkg.example"],"cidrs":["0.0.0.0/0","::/0"],"protocols":["tcp","udp"]}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			check(t, compile(t, doc, worker), map[conn]want{
				{"", "169.254.169.254", 80, "tcp"}:         {false, -1, "169.254.169.254 is link-local (metadata) and never reachable"},
				{"pkg.example", "169.254.169.254", 80, ""}: {false, -1, "link-local (metadata)"},
				{"", "169.254.1.1", 80, "tcp"}:             {false, -1, "169.254.1.1 is link-local (169.254.0.0/16) and never reachable"},
				{"pkg.example", "10.1.2.3", 443, "tcp"}:    {false, -1, "10.1.2.3 is private (10.0.0.0/8) and never reachable"},
				{"", "172.16.0.1", 443, "tcp"}:             {false, -1, "private (172.16.0.0/12)"},
				{"", "192.168.1.1", 443, "tcp"}:            {false, -1, "private (192.168.0.0/16)"},
				{"", "::ffff:10.0.0.1", 443, "tcp"}:        {false, -1, "10.0.0.1 is private (10.0.0.0/8)"},
				{"", "::ffff:127.0.0.1", 443, "tcp"}:       {false, -1, "127.0.0.1 is loopback and never reachable"},
				{"", "127.0.0.53", 53, "udp"}:              {false, -1, "loopback"},
				{"", "::1", 443, "tcp"}:                    {false, -1, "::1 is loopback and never reachable"},
				{"", "::", 443, "tcp"}:                     {false, -1, "unspecified"},
				{"", "0.0.0.0", 443, "tcp"}:                {false, -1, `"this network"`},
				{"", "224.0.0.251", 5353, "udp"}:           {false, -1, "multicast"},
				{"", "255.255.255.255", 67, "udp"}:         {false, -1, "broadcast"},
				{"", "240.0.0.1", 443, "tcp"}:              {false, -1, "reserved"},
				{"", "100.64.0.5", 22, "tcp"}:              {false, -1, "100.64.0.5 is a host or sandbox address of this worker (100.64.0.0/16)"},
				{"", "100.100.0.1", 22, "tcp"}:             {false, -1, "shared address space, CGNAT (100.64.0.0/10)"},
				{"", "203.0.113.7", 22, "tcp"}:             {false, -1, "203.0.113.7 is a host or sandbox address of this worker"},
				{"", "fd00:ec2::254", 80, "tcp"}:           {false, -1, "fd00:ec2::254 is unique local (metadata)"},
				{"", "fd12::1", 443, "tcp"}:                {false, -1, "unique local (fc00::/7)"},
				{"", "fe80::1", 443, "tcp"}:                {false, -1, "link-local (fe80::/10)"},
				{"", "64:ff9b::a00:1", 443, "tcp"}:         {false, -1, "NAT64"},
				{"", "2002:a00:1::1", 443, "tcp"}:          {false, -1, "6to4"},
			})
		})
	}
}

func TestConnProfiles(t *testing.T) {
	pub, err := netpolicy.Compile(netpolicy.Public(), worker)
	if err != nil {
		t.Fatal(err)
	}
	check(t, pub, map[conn]want{
		{"anything.example", "198.51.100.1", 443, "tcp"}: {true, -1, "default allow"},
		{"", "198.51.100.1", 22, ""}:                     {true, -1, "default allow"},
		{"", "203.0.113.8", 443, "tcp"}:                  {true, -1, "default allow"}, // the host's neighbour is not the host
		{"", "198.51.100.1", 443, "udp"}:                 {false, -1, "default allow admits tcp only"},
		{"", "2001:db8::1", 443, "tcp"}:                  {false, -1, "IPv6, which only a CIDR rule admits"},
		{"", "10.0.0.1", 443, "tcp"}:                     {false, -1, "private"},
	})
	if pub.AllowsIPv6() {
		t.Error("public: AllowsIPv6 = true")
	}
	if d := pub.Name("anything.example"); !d.Allow || d.Reason != "default allow" {
		t.Errorf("public: Name = %+v", d)
	}
	none, err := netpolicy.Compile(netpolicy.None(), worker)
	if err != nil {
		t.Fatal(err)
	}
	check(t, none, map[conn]want{
		{"anything.example", "198.51.100.1", 443, "tcp"}: {false, -1, "default deny"},
		{"", "198.51.100.1", 443, "tcp"}:                 {false, -1, "default deny"},
		{"", "10.0.0.1", 443, "tcp"}:                     {false, -1, "10.0.0.1 is private (10.0.0.0/8) and never reachable"}, // the guard first
	})
	if d := none.Name("anything.example"); d.Allow || d.Reason != "default deny" {
		t.Errorf("none: Name = %+v", d)
	}
	for name, want := range map[string]netpolicy.Policy{"none": netpolicy.None(), "public": netpolicy.Public()} {
		if got, ok := netpolicy.Builtin(name); !ok || got.Default != want.Default || len(got.Rules) != 0 {
			t.Errorf("Builtin(%q) = %+v, %v", name, got, ok)
		}
	}
	if _, ok := netpolicy.Builtin("other"); ok {
		t.Error(`Builtin("other") found`)
	}
}

const private = `{"version": 1, "default": "allow", "rules": [
  {"action": "deny",  "cidrs": ["10.1.9.0/24"]},
  {"action": "allow", "cidrs": ["10.1.0.0/16"]},
  {"action": "allow", "cidrs": ["0.0.0.0/0"]},
  {"action": "allow", "domains": ["corp.example"]},
  {"action": "allow", "cidrs": ["100.64.0.0/10"]},
  {"action": "allow", "cidrs": ["169.254.169.254", "127.0.0.0/8", "fd12::/16"]}]}`

func TestConnPrivateCIDRs(t *testing.T) {
	permitted := worker
	permitted.AllowPrivateCIDRs = true
	check(t, compile(t, private, permitted), map[conn]want{
		{"", "10.1.2.3", 5432, "tcp"}:         {true, 1, "rule 1 allows 10.1.0.0/16 (10.1.2.3 is private (10.0.0.0/8); private CIDRs permitted by the operator)"},
		{"", "10.1.9.1", 5432, "tcp"}:         {false, 0, "rule 0 denies 10.1.9.0/24"},
		{"", "10.2.0.1", 5432, "tcp"}:         {false, -1, "10.2.0.1 is private (10.0.0.0/8) and no CIDR rule names it"}, // 0.0.0.0/0 does not name it
		{"corp.example", "10.3.0.1", 443, ""}: {false, -1, "no CIDR rule names it"},                                      // nor does a domain
		{"", "100.100.0.1", 22, "tcp"}:        {true, 4, "rule 4 allows 100.64.0.0/10"},
		{"", "100.64.0.5", 22, "tcp"}:         {false, -1, "host or sandbox address of this worker (100.64.0.0/16) and no CIDR rule names it"}, // the /10 is wider than the sandbox range
		{"", "169.254.169.254", 80, "tcp"}:    {true, 5, "rule 5 allows 169.254.169.254/32"},
		{"", "127.0.0.1", 80, "tcp"}:          {false, -1, "127.0.0.1 is loopback and never reachable"}, // never, whatever the operator says
		{"", "fd12::1", 443, "tcp"}:           {true, 5, "rule 5 allows fd12::/16"},
		{"", "198.51.100.1", 443, "tcp"}:      {true, 2, "rule 2 allows 0.0.0.0/0"},
		{"", "10.1.2.3", 5432, "udp"}:         {false, -1, "no CIDR rule names it"}, // rule 1 is tcp only
	})
	// Without the operator's permission the same policy compiles, and the
	// guard wins at decision time; Guard.Check refuses it up front.
	check(t, compile(t, private, worker), map[conn]want{
		{"", "10.1.2.3", 5432, "tcp"}:      {false, -1, "10.1.2.3 is private (10.0.0.0/8) and never reachable"},
		{"", "169.254.169.254", 80, "tcp"}: {false, -1, "169.254.169.254 is link-local (metadata) and never reachable"},
		{"", "198.51.100.1", 443, "tcp"}:   {true, 2, "rule 2 allows 0.0.0.0/0"},
	})
	p, _ := netpolicy.Parse([]byte(private))
	err := worker.Check(p)
	if err == nil || !errors.Is(err, model.ErrUnprocessable) || !strings.Contains(err.Error(), `rules[1].cidrs[0]: "10.1.0.0/16" lies in 10.0.0.0/8 (private)`) {
		t.Errorf("Check = %v", err)
	}
	if err := permitted.Check(p); err != nil {
		t.Errorf("Check with permission = %v", err)
	}
	if err := worker.Check(netpolicy.Public()); err != nil {
		t.Errorf("Check(Public) = %v", err)
	}
	if err := worker.Check(mustParse(t, `{"version":1,"default":"deny","rules":[{"action":"deny","cidrs":["10.0.0.0/8"]},{"action":"allow","cidrs":["0.0.0.0/0"]}]}`)); err != nil {
		t.Errorf("Check of a deny rule and a wide allow = %v", err)
	}
}

func mustParse(t *testing.T, doc string) netpolicy.Policy {
	t.Helper()
	p, err := netpolicy.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestName(t *testing.T) {
	c := compile(t, rules, worker)
	for name, w := range map[string]want{
		"pkg.example":     {true, 1, "rule 1 allows pkg.example"},
		"x.cdn.example":   {true, 1, "rule 1 allows *.cdn.example"},
		"ai.example":      {true, 4, "rule 4 allows ai.example"},
		"x.evil.example":  {false, 0, "rule 0 denies *.evil.example"},
		"unknown.example": {false, -1, "default deny"}, // CIDR rules play no part
		"bad_name":        {false, -1, `name "bad_name" has '_'`},
		"10.0.0.1":        {false, -1, "is an IP address"},
	} {
		if d := c.Name(name); d.Allow != w.allow || d.Rule != w.rule || !strings.Contains(d.Reason, w.reason) {
			t.Errorf("Name(%q) = %+v, want %+v", name, d, w)
		}
	}
	// A deny rule limited to some ports, or to udp, leaves the name
	// resolvable; Conn then decides per port.
	c = compile(t, `{"version":1,"default":"deny","rules":[
	  {"action":"deny","domains":["a.example"],"ports":[80]},
	  {"action":"deny","domains":["a.example"],"protocols":["udp"]},
	  {"action":"allow","domains":["a.example"]},
	  {"action":"deny","domains":["b.example"]},
	  {"action":"allow","domains":["b.example"]}]}`, worker)
	for name, w := range map[string]want{
		"a.example": {true, 2, "rule 2 allows a.example"},
		"b.example": {false, 3, "rule 3 denies b.example"},
	} {
		if d := c.Name(name); d.Allow != w.allow || d.Rule != w.rule || d.Reason != w.reason {
			t.Errorf("Name(%q) = %+v, want %+v", name, d, w)
		}
	}
	check(t, c, map[conn]want{
		{"a.example", "198.51.100.1", 80, "tcp"}:  {false, 0, "rule 0 denies a.example"},
		{"a.example", "198.51.100.1", 443, "tcp"}: {true, 2, "rule 2 allows a.example"},
	})
}

func TestReachable(t *testing.T) {
	c := compile(t, rules, worker)
	for ip, w := range map[string]want{
		"198.51.100.1":     {true, -1, "198.51.100.1 is a public address"},
		"10.0.0.1":         {false, -1, "10.0.0.1 is private (10.0.0.0/8) and never reachable"}, // rebinding
		"::ffff:127.0.0.1": {false, -1, "127.0.0.1 is loopback"},
		"169.254.169.254":  {false, -1, "metadata"},
		"100.64.0.9":       {false, -1, "host or sandbox address of this worker"},
		"2001:db8:1::1":    {true, 5, "rule 5 allows 2001:db8:1::/48"},
		"2001:db8:2::1":    {false, -1, "IPv6, which only a CIDR rule admits"},
	} {
		if d := c.Reachable(netip.MustParseAddr(ip)); d.Allow != w.allow || d.Rule != w.rule || !strings.Contains(d.Reason, w.reason) {
			t.Errorf("Reachable(%s) = %+v, want %+v", ip, d, w)
		}
	}
	permitted := worker
	permitted.AllowPrivateCIDRs = true
	c = compile(t, private, permitted)
	for ip, w := range map[string]want{
		"10.1.2.3":   {true, 1, "rule 1 allows 10.1.0.0/16"},
		"10.2.0.1":   {false, -1, "no CIDR rule names it"},
		"100.64.0.5": {false, -1, "no CIDR rule names it"},
		"127.0.0.1":  {false, -1, "never reachable"},
	} {
		if d := c.Reachable(netip.MustParseAddr(ip)); d.Allow != w.allow || d.Rule != w.rule || !strings.Contains(d.Reason, w.reason) {
			t.Errorf("permitted: Reachable(%s) = %+v, want %+v", ip, d, w)
		}
	}
}

func TestCompile(t *testing.T) {
	if _, err := netpolicy.Compile(netpolicy.Policy{Version: 1}, worker); err == nil || !errors.Is(err, model.ErrUnprocessable) {
		t.Errorf("Compile of an invalid policy = %v", err)
	}
	if _, err := netpolicy.Compile(netpolicy.Public(), netpolicy.Guard{Blocked: []netip.Prefix{{}}}); err == nil {
		t.Error("Compile with an invalid guard prefix: no error")
	}
	// A zero Guard still refuses the unroutable addresses.
	c, err := netpolicy.Compile(netpolicy.Public(), netpolicy.Guard{})
	if err != nil {
		t.Fatal(err)
	}
	check(t, c, map[conn]want{
		{"", "127.0.0.1", 80, "tcp"}: {false, -1, "loopback and never reachable"},
		{"", "10.0.0.1", 80, "tcp"}:  {true, -1, "default allow"},
	})
	// The compiled policy does not share the document's inject map.
	p := mustParse(t, `{"version":1,"default":"deny","rules":[{"action":"allow","domains":["ai.example"],"tls":"intercept","inject":{"headers":{"X-Key":{"secret":"a"}}}}]}`)
	c, err = netpolicy.Compile(p, worker)
	if err != nil {
		t.Fatal(err)
	}
	p.Rules[0].Inject.Headers["X-Key"] = netpolicy.SecretRef{Secret: "changed"}
	if d := c.Conn("ai.example", netip.MustParseAddr("198.51.100.1"), 443, "tcp"); d.Inject.Headers["X-Key"].Secret != "a" {
		t.Errorf("inject after the document changed = %+v", d.Inject)
	}
	// DefaultGuard unmaps IPv4-mapped extras.
	g := netpolicy.DefaultGuard(netip.MustParsePrefix("::ffff:198.51.100.0/120"))
	c, err = netpolicy.Compile(netpolicy.Public(), g)
	if err != nil {
		t.Fatal(err)
	}
	check(t, c, map[conn]want{{"", "198.51.100.9", 443, "tcp"}: {false, -1, "198.51.100.9 is a host or sandbox address of this worker (198.51.100.0/24)"}})
}

func TestConcurrentDecisions(t *testing.T) {
	c := compile(t, rules, worker)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 1000 {
				if d := c.Conn("pkg.example", netip.MustParseAddr("198.51.100.1"), 443, "tcp"); !d.Allow {
					t.Errorf("Conn = %+v", d)
					return
				}
				c.Name("x.cdn.example")
				c.Reachable(netip.MustParseAddr("10.0.0.1"))
			}
		})
	}
	wg.Wait()
}
