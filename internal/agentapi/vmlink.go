package agentapi

// The VM link: how a microVM runtime (internal/runtime/qemu) and the agent
// in its guest (internal/agent, VM init mode) find each other. Both sides
// import these words from here, so a host driver never links the guest
// agent's server.
//
// Disks. The template root filesystem is a read-only virtio-blk disk with
// serial VMTemplateSerial, the sandbox's writable disk one with serial
// VMDiskSerial; the guest's stage one mounts them under an overlayfs.
//
// Kernel command line (the kernel ignores these words; see VMParams):
//
//	airlock.vm=1              VM init mode
//	airlock.hostname=NAME     the guest hostname
//	airlock.args=BASE64       extra agent arguments, NUL-separated, base64url (no padding): VMCmdlineArgs
//	airlock.net=A/N,GW[,DNS]  the guest's network (an egress network; VMNet): eth0's address and
//	                          prefix, its default route and the resolvers of /etc/resolv.conf;
//	                          absent, eth0 stays down
//
// Channel. A virtio-serial port (a virtserialport named VMPortName, not a
// virtconsole) carries one byte stream for all host connections in turn.
// While no host is connected the guest's read returns 0 (EOF) and poll
// reports POLLHUP, so the guest notices a host disconnect and starts a
// fresh HTTP/2 session for the next host connection. A disconnect followed
// quickly by a reconnect may not be seen as EOF, so each host connection
// starts with a handshake that also resynchronises:
//
//	host → guest  VMSyncPrefix <nonce> "\n"  repeated every 100 ms until acknowledged
//	guest → host  VMAckPrefix <nonce> "\n"
//	host → guest  VMGoPrefix <nonce> "\n"
//
// and then HTTP/2 (h2c) both ways, the agent serving. The 0xffffff prefix of
// VMSyncPrefix reads as an HTTP/2 frame header announcing a 16 MiB frame,
// so a stale guest session that reads it fails at once (frame too large)
// and lets go of the port. The guest discards everything before a SYNC line
// and between ACK and GO; the host discards everything before the ACK.
// Nonces are at most 64 bytes.

import (
	"encoding/base64"
	"fmt"
	"net/netip"
	"strings"
)

// Names the host gives the guest's devices.
const (
	// VMPortName is the name of the virtserialport the host talks on.
	VMPortName = "airlock"
	// VMTemplateSerial and VMDiskSerial are the serials of the template
	// (read-only) and sandbox (writable) disks.
	VMTemplateSerial = "airlock-template"
	VMDiskSerial     = "airlock-disk"
)

// Handshake words of the VM channel.
const (
	VMSyncPrefix = "\xff\xff\xff\nAIRLOCK-SYNC "
	VMAckPrefix  = "AIRLOCK-ACK "
	VMGoPrefix   = "AIRLOCK-GO "
)

// VMParams are the airlock.* words of the kernel command line.
type VMParams struct {
	VM       bool
	Hostname string
	Args     []string
	Net      VMNet // zero: no network
}

// VMNet is the guest's network: eth0's address, its default route and its
// resolvers. The host picks it (internal/network's egress link) and the
// guest agent applies it at boot; a snapshot keeps it (the guest's memory
// holds it), so a restore must hand the same one.
type VMNet struct {
	Addr    netip.Prefix
	Gateway netip.Addr
	DNS     []netip.Addr
}

// IsZero reports whether n names no network.
func (n VMNet) IsZero() bool { return !n.Addr.IsValid() }

// String is n as airlock.net= takes it ("" for the zero VMNet).
func (n VMNet) String() string {
	if n.IsZero() {
		return ""
	}
	parts := []string{n.Addr.String(), n.Gateway.String()}
	for _, d := range n.DNS {
		parts = append(parts, d.String())
	}
	return strings.Join(parts, ",")
}

// ParseVMNet reads airlock.net='s value: IPv4 only, the gateway inside the
// prefix and not the guest's own address.
func ParseVMNet(s string) (VMNet, error) {
	f := strings.Split(s, ",")
	if len(f) < 2 {
		return VMNet{}, fmt.Errorf("airlock.net=%q: want ADDR/BITS,GATEWAY[,DNS...]", s)
	}
	var n VMNet
	var err error
	if n.Addr, err = netip.ParsePrefix(f[0]); err != nil || !n.Addr.Addr().Is4() {
		return VMNet{}, fmt.Errorf("airlock.net=%q: address %q is not an IPv4 prefix", s, f[0])
	}
	if n.Gateway, err = netip.ParseAddr(f[1]); err != nil || !n.Gateway.Is4() || !n.Addr.Contains(n.Gateway) || n.Gateway == n.Addr.Addr() {
		return VMNet{}, fmt.Errorf("airlock.net=%q: gateway %q is not another IPv4 address of %s", s, f[1], n.Addr)
	}
	for _, d := range f[2:] {
		a, err := netip.ParseAddr(d)
		if err != nil || !a.Is4() {
			return VMNet{}, fmt.Errorf("airlock.net=%q: resolver %q is not an IPv4 address", s, d)
		}
		n.DNS = append(n.DNS, a)
	}
	return n, nil
}

// ParseVMCmdline reads airlock.* parameters from a kernel command line.
func ParseVMCmdline(cmdline string) VMParams {
	var p VMParams
	for _, w := range strings.Fields(cmdline) {
		k, v, _ := strings.Cut(w, "=")
		switch k {
		case "airlock.vm":
			p.VM = v == "1"
		case "airlock.hostname":
			p.Hostname = v
		case "airlock.net":
			p.Net, _ = ParseVMNet(v) // a malformed one is no network
		case "airlock.args":
			if b, err := base64.RawURLEncoding.DecodeString(v); err == nil && len(b) > 0 {
				p.Args = strings.Split(string(b), "\x00")
			}
		}
	}
	return p
}

// VMCmdlineArgs encodes extra agent arguments for airlock.args=.
func VMCmdlineArgs(args []string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strings.Join(args, "\x00")))
}
