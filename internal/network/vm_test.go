package network_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/network"
	"github.com/airlock/airlock/internal/testenv"
)

// vmTap is the VM's end of a tap: what is written is what the VM's NIC
// sends, what is read what it receives.
type vmTap struct {
	f      *os.File
	frames chan []byte
}

// openTap opens the tap of namespace path as QEMU does (TUNSETIFF by name,
// IFF_TAP|IFF_NO_PI).
func openTap(t *testing.T, path string) *vmTap {
	t.Helper()
	var fd int
	err := network.Do(path, func() error {
		var err error
		fd, err = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		ifr, err := unix.NewIfreq(network.TapName)
		if err != nil {
			return err
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return err
		}
		return unix.SetNonblock(fd, true)
	})
	if err != nil {
		t.Fatalf("open the tap: %v", err)
	}
	tp := &vmTap{f: os.NewFile(uintptr(fd), "tap"), frames: make(chan []byte, 256)}
	t.Cleanup(func() { tp.f.Close() })
	go func() {
		for {
			b := make([]byte, 65536)
			n, err := tp.f.Read(b)
			if err != nil {
				close(tp.frames)
				return
			}
			tp.frames <- b[:n]
		}
	}()
	return tp
}

func (tp *vmTap) send(t *testing.T, frame []byte) {
	t.Helper()
	if _, err := tp.f.Write(frame); err != nil {
		t.Fatalf("write a frame to the tap: %v", err)
	}
}

// await returns the first frame received within d that match accepts (nil:
// none).
func (tp *vmTap) await(d time.Duration, match func([]byte) bool) []byte {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case f, ok := <-tp.frames:
			if !ok {
				return nil
			}
			if match(f) {
				return f
			}
		case <-timer.C:
			return nil
		}
	}
}

func mac(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

func ether(dst, src net.HardwareAddr, typ uint16, payload []byte) []byte {
	b := append(append(append([]byte{}, dst...), src...), byte(typ>>8), byte(typ))
	return append(b, payload...)
}

func csum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

func ipv4(src, dst netip.Addr, proto byte, payload []byte) []byte {
	h := make([]byte, 20)
	h[0], h[8], h[9] = 0x45, 64, proto
	binary.BigEndian.PutUint16(h[2:], uint16(20+len(payload)))
	copy(h[12:], src.AsSlice())
	copy(h[16:], dst.AsSlice())
	binary.BigEndian.PutUint16(h[10:], csum(h))
	return append(h, payload...)
}

func udp(sport, dport uint16, payload []byte) []byte {
	h := make([]byte, 8) // checksum 0: none (IPv4)
	binary.BigEndian.PutUint16(h[0:], sport)
	binary.BigEndian.PutUint16(h[2:], dport)
	binary.BigEndian.PutUint16(h[4:], uint16(8+len(payload)))
	return append(h, payload...)
}

func tcpSYN(src, dst netip.Addr, sport, dport uint16) []byte {
	h := make([]byte, 20)
	binary.BigEndian.PutUint16(h[0:], sport)
	binary.BigEndian.PutUint16(h[2:], dport)
	binary.BigEndian.PutUint32(h[4:], 0x01020304)
	h[12], h[13] = 5<<4, 0x02 // data offset, SYN
	binary.BigEndian.PutUint16(h[14:], 64240)
	pseudo := append(append(append([]byte{}, src.AsSlice()...), dst.AsSlice()...), 0, unix.IPPROTO_TCP, 0, 20)
	binary.BigEndian.PutUint16(h[16:], csum(append(pseudo, h...)))
	return h
}

func arp(op uint16, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr) []byte {
	b := []byte{0, 1, 0x08, 0, 6, 4, byte(op >> 8), byte(op)}
	b = append(append(b, sha...), spa.AsSlice()...)
	return append(append(b, tha...), tpa.AsSlice()...)
}

// isSYNACK matches a TCP SYN-ACK from src:sport to the guest's dport.
func isSYNACK(src netip.Addr, sport, dport uint16) func([]byte) bool {
	return func(f []byte) bool {
		if len(f) < 14+20+20 || binary.BigEndian.Uint16(f[12:]) != 0x0800 || f[14+9] != unix.IPPROTO_TCP {
			return false
		}
		ip := f[14:]
		tcp := ip[int(ip[0]&0xf)*4:]
		return bytes.Equal(ip[12:16], src.AsSlice()) && binary.BigEndian.Uint16(tcp[0:]) == sport &&
			binary.BigEndian.Uint16(tcp[2:]) == dport && tcp[13]&0x12 == 0x12
	}
}

// isARPReply matches an ARP reply from spa.
func isARPReply(spa netip.Addr) func([]byte) bool {
	return func(f []byte) bool {
		return len(f) >= 14+28 && binary.BigEndian.Uint16(f[12:]) == 0x0806 &&
			binary.BigEndian.Uint16(f[14+6:]) == 2 && bytes.Equal(f[14+14:14+18], spa.AsSlice())
	}
}

// neighbour is gw0's ARP entry for ip in the gateway namespace (nil: none).
func neighbour(t *testing.T, id string, ip netip.Addr) net.HardwareAddr {
	t.Helper()
	ns, err := netns.GetFromPath(network.GatewayPath(id))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ns4, err := h.NeighList(0, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns4 {
		if n.IP.Equal(net.IP(ip.AsSlice())) && n.State&(netlink.NUD_FAILED|netlink.NUD_INCOMPLETE) == 0 {
			return n.HardwareAddr
		}
	}
	return nil
}

// TestVMEgressDataPath: a VM's egress network (Config.Egress for a runtime
// with a network device) bridges its tap to the gateway namespace, where
// the gVisor path's rules apply to its frames and a link-layer table admits
// only frames from the VM's MAC and ARP naming its own address. Frames are
// written to and read from the tap exactly as QEMU's virtio-net does, so
// every spoofed header here is one a VM's root could send.
func TestVMEgressDataPath(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces, a bridge, a tap and nftables")
	ctx := context.Background()
	id := model.NewID("sb")
	cfg := network.Config{Egress: true}
	t.Cleanup(func() { network.Release(ctx, id) })
	n, err := network.Setup(ctx, id, vm, cfg)
	if err != nil {
		t.Fatal(err)
	}
	l := network.DefaultLink
	if n.Namespace != network.Path(id) || len(n.Interfaces) != 1 || n.Interfaces[0].Name != network.TapName ||
		n.Interfaces[0].MAC != network.GuestMAC || len(n.Interfaces[0].Addresses) != 1 || n.Interfaces[0].Addresses[0] != l.Guest ||
		n.Gateway != l.Gateway || len(n.Nameservers) != 1 || n.Nameservers[0] != l.Gateway {
		t.Fatalf("network %+v", n)
	}
	if got := links(t, n.Namespace); !got["lo"] || !got[network.TapName] || !got[network.GuestIf] || !got[network.BridgeName] || len(got) != 4 {
		t.Errorf("guest namespace links %v, want lo, tap0, eth0 and br0 up", got)
	}
	// The guest namespace carries frames only: no address on anything but lo.
	err = network.Do(n.Namespace, func() error {
		addrs, err := netlink.AddrList(nil, unix.AF_UNSPEC)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if !a.IP.IsLoopback() {
				return errors.New("the guest namespace has address " + a.String())
			}
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	ls, err := network.OpenGateway(id, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	dns := make(chan netip.AddrPort, 16)
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
	noDNS := func(what string) {
		t.Helper()
		select {
		case from := <-dns:
			t.Errorf("%s: the gateway's DNS listener got a query from %s", what, from)
		case <-time.After(300 * time.Millisecond):
		}
	}

	tap := openTap(t, n.Namespace)
	vmMAC, gwMAC, evil := mac(network.GuestMAC), mac(network.GatewayMAC), mac("52:54:00:de:ad:01")
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	guest, gw := l.Guest.Addr(), l.Gateway

	// ARP: the VM asks for the gateway and gets gw0's fixed MAC.
	// Asked again every half second, as a guest's ARP retries: the first
	// frame on a tap just brought up can be lost (seen once in CI), which
	// no guest notices.
	var reply []byte
	for range 10 {
		tap.send(t, ether(bcast, vmMAC, 0x0806, arp(1, vmMAC, guest, make(net.HardwareAddr, 6), gw)))
		if reply = tap.await(500*time.Millisecond, isARPReply(gw)); reply != nil {
			break
		}
	}
	if reply == nil {
		t.Fatal("no ARP reply from the gateway to the VM's request")
	}
	if got := net.HardwareAddr(reply[14+8 : 14+14]); got.String() != network.GatewayMAC {
		t.Errorf("the gateway answers ARP with %s, want the fixed %s", got, network.GatewayMAC)
	}

	// DNS from the VM arrives, from the VM's address.
	query := func(src net.HardwareAddr, from netip.Addr) []byte {
		return ether(gwMAC, src, 0x0800, ipv4(from, gw, unix.IPPROTO_UDP, udp(40000, 53, []byte("query"))))
	}
	tap.send(t, query(vmMAC, guest))
	select {
	case from := <-dns:
		if from != netip.AddrPortFrom(guest, 40000) {
			t.Errorf("DNS from the VM arrived from %s", from)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the VM's DNS query never reached the gateway")
	}
	// TCP to anywhere is redirected to the proxy: the SYN-ACK comes back
	// from the destination the VM named.
	dst := netip.MustParseAddr("198.18.5.5")
	tap.send(t, ether(gwMAC, vmMAC, 0x0800, ipv4(guest, dst, unix.IPPROTO_TCP, tcpSYN(guest, dst, 40001, 443))))
	if tap.await(5*time.Second, isSYNACK(dst, 443, 40001)) == nil {
		t.Fatal("no SYN-ACK for the VM's connection to 198.18.5.5:443 (redirected to the proxy)")
	}

	// Spoofed: another source MAC, another source address.
	tap.send(t, query(evil, guest))
	noDNS("a query from a MAC other than the VM's")
	tap.send(t, query(vmMAC, netip.MustParseAddr("10.9.9.9")))
	noDNS("a query from a source address other than the VM's")
	tap.send(t, ether(gwMAC, evil, 0x0800, ipv4(guest, dst, unix.IPPROTO_TCP, tcpSYN(guest, dst, 40002, 443))))
	if tap.await(300*time.Millisecond, isSYNACK(dst, 443, 40002)) != nil {
		t.Error("a SYN from a MAC other than the VM's was answered")
	}
	// An IPv4 packet in a VLAN tag, from the VM's own MAC.
	tagged := ether(gwMAC, vmMAC, 0x8100, append([]byte{0, 5, 0x08, 0}, ipv4(guest, gw, unix.IPPROTO_UDP, udp(40003, 53, []byte("query")))...))
	tap.send(t, tagged)
	noDNS("a VLAN-tagged query")

	// ARP that claims another address, or the VM's address for another
	// MAC, neither gets an answer nor changes the gateway's neighbours.
	other := netip.MustParseAddr("100.64.0.3")
	tap.send(t, ether(bcast, vmMAC, 0x0806, arp(1, vmMAC, other, make(net.HardwareAddr, 6), gw)))
	if tap.await(300*time.Millisecond, isARPReply(gw)) != nil {
		t.Error("the gateway answered an ARP request whose sender address is not the VM's")
	}
	if m := neighbour(t, id, other); m != nil {
		t.Errorf("the gateway learned %s at %s from a forged ARP request", other, m)
	}
	tap.send(t, ether(gwMAC, evil, 0x0806, arp(2, evil, guest, gwMAC, gw)))
	tap.send(t, ether(gwMAC, vmMAC, 0x0806, arp(2, evil, guest, gwMAC, gw)))
	time.Sleep(300 * time.Millisecond)
	if m := neighbour(t, id, guest); m == nil || m.String() != network.GuestMAC {
		t.Errorf("the gateway's neighbour entry for the VM is %v after forged ARP replies, want %s", m, network.GuestMAC)
	}

	// The link table is what stopped the spoofed MAC: without it the same
	// query arrives (so this test can fail).
	err = network.Do(network.GatewayPath(id), func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		c.DelTable(&nftables.Table{Family: nftables.TableFamilyNetdev, Name: network.LinkTable})
		return c.Flush()
	})
	if err != nil {
		t.Fatal(err)
	}
	tap.send(t, query(evil, guest))
	select {
	case <-dns:
	case <-time.After(5 * time.Second):
		t.Error("without the link table a query from another MAC still did not arrive: the checks above prove nothing")
	}

	ls.Close()
	tap.f.Close()
	if err := network.Release(ctx, id); err != nil {
		t.Fatal(err)
	}
	assertReleased(t, id)
	if network.HasGateway(id) {
		t.Error("gateway namespace remains")
	}
}
