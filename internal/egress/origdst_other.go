//go:build !linux

package egress

import (
	"errors"
	"net"
	"net/netip"
)

// OriginalDst needs Linux's SO_ORIGINAL_DST; elsewhere pass
// Config.OriginalDst.
func OriginalDst(c net.Conn) (netip.AddrPort, error) {
	return netip.AddrPort{}, errors.New("original destination: only on linux")
}
