package e2e

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/egress/egresstest"
	"github.com/airlock/airlock/internal/model"
)

// TestEgressPolicies: inside a gVisor sandbox under `airlock up --egress`,
// a policy's wildcards, deny rules, CIDR rules and ports decide what curl
// reaches (denials fail fast: a reset or REFUSED, never a hang); a runtime
// update applies to new connections at once and cuts an open keep-alive
// connection it denies; an org restricted to an operator profile gets that
// profile by default and may not send an inline policy.
func TestEgressPolicies(t *testing.T) {
	s := need(t)
	in := egresstest.Start(t, egresstest.Config{})
	c, logPath := egressUp(t, s, in, "public", "gvisor")
	ctx := context.Background()
	www, other, a := egresstest.Name(egresstest.WWW), egresstest.Name(egresstest.Other), egresstest.Name(egresstest.A)
	ip4 := in.Addr(4).String()

	policy := `{"version":1,"default":"deny","rules":[
		{"action":"deny","domains":["` + other + `"]},
		{"action":"allow","domains":["*.test.airlock"],"ports":[80]},
		{"action":"allow","cidrs":["` + ip4 + `"],"ports":[443]}]}`
	id := newSandbox(t, c, client.CreateSandboxRequest{Network: &apitypes.NetworkRequest{Policy: []byte(policy)}}).ID

	// reach runs curl and reports whether it got the test server's page.
	reach := func(args string) (bool, string, int) {
		t.Helper()
		out, _, ms := timed(t, c, id, "curl -sS -m 20 "+args)
		return strings.Contains(out, "airlock-inet"), out, ms
	}
	for _, tc := range []struct {
		what, args string
		want       bool
	}{
		{"wildcard, port 80", "http://" + www + "/wild", true},
		{"wildcard, another name", "http://" + a + "/wild", true},
		{"wildcard, port 443 (not listed)", "-k https://" + www + "/port", false},
		{"deny rule before the wildcard", "http://" + other + "/deny", false},
		{"CIDR rule, its port", "-k https://" + ip4 + "/cidr", true},
		{"CIDR rule, another port", "http://" + ip4 + "/cidr80", false},
		{"a name outside every rule", "http://example.invalid/", false},
	} {
		ok, out, ms := reach(tc.args)
		t.Logf("%-34s reached=%v in %d ms: %.120q", tc.what, ok, ms, out)
		if ok != tc.want {
			t.Errorf("%s: reached=%v, want %v: %s\n%s", tc.what, ok, tc.want, out, egressLog(logPath))
		}
		if !tc.want && ms > 5000 {
			t.Errorf("%s: the denial took %d ms: a denied attempt must fail at once (reset or REFUSED)", tc.what, ms)
		}
	}

	t.Run("udp rules", func(t *testing.T) {
		udpName, ip5, ip2 := egresstest.Name(egresstest.UDPN), in.Addr(5).String(), in.Addr(2).String()
		pol := `{"version":1,"default":"allow","rules":[
			{"action":"allow","cidrs":["` + ip5 + `"],"ports":[7],"protocols":["udp"]},
			{"action":"allow","domains":["` + udpName + `"],"ports":[9999],"protocols":["udp"]}]}`
		uid := newSandbox(t, c, client.CreateSandboxRequest{Network: &apitypes.NetworkRequest{Policy: []byte(pol)}}).ID
		putFile(t, c, uid, "/tmp/udp.py", `import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
host, port = sys.argv[1], int(sys.argv[2])
s.sendto(b"ping", (host, port))
try:
    data, src = s.recvfrom(512); print("reply", data.decode(), src[0], src[1])
except socket.timeout:
    print("noreply")
`)
		before := in.UDPSeen()
		out, _, _ := timed(t, c, uid, "python3 /tmp/udp.py "+ip5+" 7")
		if !strings.Contains(out, "reply echo:ping "+ip5+" 7") {
			t.Fatalf("udp to %s:7 under a CIDR udp rule: %q\n%s", ip5, out, egressLog(logPath))
		}
		// The default allow admits no UDP; port 9999 is allowed only by name.
		out, _, _ = timed(t, c, uid, "python3 /tmp/udp.py "+ip2+" 7; python3 /tmp/udp.py "+ip5+" 9999")
		if strings.Contains(out, "reply echo") {
			t.Fatalf("udp outside the rules answered: %q", out)
		}
		out, _, _ = timed(t, c, uid, "getent hosts "+udpName+" >/dev/null; python3 /tmp/udp.py "+udpName+" 9999")
		after := in.UDPSeen()
		sink := netip.MustParseAddrPort("0.0.0.0:9999")
		if after[sink] != before[sink]+1 {
			t.Fatalf("the udp sink on 9999 counted %d new datagrams, want 1 (the one sent by name after resolving it): %q", after[sink]-before[sink], out)
		}
		if l := egressLog(logPath); !strings.Contains(l, "kind=udp") {
			t.Errorf("no udp denial logged:\n%s", l)
		}
	})

	t.Run("runtime update", func(t *testing.T) {
		// A keep-alive connection to www, held open across the update.
		putFile(t, c, id, "/tmp/ka.py", `import http.client, os, time
c = http.client.HTTPConnection("`+www+`", 80, timeout=20)
c.request("GET", "/ka1"); r = c.getresponse(); r.read(); print("first", r.status, flush=True)
while not os.path.exists("/tmp/go"): time.sleep(0.05)
try:
    c.request("GET", "/ka2"); r = c.getresponse(); r.read(); print("second", r.status, flush=True)
except Exception as e:
    print("cut", type(e).__name__, flush=True)
`)
		sh(t, c, id, "rm -f /tmp/go /tmp/ka.out; (setsid python3 /tmp/ka.py > /tmp/ka.out 2>&1 &); for i in $(seq 100); do grep -q first /tmp/ka.out && exit 0; sleep 0.05; done; cat /tmp/ka.out; exit 1")
		if _, err := c.SetSandboxNetwork(ctx, id, apitypes.NetworkRequest{Profile: "none"}); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		var out string
		for time.Since(t0) < 10*time.Second {
			var ok bool
			if ok, out, _ = reach("http://" + www + "/after"); !ok {
				break
			}
		}
		t.Logf("new connections denied %v after the update returned", time.Since(t0).Round(time.Millisecond))
		if strings.Contains(out, "airlock-inet") {
			t.Fatalf("still reachable 10 s after the update: %s", out)
		}
		r := sh(t, c, id, "touch /tmp/go; for i in $(seq 200); do grep -q -E 'second|cut' /tmp/ka.out && break; sleep 0.05; done; cat /tmp/ka.out")
		if !strings.Contains(r.stdout, "cut") {
			t.Fatalf("the open connection survived an update that denies it: %q", r.stdout)
		}
		for _, req := range in.Requests() {
			if req.Path == "/ka2" || req.Path == "/after" {
				t.Fatalf("a request after the update reached the upstream: %+v", req)
			}
		}
	})

	t.Run("org restricted to a profile", func(t *testing.T) {
		prof := `{"version":1,"default":"deny","rules":[{"action":"allow","domains":["` + www + `"]}]}`
		if _, err := c.PutNetworkProfile(ctx, "www-only", apitypes.NetworkProfileRequest{Policy: []byte(prof)}); err != nil {
			t.Fatal(err)
		}
		org, err := c.CreateOrg(ctx, "egress-team")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.UpdateOrg(ctx, org.ID, client.UpdateOrgRequest{Network: &model.OrgNetwork{Profiles: []string{"www-only"}, Default: "www-only"}}); err != nil {
			t.Fatal(err)
		}
		k, err := c.CreateKey(ctx, org.ID, client.CreateKeyRequest{Name: "k"})
		if err != nil {
			t.Fatal(err)
		}
		oc := client.New(c.BaseURL, k.Secret)
		var ae *client.APIError
		if _, _, err := oc.CreateSandbox(ctx, client.CreateSandboxRequest{Network: &apitypes.NetworkRequest{Policy: []byte(`{"version":1,"default":"allow"}`)}}, ""); !errors.As(err, &ae) || ae.Status != 403 {
			t.Fatalf("inline policy from a restricted org: %v, want 403", err)
		}
		oid := newSandbox(t, oc, client.CreateSandboxRequest{}).ID
		n, err := oc.SandboxNetwork(ctx, oid)
		if err != nil || n == nil || n.Profile != "www-only" {
			t.Fatalf("the org's sandbox got %+v (%v), want profile www-only", n, err)
		}
		out, _, _ := timed(t, oc, oid, "curl -sS -m 20 http://"+www+"/org")
		if !strings.Contains(out, "airlock-inet") {
			t.Fatalf("www from the org's sandbox: %s", out)
		}
		out, _, _ = timed(t, oc, oid, "curl -sS -m 20 http://"+a+"/org")
		if strings.Contains(out, "airlock-inet") {
			t.Fatalf("a.test.airlock reached under www-only: %s", out)
		}
	})
}
