package e2e

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/egress/egresstest"
	"github.com/airlock/airlock/internal/model"
)

// TestEgressIPv6: inside a gVisor sandbox under `airlock up --egress`, a
// policy with an IPv6 CIDR allow rule gives the guest IPv6 (fd00:64::2,
// ::/0 via the gateway): curl -6 reaches the test internet's IPv6 HTTP
// server by address and by its AAAA name, through the gateway (which
// still denies IPv6 the policy does not name); a sandbox whose policy has
// no IPv6 CIDR has no IPv6 address at all, and the same attempts fail;
// an update adding an IPv6 CIDR applies from its next start (a wake).
func TestEgressIPv6(t *testing.T) {
	s := need(t)
	in := egresstest.Start(t, egresstest.Config{})
	if !in.Prefix6.IsValid() {
		t.Skipf("the test internet has no IPv6: %s", in.IPv6Reason)
	}
	c, logPath := egressUp(t, s, in, "public", "gvisor")
	six, addr6 := egresstest.Name(egresstest.Six), in.Addr6(2)
	policy := `{"version":1,"default":"deny","rules":[
		{"action":"allow","domains":["` + six + `"]},
		{"action":"allow","cidrs":["` + in.Prefix6.String() + `"],"ports":[80]},
		{"action":"allow","cidrs":["` + in.Prefix6.String() + `"],"ports":[7],"protocols":["udp"]}]}`
	id := newSandbox(t, c, client.CreateSandboxRequest{Network: &apitypes.NetworkRequest{Policy: []byte(policy)}}).ID
	none := newSandbox(t, c, client.CreateSandboxRequest{}).ID // the public profile: no IPv6 CIDR

	reach := func(sb, args string) (bool, string, int) {
		t.Helper()
		out, _, ms := timed(t, c, sb, "curl -6 -sS -m 20 "+args)
		return strings.Contains(out, "airlock-inet"), out, ms
	}
	if out, _, _ := timed(t, c, id, "cat /proc/net/if_inet6"); !strings.Contains(out, "fd000064000000000000000000000002") {
		t.Errorf("the IPv6 sandbox's guest lacks fd00:64::2:\n%s", out)
	}
	if out, _, _ := timed(t, c, none, "cat /proc/net/if_inet6"); strings.Contains(out, "fd00") || strings.Contains(out, "eth0") {
		t.Errorf("the sandbox without an IPv6 rule has IPv6 on eth0:\n%s", out)
	}
	for _, tc := range []struct {
		what, sb, args string
		want           bool
	}{
		{"IPv6 by address", id, "http://[" + addr6.String() + "]/v6-address", true},
		{"IPv6 by AAAA name", id, "http://" + six + "/v6-name", true},
		{"IPv6, a port the rule does not list", id, "-k https://[" + addr6.String() + "]/v6-port", false},
		{"IPv6 outside the CIDR", id, "http://[2001:db8:ffff::1]/v6-outside", false},
		{"IPv6 to the gateway's ULA", id, "http://[fd00:64::1]:8080/v6-ula", false},
		{"no IPv6 rule: by address", none, "http://[" + addr6.String() + "]/none-address", false},
		{"no IPv6 rule: by AAAA name", none, "http://" + six + "/none-name", false},
	} {
		ok, out, ms := reach(tc.sb, tc.args)
		t.Logf("%-38s reached=%v in %d ms: %.120q", tc.what, ok, ms, out)
		if ok != tc.want {
			t.Errorf("%s: reached=%v, want %v: %s\n%s", tc.what, ok, tc.want, out, egressLog(logPath))
		}
		if !tc.want && ms > 5000 {
			t.Errorf("%s: the denial took %d ms: a denied attempt must fail at once", tc.what, ms)
		}
	}
	// The host's own IPv6 address (the test internet's ::1, inside the
	// CIDR rule) is refused by the guard, and the log says so.
	host6 := in.HostAddr6.String()
	if ok, out, _ := reach(id, "http://["+host6+"]/v6-host"); ok {
		t.Errorf("reached the host's %s: %s", host6, out)
	}
	lr, err := c.NetworkLog(context.Background(), id, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	hostDenied := false
	for _, e := range lr.Entries {
		hostDenied = hostDenied || e.IP == host6 && e.Decision == model.NetDenied && strings.Contains(e.Reason, "address of the host")
	}
	if !hostDenied {
		t.Errorf("no denial of the host's %s as a host address in the network log: %+v", host6, lr.Entries)
	}

	// DNS over IPv6 to any resolver is answered by the gateway's (in the
	// resolver's name); IPv6 UDP under the udp rule reaches the echo and
	// its answer comes back; to a port no rule names it goes nowhere.
	putFile(t, c, id, "/tmp/udp6.py", `import socket, struct, sys
hdr = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
qn = b"".join(bytes([len(p)]) + p.encode() for p in sys.argv[2].split(".")) + b"\0"
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); s.settimeout(3)
s.sendto(hdr + qn + struct.pack(">HH", 28, 1), (sys.argv[1], 53))
try:
    d, src = s.recvfrom(1500); print("dns-reply", src[0], "rcode", d[3] & 15, "answers", struct.unpack(">H", d[6:8])[0])
except socket.timeout:
    print("dns-noreply")
for port in (7, 9999):
    u = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); u.settimeout(2)
    u.sendto(b"ping", (sys.argv[3], port))
    try:
        d, src = u.recvfrom(512); print("udp-reply", port, d.decode(), src[0], src[1])
    except socket.timeout:
        print("udp-noreply", port)
`)
	echo6 := netip.AddrPortFrom(addr6, egresstest.EchoPort)
	out, _, _ := timed(t, c, id, "python3 /tmp/udp6.py 2001:db8:ffff::53 "+six+" "+addr6.String())
	if !strings.Contains(out, "dns-reply 2001:db8:ffff::53 rcode 0 answers 1") ||
		!strings.Contains(out, "udp-reply 7 echo:ping "+addr6.String()+" 7") || !strings.Contains(out, "udp-noreply 9999") {
		t.Errorf("IPv6 DNS to any resolver / IPv6 UDP: %q\n%s", out, egressLog(logPath))
	}
	if n := in.UDPSeen()[echo6]; n != 1 {
		t.Errorf("the test internet's IPv6 echo %s received %d datagrams, want 1", echo6, n)
	}

	// Suspend and wake: the woken sandbox (restored into a new network,
	// made under the same policy) has IPv6 again.
	ctx := context.Background()
	for _, step := range []struct {
		verb string
		do   func(context.Context, string) (model.Operation, error)
	}{{"suspend", c.SuspendSandbox}, {"wake", c.WakeSandbox}} {
		op, err := step.do(ctx, id)
		if err == nil {
			_, err = c.WaitOperation(ctx, op.ID)
		}
		if err != nil {
			t.Fatalf("%s: %v", step.verb, err)
		}
	}
	if ok, out, _ := reach(id, "http://"+six+"/v6-woken"); !ok {
		t.Errorf("IPv6 by name after suspend and wake: %s\n%s", out, egressLog(logPath))
	}

	// A policy update that adds the first IPv6 CIDR applies from the
	// sandbox's next start: not at once (no IPv6 on its link), after a
	// suspend and wake.
	if _, err := c.SetSandboxNetwork(ctx, none, apitypes.NetworkRequest{Policy: []byte(policy)}); err != nil {
		t.Fatal(err)
	}
	if ok, out, _ := reach(none, "http://["+addr6.String()+"]/late-update"); ok {
		t.Errorf("IPv6 right after a policy update that adds it: %s", out)
	}
	for _, step := range []struct {
		verb string
		do   func(context.Context, string) (model.Operation, error)
	}{{"suspend", c.SuspendSandbox}, {"wake", c.WakeSandbox}} {
		op, err := step.do(ctx, none)
		if err == nil {
			_, err = c.WaitOperation(ctx, op.ID)
		}
		if err != nil {
			t.Fatalf("%s: %v", step.verb, err)
		}
	}
	if ok, out, _ := reach(none, "http://"+six+"/late-woken"); !ok {
		t.Errorf("IPv6 after the update and a suspend and wake: %s\n%s", out, egressLog(logPath))
	}

	got := map[string]bool{}
	for _, r := range in.Requests() {
		if r.Local.Addr() == addr6 {
			got[r.Path] = true
		}
		if strings.HasPrefix(r.Path, "/none-") || r.Path == "/v6-port" || r.Path == "/v6-outside" || r.Path == "/late-update" {
			t.Errorf("a denied request reached the test internet: %+v", r)
		}
	}
	if !got["/v6-address"] || !got["/v6-name"] || !got["/v6-woken"] || !got["/late-woken"] {
		t.Errorf("the test internet's IPv6 address got %v, want /v6-address, /v6-name, /v6-woken and /late-woken", got)
	}
}
