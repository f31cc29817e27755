package network_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/network"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/testenv"
)

// inNamespace runs fn on a thread in the namespace at path (network.Do).
func inNamespace(t *testing.T, path string, fn func() error) error {
	t.Helper()
	return network.Do(path, fn)
}

// originalDst is the destination a REDIRECTed connection was sent to.
func originalDst(t *testing.T, c net.Conn) netip.AddrPort {
	t.Helper()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var ap netip.AddrPort
	var serr error
	raw.Control(func(fd uintptr) {
		// struct sockaddr_in, read through the 16-byte IPv6Mreq getter.
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			serr = err
			return
		}
		b := m.Multiaddr
		ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), binary.BigEndian.Uint16(b[2:4]))
	})
	if serr != nil {
		t.Fatalf("SO_ORIGINAL_DST: %v", serr)
	}
	return ap
}

// TestEgressDataPath: an egress network sends every TCP connection of the
// guest, to any address, to the gateway's proxy listener (with its original
// destination), every DNS query to its DNS listener, and nothing else
// anywhere: spoofed sources, other UDP and IPv6 do not arrive.
func TestEgressDataPath(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces, veths and nftables")
	ctx := context.Background()
	id := model.NewID("sb")
	cfg := network.Config{Egress: true}
	t.Cleanup(func() { network.Release(ctx, id) })
	n, err := network.Setup(ctx, id, runtime.Caps{Pause: true}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := network.DefaultLink
	if n.Namespace != network.Path(id) || len(n.Interfaces) != 1 || n.Interfaces[0].Name != network.GuestIf ||
		n.Interfaces[0].Addresses[0] != want.Guest || n.Gateway != want.Gateway || n.Nameservers[0] != want.Gateway {
		t.Fatalf("network %+v", n)
	}
	if !network.HasGateway(id) {
		t.Fatal("no gateway namespace")
	}
	ls, err := network.OpenGateway(id, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()

	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ls.Proxy.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dns := make(chan netip.AddrPort, 4)
	go func() {
		buf := make([]byte, 512)
		for {
			_, from, err := ls.DNS.ReadFrom(buf)
			if err != nil {
				return
			}
			dns <- from.(*net.UDPAddr).AddrPort()
		}
	}()

	// TCP to anywhere lands on the proxy, from the guest's address, with
	// the destination it was sent to.
	for _, dst := range []string{"198.18.5.5:443", "10.1.2.3:22", "100.64.0.1:8080", "169.254.169.254:80"} {
		err := inNamespace(t, n.Namespace, func() error {
			c, err := net.DialTimeout("tcp4", dst, 5*time.Second)
			if err == nil {
				c.Close()
			}
			return err
		})
		if err != nil {
			t.Fatalf("dial %s from the guest: %v", dst, err)
		}
		c := <-accepted
		if got := originalDst(t, c); got.String() != dst {
			t.Errorf("dial %s: original destination %s", dst, got)
		}
		if from := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr(); from != want.Guest.Addr() {
			t.Errorf("dial %s: from %s, want the guest's %s", dst, from, want.Guest.Addr())
		}
		c.Close()
	}

	// DNS to any resolver lands on the gateway's.
	for _, dst := range []string{"8.8.8.8:53", "100.64.0.1:53"} {
		err := inNamespace(t, n.Namespace, func() error {
			c, err := net.Dial("udp4", dst)
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
			if from.Addr() != want.Guest.Addr() {
				t.Errorf("DNS to %s arrived from %s", dst, from)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("DNS query to %s never reached the gateway", dst)
		}
	}

	// A spoofed source (an address the guest added itself) never arrives:
	// the connect gets no answer. (The gateway namespace gets a route back
	// to that address, so only the filter stands in the way.)
	err = inNamespace(t, network.GatewayPath(id), func() error {
		gw, err := netlink.LinkByName(network.GatewayIf)
		if err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: gw.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4(10, 9, 9, 9), Mask: net.CIDRMask(32, 32)}})
	})
	if err != nil {
		t.Fatal(err)
	}
	err = inNamespace(t, n.Namespace, func() error {
		eth, err := netlink.LinkByName(network.GuestIf)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(eth, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 9, 9, 9), Mask: net.CIDRMask(32, 32)}}); err != nil {
			return err
		}
		d := net.Dialer{Timeout: 500 * time.Millisecond, LocalAddr: &net.TCPAddr{IP: net.IPv4(10, 9, 9, 9)}}
		c, err := d.Dial("tcp4", "198.18.5.5:443")
		if err == nil {
			c.Close()
			return errors.New("a connection from a spoofed source was answered")
		}
		// UDP other than DNS goes nowhere either; IPv6 has no address.
		u, err := net.Dial("udp4", "198.18.5.5:9999")
		if err != nil {
			return err
		}
		u.Write([]byte("x"))
		u.Close()
		if c, err := net.DialTimeout("tcp6", "[2001:db8::1]:80", time.Second); err == nil {
			c.Close()
			return errors.New("an IPv6 connection was answered")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-accepted:
		t.Errorf("the proxy accepted a connection from %s", c.RemoteAddr())
	case from := <-dns:
		t.Errorf("the DNS listener got a packet from %s", from)
	case <-time.After(300 * time.Millisecond):
	}

	// The gateway namespace has no route off its link.
	err = inNamespace(t, network.GatewayPath(id), func() error {
		c, err := net.DialTimeout("tcp4", "198.18.5.5:443", time.Second)
		if err == nil {
			c.Close()
			return errors.New("the gateway namespace reached 198.18.5.5")
		}
		if !errors.Is(err, syscall.ENETUNREACH) && !errors.Is(err, syscall.EPERM) {
			return errors.New("dial from the gateway namespace: " + err.Error() + "; want network unreachable or refused by the filter")
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}

	ls.Close()
	if err := network.Release(ctx, id); err != nil {
		t.Fatal(err)
	}
	assertReleased(t, id)
	if network.HasGateway(id) {
		t.Error("gateway namespace remains")
	}
}
