package network

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	goruntime "runtime"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/airlock/airlock/internal/runtime"
)

// VM egress networks (Config.Egress for a runtime with a network device,
// qemu): the VM's virtio-net NIC reaches the same gateway namespace, the
// same gw0, the same filter and the same listeners as a gVisor sandbox.
// Its tap is bridged to the veth's guest end in the guest namespace:
//
//	VM eth0 (GuestMAC, Link.Guest, set by the guest agent)
//	   │ virtio-net
//	guest namespace   airlock-<id>     tap0 ─ br0 ─ eth0     no addresses, IPv6 off
//	                                                 │ veth
//	gateway namespace airlockgw-<id>   gw0 (GatewayMAC, Link.Gateway)
//
// The guest namespace only carries frames: neither br0 nor its ports have
// an address, learning is off on both ports (a VM flooding source MACs
// fills no forwarding table: the bridge floods every frame to the one
// other port), IPv4 forwarding is off, and bridged frames skip the
// namespace's netfilter (bridge-nf-call-*: there is nothing to see there;
// the filter is the gateway namespace's). What the VM sends arrives on gw0
// exactly as a gVisor sandbox's packets do, so every rule of the gateway
// namespace's table (anti-spoofing by source address, no IPv6, no ICMP, no
// UDP but DNS, every TCP connection to the proxy) applies unchanged.
//
// A VM emits Ethernet frames of its own making, so a second table (family
// netdev, on gw0's ingress, before anything else) guards the link layer:
// frames whose source MAC is not GuestMAC, ARP whose sender is not
// (GuestMAC, Link.Guest), and every EtherType other than IPv4 and ARP
// (IPv6, VLAN tags, anything else) are dropped. A VM that changes its MAC
// or claims another address in ARP reaches nothing and poisons nothing.
//
// Both MACs are fixed, as the addresses are: a snapshot restores the
// guest's memory, its NIC's address and its ARP cache with it, so a guest
// woken on any worker, under any id, finds the same link (a gateway MAC of
// the veth's own choosing would leave the woken guest sending to a stale
// neighbour until its ARP entry expires).
//
// The guest configures its side itself: the qemu driver puts the link on
// the kernel command line (agentapi.VMParams.Net) and the guest agent sets
// eth0's address and default route and writes /etc/resolv.conf naming
// Link.Gateway before the sandbox's processes run.

// MACs of a VM's egress link (QEMU's locally administered 52:54:00 prefix).
const (
	GuestMAC   = "52:54:00:a1:70:01" // the VM's NIC; the qemu driver's default too
	GatewayMAC = "52:54:00:a1:70:fe" // gw0
)

// BridgeName is the bridge in a VM's guest namespace.
const BridgeName = "br0"

// LinkTable is the nftables table (family netdev, gw0's ingress) that
// guards a VM's link layer.
const LinkTable = "airlock-link"

type vmLink struct{ guestMAC, gatewayMAC net.HardwareAddr }

func defaultVMLink() *vmLink {
	g, _ := net.ParseMAC(GuestMAC)
	gw, _ := net.ParseMAC(GatewayMAC)
	return &vmLink{guestMAC: g, gatewayMAC: gw}
}

// setupVMEgress makes a VM's egress network (above) on locked threads
// that are thrown away.
func setupVMEgress(id string, l Link) (runtime.Network, error) {
	if err := l.Validate(); err != nil {
		return runtime.Network{}, err
	}
	vm := defaultVMLink()
	done := make(chan error, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread ends with the goroutine
		done <- makeVMEgress(id, l, vm)
	}()
	if err := <-done; err != nil {
		return runtime.Network{}, err
	}
	return runtime.Network{
		Namespace:   Path(id),
		Interfaces:  []runtime.Interface{{Name: TapName, Addresses: []netip.Prefix{l.Guest}, MAC: vm.guestMAC.String()}},
		Gateway:     l.Gateway,
		Nameservers: []netip.Addr{l.Gateway},
	}, nil
}

func makeVMEgress(id string, l Link, vm *vmLink) error {
	guest, err := netns.NewNamed(Name(id)) // the thread is now in guest
	if err != nil {
		return fmt.Errorf("create namespace %s: %w", Name(id), err)
	}
	defer guest.Close()
	if err := upLoopback(); err != nil {
		return err
	}
	if err := disableIPv6(); err != nil {
		return err
	}
	if err := bridgeSysctls(); err != nil {
		return err
	}
	tap := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: TapName}, Mode: netlink.TUNTAP_MODE_TAP, Flags: netlink.TUNTAP_NO_PI}
	err = netlink.LinkAdd(tap)
	for _, f := range tap.Fds {
		f.Close()
	}
	if err != nil {
		return fmt.Errorf("add tap %s: %w", TapName, err)
	}
	if err := makeGateway(id, l, guest, vm, nil); err != nil { // the thread is now in the gateway namespace
		return err
	}
	if err := netns.Set(guest); err != nil {
		return err
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: BridgeName}}
	if err := netlink.LinkAdd(br); err != nil {
		return fmt.Errorf("add bridge %s: %w", BridgeName, err)
	}
	for _, name := range []string{TapName, GuestIf} {
		port, err := netlink.LinkByName(name)
		if err != nil {
			return fmt.Errorf("find %s: %w", name, err)
		}
		if err := netlink.LinkSetMaster(port, br); err != nil {
			return fmt.Errorf("add %s to %s: %w", name, BridgeName, err)
		}
		if err := netlink.LinkSetLearning(port, false); err != nil {
			return fmt.Errorf("learning off on %s: %w", name, err)
		}
		if err := netlink.LinkSetUp(port); err != nil {
			return fmt.Errorf("set %s up: %w", name, err)
		}
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return fmt.Errorf("set %s up: %w", BridgeName, err)
	}
	return nil
}

// bridgeSysctls keeps bridged frames out of the calling thread's
// namespace's netfilter (br_netfilter) and turns IPv4 forwarding off.
func bridgeSysctls() error {
	for _, k := range []string{"bridge/bridge-nf-call-iptables", "bridge/bridge-nf-call-ip6tables", "bridge/bridge-nf-call-arptables", "ipv4/ip_forward"} {
		p := "/proc/sys/net/" + k
		if _, err := os.Stat(p); err != nil {
			continue // not in this kernel
		}
		if err := os.WriteFile(p, []byte("0"), 0o644); err != nil {
			return fmt.Errorf("sysctl %s: %w", k, err)
		}
	}
	return nil
}

// EtherTypes and ARP fields the link filter reads.
const (
	etherIPv4 = 0x0800
	etherARP  = 0x0806
)

// writeLinkFilter writes the link-layer guard (LinkTable, above) through
// the netlink socket of namespace fd (0: the calling thread's), in which
// gw0 must exist.
func writeLinkFilter(fd int, l Link, guestMAC net.HardwareAddr) error {
	var opts []nftables.ConnOption
	if fd > 0 {
		opts = append(opts, nftables.WithNetNSFd(fd))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return err
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyNetdev, Name: LinkTable})
	drop := nftables.ChainPolicyDrop
	prio := nftables.ChainPriorityFilter
	ch := c.AddChain(&nftables.Chain{Name: "ingress", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookIngress, Device: GatewayIf, Priority: prio, Policy: &drop})
	rule := func(e ...expr.Any) { c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: e}) }
	ll := func(off, n uint32) expr.Any {
		return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: off, Len: n}
	}
	nh := func(off, n uint32) expr.Any {
		return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n}
	}
	eq := func(b []byte) expr.Any { return &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b} }
	verdict := func(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }

	// Not the VM's MAC: drop (ether saddr).
	rule(ll(6, 6), &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte(guestMAC)}, verdict(expr.VerdictDrop))
	// IPv4: on to the inet table, which checks the source address.
	rule(ll(12, 2), eq(binaryutil.BigEndian.PutUint16(etherIPv4)), verdict(expr.VerdictAccept))
	// ARP for IPv4 over Ethernet whose sender is the VM itself.
	rule(ll(12, 2), eq(binaryutil.BigEndian.PutUint16(etherARP)),
		nh(0, 2), eq(binaryutil.BigEndian.PutUint16(1)), // htype Ethernet
		nh(2, 2), eq(binaryutil.BigEndian.PutUint16(etherIPv4)), // ptype IPv4
		nh(4, 2), eq([]byte{6, 4}), // hlen, plen
		nh(8, 6), eq([]byte(guestMAC)), // sender hardware address
		nh(14, 4), eq(l.Guest.Addr().AsSlice()), // sender protocol address
		verdict(expr.VerdictAccept))
	// Everything else (IPv6, VLAN, other EtherTypes, forged ARP): the policy, drop.
	return c.Flush()
}
