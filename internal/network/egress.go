package network

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	goruntime "runtime"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/runtime"
)

// Egress networks (Config.Egress): the sandbox reaches the network only
// through the worker's egress gateway (internal/egress). Each sandbox gets
// two namespaces joined by one veth pair and nothing else:
//
//	guest namespace  airlock-<id>      eth0  Link.Guest   (100.64.0.2/30)
//	                                     │ veth
//	gateway namespace airlockgw-<id>   gw0   Link.Gateway (100.64.0.1/30)
//
// The guest namespace is the one the driver joins (runsc --network=sandbox
// takes eth0, its address and its default route into gVisor's netstack).
// The gateway namespace holds no route beyond the link: there is no path
// from it to the host, to another sandbox or anywhere else. Its nftables
// table (below) redirects every TCP connection from gw0 to the gateway's
// proxy port and every DNS query to its DNS port, on Link.Gateway; the
// gateway's listeners are sockets opened in that namespace (OpenGateway)
// by the worker process, which dials upstream from the host's own
// namespace. A sandbox is therefore identified by the listener its traffic
// arrives on, not by its address, and every sandbox can use the same
// addresses: snapshots and forks restore on any worker under any id.
//
// The filter runs on gw0's ingress in the gateway namespace, which sees
// every frame the guest emits whatever emitted it (gVisor's netstack writes
// frames with a packet socket, which the guest namespace's own netfilter
// hooks never see). In order:
//
//   - a source other than Link.Guest, and any IPv6 (unless Config.IPv6,
//     below) or ARP-less junk: drop
//     (anti-spoofing: a forged DNS answer or a spoofed packet never reaches
//     the gateway);
//   - TCP or UDP/TCP port 53: on to the redirect; other UDP: to the
//     gateway's transparent UDP relay (tproxy, udp.go), which the policy
//     judges datagram flow by flow; ICMP and anything else: drop;
//   - the input chain admits only the redirected ports and the tproxied
//     UDP; forward drops all;
//     output admits only replies (ct established, related) and loopback.
//
// IPv6 is off on both ends (disable_ipv6), so the guest gets no IPv6
// address at all, unless Config.IPv6 (the sandbox's policy allows an IPv6
// CIDR when its network is made): then the link also carries DefaultLink6
// (guest fd00:64::2/126, gateway fd00:64::1, the guest's ::/0 via it;
// static addresses without DAD, no SLAAC, no router advertisements, no
// link-local addresses), and the filter above has an IPv6 part: a source
// other than Link6.Guest: drop; ICMPv6 neighbour solicitations and
// advertisements (the link's own address resolution): accept, other
// ICMPv6: drop; TCP: to the proxy, UDP port 53: to the resolver (on
// Link6.Gateway, to any address), other UDP: to the UDP relay's IPv6
// listener (tproxy, udp.go).

// Link is the point-to-point link of an egress network. Every sandbox has
// the same one (they live in namespaces of their own).
type Link struct {
	Guest   netip.Prefix // the guest's address and the link's length
	Gateway netip.Addr   // the gateway's end, the guest's default route and resolver
}

// DefaultLink is 100.64.0.2/30 with the gateway on 100.64.0.1 (shared
// address space, RFC 6598: not routed on the internet, rarely used on a
// LAN).
var DefaultLink = Link{Guest: netip.MustParsePrefix("100.64.0.2/30"), Gateway: netip.MustParseAddr("100.64.0.1")}

// Link6 is the IPv6 half of an egress link (Config.IPv6).
type Link6 struct {
	Guest   netip.Prefix // the guest's address and the link's length
	Gateway netip.Addr   // the gateway's end, the guest's ::/0 route
}

// DefaultLink6 is fd00:64::2/126 with the gateway on fd00:64::1 (unique
// local addresses, RFC 4193: never routed, and the guard keeps fc00::/7
// out of every policy's reach).
var DefaultLink6 = Link6{Guest: netip.MustParsePrefix("fd00:64::2/126"), Gateway: netip.MustParseAddr("fd00:64::1")}

// Ports of the gateway's listeners on Link.Gateway in the gateway namespace.
const (
	ProxyPort = 15001 // every TCP connection of the guest is redirected here
	DNSPort   = 53    // every DNS query (UDP and TCP, to any address)
)

// Interface names.
const (
	GuestIf   = "eth0"
	GatewayIf = "gw0"
)

// Config is how a worker makes networks. The zero Config is today's
// isolated network (loopback only for gVisor, a tap with nothing routed for
// VMs).
type Config struct {
	// Egress gives every sandbox a link to the egress gateway (see
	// above): a veth for runtimes without a network device (gvisor), the
	// VM's tap bridged to that veth for those with one (qemu, vm.go).
	Egress bool
	// Link is the egress link (zero: DefaultLink).
	Link Link
	// IPv6 adds DefaultLink6 to a runtime without a network device
	// (gvisor): the worker sets it for a sandbox whose policy allows an
	// IPv6 CIDR when the network is made (netpolicy's AllowsIPv6). A VM's
	// egress network ignores it (its link filter admits IPv4 and ARP only).
	IPv6 bool
}

func (c Config) link() Link {
	if c.Link.Guest.IsValid() {
		return c.Link
	}
	return DefaultLink
}

// Validate checks the link: IPv4, the two ends distinct and inside the
// guest's prefix, neither the prefix's network nor broadcast address.
func (l Link) Validate() error {
	p := l.Guest
	if !p.IsValid() || !p.Addr().Is4() || !l.Gateway.Is4() || p.Bits() > 30 || p.Bits() < 8 {
		return fmt.Errorf("network: egress link %s via %s: want an IPv4 prefix of /8 to /30 and an IPv4 gateway", p, l.Gateway)
	}
	if !p.Contains(l.Gateway) || p.Addr() == l.Gateway || p.Masked().Addr() == p.Addr() || p.Masked().Addr() == l.Gateway {
		return fmt.Errorf("network: egress link %s via %s: the gateway must be another host address of the guest's prefix", p, l.Gateway)
	}
	return nil
}

// GatewayName is the name of sandbox id's gateway namespace.
func GatewayName(id string) string { return "airlockgw-" + id } // never "airlock-" + an id

// GatewayPath is the path of sandbox id's gateway namespace.
func GatewayPath(id string) string { return Dir + "/" + GatewayName(id) }

// HasGateway reports whether sandbox id has an egress network (a gateway
// namespace).
func HasGateway(id string) bool {
	if validID(id) != nil {
		return false
	}
	_, err := os.Lstat(GatewayPath(id))
	return err == nil
}

// setupEgress makes the two namespaces, the link, the addresses and the
// filter. It runs on locked threads that are thrown away.
func setupEgress(id string, l Link, v6 *Link6) (runtime.Network, error) {
	if err := l.Validate(); err != nil {
		return runtime.Network{}, err
	}
	done := make(chan error, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread ends with the goroutine
		done <- makeEgress(id, l, v6)
	}()
	if err := <-done; err != nil {
		return runtime.Network{}, err
	}
	n := runtime.Network{
		Namespace:   Path(id),
		Interfaces:  []runtime.Interface{{Name: GuestIf, Addresses: []netip.Prefix{l.Guest}}},
		Gateway:     l.Gateway,
		Nameservers: []netip.Addr{l.Gateway},
	}
	if v6 != nil {
		n.Interfaces[0].Addresses = append(n.Interfaces[0].Addresses, v6.Guest)
		n.Gateway6 = v6.Gateway
	}
	return n, nil
}

func makeEgress(id string, l Link, v6 *Link6) error {
	origin, err := netns.Get()
	if err != nil {
		return err
	}
	defer origin.Close()
	guest, err := netns.NewNamed(Name(id))
	if err != nil {
		return fmt.Errorf("create namespace %s: %w", Name(id), err)
	}
	defer guest.Close()
	if err := upLoopback(); err != nil {
		return err
	}
	if err := setIPv6(v6 != nil); err != nil {
		return err
	}
	if err := makeGateway(id, l, guest, nil, v6); err != nil {
		return err
	}
	if err := netns.Set(guest); err != nil {
		return err
	}
	if err := GuestAddress(l); err != nil {
		return err
	}
	if v6 != nil {
		if err := GuestAddress6(*v6); err != nil {
			return err
		}
	}
	return nil
}

// makeGateway runs on a locked thread: it creates sandbox id's gateway
// namespace (the thread stays in it), the veth from its gw0 to eth0 in
// namespace guest, gw0's address and the filter. With vm (a VM's egress
// network, vm.go) gw0 gets vm.gatewayMAC and the link filter admits only
// the VM's frames.
func makeGateway(id string, l Link, guest netns.NsHandle, vm *vmLink, v6 *Link6) error {
	gw, err := netns.NewNamed(GatewayName(id)) // the thread is now in gw
	if err != nil {
		return fmt.Errorf("create namespace %s: %w", GatewayName(id), err)
	}
	defer gw.Close()
	if err := upLoopback(); err != nil {
		return err
	}
	if err := setIPv6(v6 != nil); err != nil {
		return err
	}
	attrs := netlink.LinkAttrs{Name: GatewayIf}
	if vm != nil {
		attrs.HardwareAddr = vm.gatewayMAC
	}
	veth := &netlink.Veth{LinkAttrs: attrs, PeerName: GuestIf, PeerNamespace: netlink.NsFd(int(guest))}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s/%s: %w", GatewayIf, GuestIf, err)
	}
	gwLink, err := netlink.LinkByName(GatewayIf)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(gwLink, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(l.Gateway, l.Guest.Bits()))}); err != nil {
		return fmt.Errorf("address %s: %w", GatewayIf, err)
	}
	if v6 != nil {
		a := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(v6.Gateway, v6.Guest.Bits())), Flags: unix.IFA_F_NODAD}
		if err := netlink.AddrAdd(gwLink, a); err != nil {
			return fmt.Errorf("address %s: %w", GatewayIf, err)
		}
	}
	if err := netlink.LinkSetUp(gwLink); err != nil {
		return err
	}
	if err := writeFilter(0, l, v6); err != nil {
		return fmt.Errorf("nftables in %s: %w", GatewayName(id), err)
	}
	if err := tproxyRoute(v6 != nil); err != nil {
		return fmt.Errorf("%s: %w", GatewayName(id), err)
	}
	if vm != nil {
		if err := writeLinkFilter(0, l, vm.guestMAC); err != nil {
			return fmt.Errorf("nftables (link) in %s: %w", GatewayName(id), err)
		}
	}
	return nil
}

// GuestAddress puts the guest's address and default route on eth0 of the
// calling thread's namespace. runsc moves them into its netstack (deleting
// them from eth0) whenever it starts or restores a sandbox, so they are
// put back before each (PrepareGuest).
func GuestAddress(l Link) error {
	eth, err := netlink.LinkByName(GuestIf)
	if err != nil {
		return fmt.Errorf("find %s: %w", GuestIf, err)
	}
	if err := netlink.AddrReplace(eth, &netlink.Addr{IPNet: ipNet(l.Guest)}); err != nil {
		return fmt.Errorf("address %s: %w", GuestIf, err)
	}
	if err := netlink.LinkSetUp(eth); err != nil {
		return err
	}
	route := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.IP(l.Gateway.AsSlice())}
	if err := netlink.RouteReplace(route); err != nil {
		return fmt.Errorf("default route via %s: %w", l.Gateway, err)
	}
	return nil
}

// GuestAddress6 puts the guest's IPv6 address (no DAD) and its ::/0 route
// on eth0 of the calling thread's namespace, like GuestAddress.
func GuestAddress6(l Link6) error {
	eth, err := netlink.LinkByName(GuestIf)
	if err != nil {
		return fmt.Errorf("find %s: %w", GuestIf, err)
	}
	if err := netlink.AddrReplace(eth, &netlink.Addr{IPNet: ipNet(l.Guest), Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("address %s: %w", GuestIf, err)
	}
	if err := netlink.LinkSetUp(eth); err != nil {
		return err
	}
	route := &netlink.Route{LinkIndex: eth.Attrs().Index, Family: unix.AF_INET6, Gw: net.IP(l.Gateway.AsSlice()),
		Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}}
	if err := netlink.RouteReplace(route); err != nil {
		return fmt.Errorf("default route via %s: %w", l.Gateway, err)
	}
	return nil
}

// hasAddr reports whether link name of the calling thread's namespace
// has address a.
func hasAddr(name string, a netip.Addr) bool {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return false
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return false
	}
	for _, x := range addrs {
		if ip, ok := netip.AddrFromSlice(x.IP); ok && ip.Unmap() == a {
			return true
		}
	}
	return false
}

func upLoopback() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	return netlink.LinkSetUp(lo)
}

// disableIPv6 turns IPv6 off in the calling thread's namespace (for links
// made from now on and existing ones). /proc/sys/net is the namespace of
// the task that opens it, hence the thread's.
func disableIPv6() error {
	if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
		return nil // no IPv6 in this kernel
	}
	for _, k := range []string{"all", "default"} {
		p := "/proc/sys/net/ipv6/conf/" + k + "/disable_ipv6"
		if err := os.WriteFile(p, []byte("1"), 0o644); err != nil {
			return fmt.Errorf("disable IPv6: %w", err)
		}
	}
	return nil
}

// setIPv6 turns IPv6 off in the calling thread's namespace (disableIPv6)
// or, with on, keeps it on for static addresses only: links made from now
// on get no link-local address (addr_gen_mode 1), no SLAAC, accept no
// router advertisements, send no solicitations and run no DAD.
func setIPv6(on bool) error {
	if !on {
		return disableIPv6()
	}
	for _, k := range []string{"all", "default"} {
		for key, v := range map[string]string{"disable_ipv6": "0", "addr_gen_mode": "1", "accept_ra": "0", "autoconf": "0", "accept_dad": "0", "router_solicitations": "0", "accept_redirects": "0"} {
			if k == "all" && key == "addr_gen_mode" {
				continue // per link only
			}
			p := "/proc/sys/net/ipv6/conf/" + k + "/" + key
			if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
				return fmt.Errorf("IPv6 setting %s: %w", p, err)
			}
		}
	}
	return nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// FilterTable is the nftables table (family inet) in a gateway namespace.
const FilterTable = "airlock"

// writeFilter writes the gateway namespace's table (see the top of this
// file) through the netlink socket of namespace fd (0: the calling
// thread's).
func writeFilter(fd int, l Link, v6 *Link6) error {
	var opts []nftables.ConnOption
	if fd > 0 {
		opts = append(opts, nftables.WithNetNSFd(fd))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return err
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: FilterTable})
	drop, accept := nftables.ChainPolicyDrop, nftables.ChainPolicyAccept
	guard := c.AddChain(&nftables.Chain{Name: "guard", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRaw, Policy: &accept})
	redirect := c.AddChain(&nftables.Chain{Name: "redirect", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	input := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	forward := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	output := c.AddChain(&nftables.Chain{Name: "output", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	_ = forward // policy drop, no rules

	rule := func(ch *nftables.Chain, e ...expr.Any) { c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: e}) }
	fromGuest := iifname(GatewayIf)
	verdict := func(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }
	port := func(proto byte, p uint16) []expr.Any {
		return append(l4proto(proto), &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(p)})
	}
	dns := func(proto byte) []expr.Any { return port(proto, 53) }

	// guard: anti-spoofing and protocols.
	nd := []uint8{135, 136} // ICMPv6 neighbour solicitation and advertisement
	if v6 != nil {
		ip6 := []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV6}}}
		from6 := cat(fromGuest, ip6)
		rule(guard, cat(from6, []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 16},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: v6.Guest.Addr().AsSlice()},
			verdict(expr.VerdictDrop),
		})...)
		for _, typ := range nd {
			rule(guard, cat(from6, icmp6Type(typ), []expr.Any{verdict(expr.VerdictAccept)})...)
		}
		rule(guard, cat(from6, l4proto(unix.IPPROTO_TCP), []expr.Any{verdict(expr.VerdictAccept)})...)
		rule(guard, cat(from6, dns(unix.IPPROTO_UDP), []expr.Any{verdict(expr.VerdictAccept)})...)
		rule(guard, cat(from6, l4proto(unix.IPPROTO_UDP), []expr.Any{verdict(expr.VerdictAccept)})...) // on to the tproxy chain
		rule(guard, cat(from6, []expr.Any{verdict(expr.VerdictDrop)})...)                              // other ICMPv6, the rest
		for _, typ := range nd {
			rule(input, cat(from6, icmp6Type(typ), []expr.Any{verdict(expr.VerdictAccept)})...)
			rule(output, cat([]expr.Any{&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(GatewayIf)}}, ip6, icmp6Type(typ), []expr.Any{verdict(expr.VerdictAccept)})...)
		}
	}
	rule(guard, cat(fromGuest, notIPv4(), []expr.Any{verdict(expr.VerdictDrop)})...)
	rule(guard, cat(fromGuest, []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: l.Guest.Addr().AsSlice()},
		verdict(expr.VerdictDrop),
	})...)
	rule(guard, cat(fromGuest, l4proto(unix.IPPROTO_TCP), []expr.Any{verdict(expr.VerdictAccept)})...)
	rule(guard, cat(fromGuest, dns(unix.IPPROTO_UDP), []expr.Any{verdict(expr.VerdictAccept)})...)
	rule(guard, cat(fromGuest, l4proto(unix.IPPROTO_UDP), []expr.Any{verdict(expr.VerdictAccept)})...) // on to the tproxy chain
	rule(guard, cat(fromGuest, []expr.Any{verdict(expr.VerdictDrop)})...)

	// redirect: DNS (any address) to the resolver, other TCP to the proxy.
	redir := func(port uint16) []expr.Any {
		return []expr.Any{
			&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
			&expr.Redir{RegisterProtoMin: 1, RegisterProtoMax: 1},
		}
	}
	rule(redirect, cat(fromGuest, dns(unix.IPPROTO_UDP), redir(DNSPort))...)
	rule(redirect, cat(fromGuest, dns(unix.IPPROTO_TCP), redir(DNSPort))...)
	rule(redirect, cat(fromGuest, l4proto(unix.IPPROTO_TCP), redir(ProxyPort))...)

	// input: loopback, and the redirected ports from the guest.
	rule(input, cat(iifname("lo"), []expr.Any{verdict(expr.VerdictAccept)})...)
	rule(input, cat(fromGuest, port(unix.IPPROTO_TCP, ProxyPort), []expr.Any{verdict(expr.VerdictAccept)})...)
	rule(input, cat(fromGuest, port(unix.IPPROTO_TCP, DNSPort), []expr.Any{verdict(expr.VerdictAccept)})...)
	rule(input, cat(fromGuest, port(unix.IPPROTO_UDP, DNSPort), []expr.Any{verdict(expr.VerdictAccept)})...)

	// UDP other than DNS: to the transparent relay (udp.go).
	udpFilter(c, t, input, fromGuest, v6 != nil)

	// output: replies and loopback only.
	rule(output, &expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname("lo")}, verdict(expr.VerdictAccept))
	rule(output,
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
		verdict(expr.VerdictAccept))
	return c.Flush()
}

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

func iifname(n string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(n)}}
}

func notIPv4() []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}}}
}

// icmp6Type matches ICMPv6 messages of type typ.
func icmp6Type(typ uint8) []expr.Any {
	return append(l4proto(unix.IPPROTO_ICMPV6), &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{typ}})
}

func l4proto(p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}}}
}

// Listeners are the gateway's sockets for one sandbox, in its gateway
// namespace on Link.Gateway.
type Listeners struct {
	Proxy  net.Listener   // TCP, ProxyPort: every redirected connection
	DNS    net.PacketConn // UDP, DNSPort
	DNSTCP net.Listener   // TCP, DNSPort
	UDP    *UDPRelay      // UDP other than DNS, UDPPort (tproxy)
	// The same on Link6.Gateway (nil without IPv6 on the link).
	Proxy6  net.Listener
	DNS6    net.PacketConn
	DNSTCP6 net.Listener
}

// Close closes every listener.
func (ls Listeners) Close() error {
	var errs []error
	for _, c := range []interface{ Close() error }{ls.Proxy, ls.DNS, ls.DNSTCP, ls.UDP, ls.Proxy6, ls.DNS6, ls.DNSTCP6} {
		if c != nil && !isNil(c) {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

func isNil(c interface{ Close() error }) bool {
	switch v := c.(type) {
	case net.Listener:
		return v == nil
	case net.PacketConn:
		return v == nil
	}
	return false
}

// Do runs fn on an OS thread that has entered the network namespace at
// path; the thread is thrown away afterwards (never unlocked), so nothing
// else ever runs in that namespace. Sockets fn opens stay in it.
func Do(path string, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread ends with the goroutine
		ns, err := netns.GetFromPath(path)
		if err != nil {
			done <- err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			done <- err
			return
		}
		done <- fn()
	}()
	return <-done
}

// OpenGateway opens the gateway's listeners in sandbox id's gateway
// namespace (made by Setup with Config.Egress), and the IPv6 ones when its
// gw0 has DefaultLink6's gateway address (Setup with Config.IPv6: the
// namespace itself says, so a restarted worker adopting the sandbox opens
// what it was made with). The worker calls it after Setup, and again for
// each adopted sandbox after a restart.
func OpenGateway(id string, cfg Config) (Listeners, error) {
	if err := validID(id); err != nil {
		return Listeners{}, err
	}
	addr := cfg.link().Gateway.String()
	var ls Listeners
	err := Do(GatewayPath(id), func() error {
		var err error
		ls.Proxy, err = net.Listen("tcp4", net.JoinHostPort(addr, strconv.Itoa(ProxyPort)))
		if err == nil {
			ls.DNS, err = net.ListenPacket("udp4", net.JoinHostPort(addr, strconv.Itoa(DNSPort)))
		}
		if err == nil {
			ls.DNSTCP, err = net.Listen("tcp4", net.JoinHostPort(addr, strconv.Itoa(DNSPort)))
		}
		if err == nil {
			ls.UDP, err = openUDPRelay(GatewayPath(id), cfg.link().Gateway)
		}
		if err != nil || !hasAddr(GatewayIf, DefaultLink6.Gateway) {
			return err
		}
		addr6 := DefaultLink6.Gateway.String()
		ls.Proxy6, err = net.Listen("tcp6", net.JoinHostPort(addr6, strconv.Itoa(ProxyPort)))
		if err == nil {
			ls.DNS6, err = net.ListenPacket("udp6", net.JoinHostPort(addr6, strconv.Itoa(DNSPort)))
		}
		if err == nil {
			ls.DNSTCP6, err = net.Listen("tcp6", net.JoinHostPort(addr6, strconv.Itoa(DNSPort)))
		}
		if err == nil {
			err = ls.UDP.open6(DefaultLink6.Gateway)
		}
		return err
	})
	if err != nil {
		ls.Close()
		return Listeners{}, fmt.Errorf("network: open gateway of %s: %w", id, err)
	}
	return ls, nil
}

// PrepareAt puts the guest's addresses and route of n (made by Setup) back
// on its interface (runsc takes them away at each start and restore). A
// network without addresses needs nothing.
func PrepareAt(n runtime.Network) error {
	if n.Namespace == "" || len(n.Interfaces) != 1 || len(n.Interfaces[0].Addresses) == 0 || len(n.Interfaces[0].Addresses) > 2 || !n.Gateway.IsValid() {
		return nil
	}
	if n.Interfaces[0].Name != GuestIf {
		return nil // a VM's tap: the guest holds its addresses itself (vm.go)
	}
	l := Link{Guest: n.Interfaces[0].Addresses[0], Gateway: n.Gateway}
	var l6 *Link6
	if as := n.Interfaces[0].Addresses; len(as) == 2 && as[1].Addr().Is6() && n.Gateway6.IsValid() {
		l6 = &Link6{Guest: as[1], Gateway: n.Gateway6}
	}
	if err := Do(n.Namespace, func() error {
		if err := GuestAddress(l); err != nil || l6 == nil {
			return err
		}
		return GuestAddress6(*l6)
	}); err != nil {
		return fmt.Errorf("network: prepare guest link in %s: %w", n.Namespace, err)
	}
	return nil
}
