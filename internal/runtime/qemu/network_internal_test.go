package qemu

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime"
)

var (
	isolated = runtime.Network{Namespace: "/run/netns/airlock-x", Interfaces: []runtime.Interface{{Name: "tap0"}}}
	egress   = runtime.Network{Namespace: "/run/netns/airlock-x",
		Interfaces:  []runtime.Interface{{Name: "tap0", Addresses: []netip.Prefix{netip.MustParsePrefix("100.64.0.2/30")}, MAC: "52:54:00:A1:70:01"}},
		Gateway:     netip.MustParseAddr("100.64.0.1"),
		Nameservers: []netip.Addr{netip.MustParseAddr("100.64.0.1")}}
)

// TestGuestNetwork: an egress network reaches the guest on the kernel
// command line and its MAC on the NIC; the isolated tap adds nothing; a
// restore into another guest network than the snapshot's is refused.
func TestGuestNetwork(t *testing.T) {
	for name, n := range map[string]runtime.Network{"isolated": isolated, "egress": egress} {
		if err := checkNetwork(n); err != nil {
			t.Errorf("%s: checkNetwork: %v", name, err)
		}
	}
	if c := kernelCmdline(runtime.Spec{Network: isolated}); strings.Contains(c, "airlock.net") {
		t.Errorf("isolated: cmdline %q names a network", c)
	}
	c := kernelCmdline(runtime.Spec{Network: egress})
	if !strings.Contains(c, " airlock.net=100.64.0.2/30,100.64.0.1,100.64.0.1") {
		t.Errorf("egress: cmdline %q", c)
	}
	if nicMAC(egress) != guestMAC || nicMAC(isolated) != guestMAC {
		t.Errorf("MACs %s, %s", nicMAC(egress), nicMAC(isolated))
	}

	bad := func(f func(*runtime.Network)) runtime.Network {
		n := egress
		n.Interfaces = []runtime.Interface{egress.Interfaces[0]}
		f(&n)
		return n
	}
	for name, n := range map[string]runtime.Network{
		"multicast MAC": bad(func(n *runtime.Network) { n.Interfaces[0].MAC = "01:00:5e:00:00:01" }),
		"not a MAC":     bad(func(n *runtime.Network) { n.Interfaces[0].MAC = "nope" }),
		"no gateway":    bad(func(n *runtime.Network) { n.Gateway = netip.Addr{} }),
		"gateway out":   bad(func(n *runtime.Network) { n.Gateway = netip.MustParseAddr("10.0.0.1") }),
		"IPv6": bad(func(n *runtime.Network) {
			n.Interfaces[0].Addresses = []netip.Prefix{netip.MustParsePrefix("2001:db8::2/64")}
		}),
		"two addresses": bad(func(n *runtime.Network) {
			n.Interfaces[0].Addresses = append(n.Interfaces[0].Addresses, n.Interfaces[0].Addresses[0])
		}),
	} {
		if err := checkNetwork(n); !errors.Is(err, model.ErrInvalid) {
			t.Errorf("%s: checkNetwork = %v, want ErrInvalid", name, err)
		}
	}

	snapOf := func(n runtime.Network) state {
		return state{Append: kernelCmdline(runtime.Spec{Network: n}), Network: n}
	}
	if err := sameGuestNetwork(snapOf(egress), egress); err != nil {
		t.Errorf("egress into egress: %v", err)
	}
	if err := sameGuestNetwork(snapOf(isolated), isolated); err != nil {
		t.Errorf("isolated into isolated: %v", err)
	}
	for name, c := range map[string]struct{ snap, into runtime.Network }{
		"isolated into egress": {isolated, egress},
		"egress into isolated": {egress, isolated},
		"another MAC":          {egress, bad(func(n *runtime.Network) { n.Interfaces[0].MAC = "52:54:00:00:00:02" })},
	} {
		if err := sameGuestNetwork(snapOf(c.snap), c.into); !errors.Is(err, model.ErrInvalid) {
			t.Errorf("%s: sameGuestNetwork = %v, want ErrInvalid", name, err)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}
