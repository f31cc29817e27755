package redteam

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/egress/egresstest"
	"github.com/airlock/airlock/internal/network"
	"github.com/airlock/airlock/internal/testenv"
)

// qemuSkip says why the QEMU tier leaves a case of sandboxCases out: the
// cases that test the gateway's parsing of what a connection carries
// (names, SNI, Host, DNS questions) meet exactly the same code from a VM
// as from gVisor, so the QEMU tier keeps to the data path (what a guest
// kernel of its own can send: spoofed sources, raw sockets, UDP, IPv6,
// ICMP, addresses it should not reach) and its CI time stays modest.
func qemuSkip(name string) string {
	const parsing = "gateway parsing, the same code whatever the runtime: run by the gVisor and netns tiers"
	switch name {
	case "front-connect-to-private", "front-resolve-metadata", "dns-txt-tunnel",
		"rebind-private", "rebind-loopback", "rebind-metadata", "rebind-host",
		"host-300-chars", "host-label-64", "dns-label-64", "sni-over-255", "sni-label-64",
		"keepalive-host-to-private":
		return parsing
	}
	return ""
}

// TestRedTeamQEMU runs the data-path cases from two QEMU sandboxes (TCG
// here) of a real `airlock up --egress --egress-profile public`, whose
// taps are bridged to the same gateway path as gVisor's veths. A VM's root
// has a kernel of its own: raw IP and packet sockets, its NIC's MAC, its
// ARP, IPv6 it can turn back on. So besides the gVisor tier's data-path
// cases (where raw sockets now really send), the tier forges the link
// layer: another MAC announced for the sandbox's address, forged ARP, and
// IPv6 re-enabled with an address of the guest's choosing.
func TestRedTeamQEMU(t *testing.T) {
	testenv.RequireQEMU(t)
	in := egresstest.Start(t, egresstest.Config{})
	t0 := time.Now()
	env := startUp(t, in, "qemu")
	a := newSandbox(t, env.c, "qemu")
	b := newSandbox(t, env.c, "qemu")
	t.Logf("airlock up and two QEMU sandboxes ready after %v", time.Since(t0).Round(time.Second))
	s := &suite{runtime: "qemu", log: env.log, skip: qemuSkip}
	inet2 := in.Addr(2).String()
	www := egresstest.Name(egresstest.WWW)

	// Control: the same connection the MAC-spoofing case makes, from the
	// VM's own MAC, gets through (so its failure below is the filter's).
	if r := a.probe(t, "tcp", inet2, "80", fmt.Sprintf(httpGet, www)); !r.OK || !strings.Contains(r.Detail, "airlock-inet") {
		t.Fatalf("control: sandbox A cannot reach %s by address: %s", inet2, r.Detail)
	}
	// gwNeigh is the gateway's ARP table on gw0 and whether a forgery is
	// in it: an entry other than 100.64.0.2 at the VM's own MAC.
	gwNeigh := func() (string, bool) {
		out, _ := exec.Command("ip", "-n", network.GatewayName(a.id), "neigh", "show", "dev", network.GatewayIf).CombinedOutput()
		n := strings.TrimSpace(string(out))
		for _, l := range strings.Split(n, "\n") {
			if f := strings.Fields(l); len(f) > 0 && (f[0] != "100.64.0.2" || strings.Contains(l, "lladdr") && !strings.Contains(l, "lladdr "+network.GuestMAC)) {
				return n, true
			}
		}
		return n, false
	}
	for _, x := range []attempt{
		{name: "vm-mac-spoof", what: "as root, give eth0 another MAC (52:54:00:de:ad:01), announce it for 100.64.0.2 with gratuitous ARP, GET the test internet by address",
			run: func(t *testing.T) (bool, string) {
				r := a.probe(t, "mac_spoof", inet2, "80", www)
				n, forged := gwNeigh()
				return r.OK || forged, r.Detail + "; gateway's neighbours: " + n
			}},
		{name: "vm-arp-forge", what: "forged ARP from the VM: a request for the gateway as 100.64.0.3, replies claiming 100.64.0.2 for another MAC",
			run: func(t *testing.T) (bool, string) {
				r := a.probe(t, "arp_spoof")
				n, forged := gwNeigh()
				return r.OK || forged, r.Detail + "; gateway's neighbours: " + n
			}},
		{name: "vm-ipv6-root", what: "as root, turn IPv6 back on, add 2001:db8::5/64 to eth0, connect on-link to [2001:db8::2]:80 and send to ff02::1",
			run: func(t *testing.T) (bool, string) { return failed(a.probe(t, "ipv6_root", "2001:db8::2", "80")) }},
	} {
		s.check(t, x)
	}
	// After the forgeries the sandbox's link still works.
	if r := a.probe(t, "tcp", inet2, "80", fmt.Sprintf(httpGet, www)); !r.OK {
		t.Errorf("sandbox A lost its link after the link-layer cases: %s", r.Detail)
	}

	sandboxCases(t, s, in, env, a, b)
	t.Logf("QEMU tier: %v in all", time.Since(t0).Round(time.Second))
}
