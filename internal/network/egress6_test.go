package network_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/egress"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/network"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/testenv"
)

// TestEgressDataPathIPv6: with Config.IPv6 the link also carries
// DefaultLink6; every IPv6 TCP connection of the guest lands on the
// gateway's IPv6 proxy listener with its original destination
// (IP6T_SO_ORIGINAL_DST), DNS to any IPv6 resolver on its IPv6 DNS
// listener, other IPv6 UDP to the UDP relay, and a spoofed IPv6 source and ICMPv6 other
// than neighbour discovery arrive nowhere.
func TestEgressDataPathIPv6(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces, veths and nftables")
	ctx := context.Background()
	id := model.NewID("sb")
	cfg := network.Config{Egress: true, IPv6: true}
	t.Cleanup(func() { network.Release(ctx, id) })
	n, err := network.Setup(ctx, id, runtime.Caps{Pause: true}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	want, want6 := network.DefaultLink, network.DefaultLink6
	if len(n.Interfaces) != 1 || len(n.Interfaces[0].Addresses) != 2 || n.Interfaces[0].Addresses[0] != want.Guest ||
		n.Interfaces[0].Addresses[1] != want6.Guest || n.Gateway != want.Gateway || n.Gateway6 != want6.Gateway {
		t.Fatalf("network %+v", n)
	}
	ls, err := network.OpenGateway(id, network.Config{Egress: true}) // the namespace says it has IPv6
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	if ls.Proxy6 == nil || ls.DNS6 == nil || ls.DNSTCP6 == nil {
		t.Fatalf("IPv6 listeners missing: %+v", ls)
	}

	accepted := make(chan net.Conn, 4)
	for _, l := range []net.Listener{ls.Proxy, ls.Proxy6} {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				accepted <- c
			}
		}()
	}
	dns := make(chan netip.AddrPort, 4)
	for _, pc := range []net.PacketConn{ls.DNS, ls.DNS6} {
		go func() {
			buf := make([]byte, 512)
			for {
				_, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				dns <- from.(*net.UDPAddr).AddrPort()
			}
		}()
	}
	dnsTCP := make(chan net.Conn, 2)
	go func() {
		for {
			c, err := ls.DNSTCP6.Accept()
			if err != nil {
				return
			}
			dnsTCP <- c
		}
	}()

	// IPv6 TCP to anywhere lands on the IPv6 proxy listener, from the
	// guest's IPv6 address, with its destination; IPv4 still works.
	for _, dst := range []string{"[2001:db8:6::10]:80", "[fd00:ec2::254]:80", "[fd00:64::1]:22", "198.18.5.5:443"} {
		err := inNamespace(t, n.Namespace, func() error {
			c, err := net.DialTimeout("tcp", dst, 5*time.Second)
			if err == nil {
				c.Close()
			}
			return err
		})
		if err != nil {
			t.Fatalf("dial %s from the guest: %v", dst, err)
		}
		c := <-accepted
		got, err := egress.OriginalDst(c)
		if err != nil || got.String() != dst {
			t.Errorf("dial %s: original destination %s, %v", dst, got, err)
		}
		from := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr()
		if from != want6.Guest.Addr() && from != want.Guest.Addr() {
			t.Errorf("dial %s: from %s, want the guest's address", dst, from)
		}
		c.Close()
	}

	// DNS to any IPv6 resolver lands on the gateway's, over UDP and TCP.
	for _, dst := range []string{"[2001:4860:4860::8888]:53", "[fd00:64::1]:53"} {
		err := inNamespace(t, n.Namespace, func() error {
			c, err := net.Dial("udp6", dst)
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte("query"))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case from := <-dns:
			if from.Addr() != want6.Guest.Addr() {
				t.Errorf("DNS to %s arrived from %s", dst, from)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("DNS query to %s never reached the gateway", dst)
		}
	}
	err = inNamespace(t, n.Namespace, func() error {
		c, err := net.DialTimeout("tcp6", "[2001:db8::53]:53", 5*time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
	if err != nil {
		t.Fatalf("DNS over TCP (IPv6): %v", err)
	}
	(<-dnsTCP).Close()

	// A spoofed IPv6 source never arrives (the gateway namespace has a
	// route back to it: only the filter stands in the way), nor an ICMPv6
	// echo to the gateway; IPv6 UDP other than DNS goes to the UDP relay,
	// with its original destination.
	type relayedDatagram struct{ src, dst netip.AddrPort }
	relayed := make(chan relayedDatagram, 4)
	go func() {
		buf := make([]byte, 2048)
		for {
			_, src, dst, err := ls.UDP.ReadFrom(buf)
			if err != nil {
				return
			}
			relayed <- relayedDatagram{src, dst}
		}
	}()
	spoof := net.ParseIP("2001:db8:bad::1")
	err = inNamespace(t, network.GatewayPath(id), func() error {
		gw, err := netlink.LinkByName(network.GatewayIf)
		if err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: gw.Attrs().Index, Dst: &net.IPNet{IP: spoof, Mask: net.CIDRMask(128, 128)}})
	})
	if err != nil {
		t.Fatal(err)
	}
	err = inNamespace(t, n.Namespace, func() error {
		eth, err := netlink.LinkByName(network.GuestIf)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(eth, &netlink.Addr{IPNet: &net.IPNet{IP: spoof, Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
			return err
		}
		d := net.Dialer{Timeout: 500 * time.Millisecond, LocalAddr: &net.TCPAddr{IP: spoof}}
		c, err := d.Dial("tcp6", "[2001:db8:6::10]:80")
		if err == nil {
			c.Close()
			return errors.New("a connection from a spoofed IPv6 source was answered")
		}
		d = net.Dialer{LocalAddr: &net.UDPAddr{IP: spoof}}
		u, err := d.Dial("udp6", "[2001:db8:6::10]:53")
		if err != nil {
			return err
		}
		u.Write([]byte("spoofed query"))
		u.Close()
		// From the guest's own address (source selection would pick the
		// spoofed one: it shares a longer prefix with the destination).
		d = net.Dialer{LocalAddr: &net.UDPAddr{IP: net.IP(want6.Guest.Addr().AsSlice())}}
		u, err = d.Dial("udp6", "[2001:db8:6::10]:9999")
		if err != nil {
			return err
		}
		u.Write([]byte("x"))
		u.Close()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := inNamespace(t, n.Namespace, func() error { return echo6(want6.Gateway) }); err != nil {
		t.Error(err)
	}
	select {
	case r := <-relayed:
		if r.dst != netip.MustParseAddrPort("[2001:db8:6::10]:9999") || r.src.Addr() != want6.Guest.Addr() {
			t.Errorf("the UDP relay got %v → %v, want the guest → [2001:db8:6::10]:9999", r.src, r.dst)
		}
	case <-time.After(5 * time.Second): // a safety net
		t.Error("IPv6 UDP never reached the relay")
	}
	select {
	case c := <-accepted:
		t.Errorf("the proxy accepted a connection from %s", c.RemoteAddr())
	case from := <-dns:
		t.Errorf("the DNS listener got a packet from %s", from)
	case r := <-relayed:
		t.Errorf("the UDP relay got a second datagram %v → %v (the spoofed one?)", r.src, r.dst)
	case <-time.After(300 * time.Millisecond):
	}
}

// echo6 sends an ICMPv6 echo request to dst and fails if a reply comes
// within half a second.
func echo6(dst netip.Addr) error {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_ICMPV6)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 500000})
	req := []byte{128, 0, 0, 0, 0x12, 0x34, 0, 1} // echo request (the kernel fills the checksum)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrInet6{Addr: dst.As16()}); err != nil {
		return err
	}
	buf := make([]byte, 1500)
	for {
		m, from, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil // nothing came
		}
		if m > 0 && buf[0] == 129 { // echo reply
			return errors.New("an ICMPv6 echo to the gateway was answered from " + netip.AddrFrom16(from.(*unix.SockaddrInet6).Addr).String())
		}
	}
}

// TestEgressNoIPv6: without Config.IPv6 the guest has no IPv6 address and
// the gateway no IPv6 listeners.
func TestEgressNoIPv6(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces, veths and nftables")
	ctx := context.Background()
	id := model.NewID("sb")
	cfg := network.Config{Egress: true}
	t.Cleanup(func() { network.Release(ctx, id) })
	n, err := network.Setup(ctx, id, runtime.Caps{Pause: true}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Interfaces[0].Addresses) != 1 || n.Gateway6.IsValid() {
		t.Fatalf("network %+v", n)
	}
	ls, err := network.OpenGateway(id, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	if ls.Proxy6 != nil || ls.DNS6 != nil || ls.DNSTCP6 != nil {
		t.Errorf("IPv6 listeners without IPv6: %+v", ls)
	}
	err = inNamespace(t, n.Namespace, func() error {
		eth, err := netlink.LinkByName(network.GuestIf)
		if err != nil {
			return err
		}
		addrs, err := netlink.AddrList(eth, netlink.FAMILY_V6)
		if err != nil {
			return err
		}
		if len(addrs) > 0 {
			return errors.New("the guest has IPv6 addresses: " + addrs[0].String())
		}
		if c, err := net.DialTimeout("tcp6", "[2001:db8:6::10]:80", time.Second); err == nil {
			c.Close()
			return errors.New("an IPv6 connection was answered")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
