//go:build linux

package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST of <linux/netfilter_ipv6/ip6_tables.h>
// (80, like SO_ORIGINAL_DST), which x/sys/unix does not name.
const ip6tSOOriginalDst = 80

// OriginalDst returns the destination a connection redirected to the
// proxy by the kernel (nftables redirect, conntrack NAT) was addressed
// to: getsockopt SO_ORIGINAL_DST (IPv4) or IP6T_SO_ORIGINAL_DST (IPv6)
// on the accepted *net.TCPConn. The two options fill a sockaddr_in or a
// sockaddr_in6; x/sys/unix has no getsockopt returning a raw sockaddr,
// so the IPv6Mreq (16 bytes = sockaddr_in) and IPv6MTUInfo (32 bytes ⊇
// sockaddr_in6) getters, which read a buffer of those sizes, stand in.
func OriginalDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("original destination: %T is not a *net.TCPConn", c)
	}
	la, ok := tc.LocalAddr().(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, errors.New("original destination: no local address")
	}
	v4 := la.IP.To4() != nil
	raw, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	var ap netip.AddrPort
	var serr error
	cerr := raw.Control(func(fd uintptr) {
		if v4 {
			var m *unix.IPv6Mreq
			m, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IP, unix.SO_ORIGINAL_DST)
			if serr == nil {
				// struct sockaddr_in: family (2), port (2, network order), addr (4).
				port := binary.BigEndian.Uint16(m.Multiaddr[2:4])
				ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte(m.Multiaddr[4:8])), port)
				return
			}
			// A v4-mapped connection on an AF_INET6 socket: try IPv6 below.
		}
		var info *unix.IPv6MTUInfo
		info, serr = unix.GetsockoptIPv6MTUInfo(int(fd), unix.IPPROTO_IPV6, ip6tSOOriginalDst)
		if serr == nil {
			p := (*[2]byte)(unsafe.Pointer(&info.Addr.Port))
			ap = netip.AddrPortFrom(netip.AddrFrom16(info.Addr.Addr).Unmap(), binary.BigEndian.Uint16(p[:]))
		}
	})
	if cerr != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", cerr)
	}
	if serr != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: getsockopt: %w", serr)
	}
	return ap, nil
}
