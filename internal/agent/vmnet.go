package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/agentapi"
)

// The VM's network (airlock.net=, agentapi.VMNet): on an egress network
// the host bridges the VM's tap to its egress gateway (internal/network)
// and the guest sets its own side up at boot, before any of the sandbox's
// processes run: IPv6 off (the gateway drops it anyway; this keeps the
// guest from even sending router solicitations), eth0's address and
// default route through rtnetlink, and /etc/resolv.conf naming the
// gateway (a read-only bind mount, as in gVisor). A snapshot keeps all of
// it in the guest's memory and disk, so a woken guest needs nothing again.
// Without airlock.net eth0 stays down.

const vmNetIf = "eth0"

// vmNetwork applies n in the new root (stage one, after the switch).
func vmNetwork(n agentapi.VMNet, log *slog.Logger) error {
	for _, k := range []string{"all", "default"} {
		p := "/proc/sys/net/ipv6/conf/" + k + "/disable_ipv6"
		if err := os.WriteFile(p, []byte("1"), 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("disable IPv6: %w", err)
		}
	}
	ifc, err := waitInterface(vmNetIf, 30*time.Second)
	if err != nil {
		return err
	}
	bits := n.Addr.Bits()
	addr := n.Addr.Addr().As4()
	ifa := make([]byte, unix.SizeofIfAddrmsg)
	ifa[0], ifa[1] = unix.AF_INET, byte(bits)
	ifa[3] = unix.RT_SCOPE_UNIVERSE
	binary.NativeEndian.PutUint32(ifa[4:], uint32(ifc.Index))
	ifa = rtattr(ifa, unix.IFA_LOCAL, addr[:])
	ifa = rtattr(ifa, unix.IFA_ADDRESS, addr[:])
	if err := rtnetlink(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, ifa); err != nil {
		return fmt.Errorf("address %s on %s: %w", n.Addr, vmNetIf, err)
	}
	if err := linkUp(vmNetIf); err != nil {
		return fmt.Errorf("bring up %s: %w", vmNetIf, err)
	}
	gw := n.Gateway.As4()
	rt := make([]byte, unix.SizeofRtMsg)
	rt[0] = unix.AF_INET // dst_len 0: the default route
	rt[4], rt[5], rt[6], rt[7] = unix.RT_TABLE_MAIN, unix.RTPROT_BOOT, unix.RT_SCOPE_UNIVERSE, unix.RTN_UNICAST
	rt = rtattr(rt, unix.RTA_GATEWAY, gw[:])
	oif := make([]byte, 4)
	binary.NativeEndian.PutUint32(oif, uint32(ifc.Index))
	rt = rtattr(rt, unix.RTA_OIF, oif)
	if err := rtnetlink(unix.RTM_NEWROUTE, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, rt); err != nil {
		return fmt.Errorf("default route via %s: %w", n.Gateway, err)
	}
	if len(n.DNS) > 0 {
		var conf strings.Builder
		for _, d := range n.DNS {
			fmt.Fprintf(&conf, "nameserver %s\n", d)
		}
		conf.WriteString("options edns0\n")
		if err := resolvConf(conf.String()); err != nil {
			return err
		}
	}
	log.Info("vm init: network", "if", vmNetIf, "addr", n.Addr, "gateway", n.Gateway, "dns", n.DNS)
	return nil
}

// vmResolvConf is the file mounted over /etc/resolv.conf.
const vmResolvConf = "/run/airlock/resolv.conf"

// resolvConf makes /etc/resolv.conf a read-only bind mount of a file with
// content, as gVisor's is. (The guest's root can unmount it; it gains
// nothing by that: every DNS query, to any address, goes to the gateway.)
func resolvConf(content string) error {
	if err := os.MkdirAll("/run/airlock", 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(vmResolvConf, []byte(content), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", vmResolvConf, err)
	}
	// Whatever the template has there (a file, a symlink into
	// /run/systemd) becomes an empty file to mount over.
	os.Remove("/etc/resolv.conf")
	if err := os.WriteFile("/etc/resolv.conf", nil, 0o644); err != nil {
		return fmt.Errorf("create /etc/resolv.conf: %w", err)
	}
	if err := unix.Mount(vmResolvConf, "/etc/resolv.conf", "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("mount /etc/resolv.conf: %w", err)
	}
	if err := unix.Mount("", "/etc/resolv.conf", "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /etc/resolv.conf read-only: %w", err)
	}
	return nil
}

// waitInterface waits for the kernel to register interface name (the
// virtio-net driver probes its device when its module is loaded).
func waitInterface(name string, timeout time.Duration) (*net.Interface, error) {
	deadline := time.Now().Add(timeout)
	for {
		ifc, err := net.InterfaceByName(name)
		if err == nil {
			return ifc, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("wait for %s: %w", name, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// rtattr appends a route attribute to b.
func rtattr(b []byte, typ uint16, data []byte) []byte {
	h := make([]byte, unix.SizeofRtAttr)
	binary.NativeEndian.PutUint16(h[0:], uint16(unix.SizeofRtAttr+len(data)))
	binary.NativeEndian.PutUint16(h[2:], typ)
	b = append(append(b, h...), data...)
	for len(b)%unix.NLMSG_ALIGNTO != 0 {
		b = append(b, 0)
	}
	return b
}

// rtnetlink sends one request and waits for its acknowledgement.
func rtnetlink(typ uint16, flags uint16, payload []byte) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return os.NewSyscallError("socket", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return os.NewSyscallError("bind", err)
	}
	msg := make([]byte, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr+len(payload))
	binary.NativeEndian.PutUint32(msg[0:], uint32(unix.SizeofNlMsghdr+len(payload)))
	binary.NativeEndian.PutUint16(msg[4:], typ)
	binary.NativeEndian.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK|flags)
	binary.NativeEndian.PutUint32(msg[8:], 1) // seq
	msg = append(msg, payload...)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return os.NewSyscallError("sendto", err)
	}
	buf := make([]byte, 8192)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return os.NewSyscallError("recvfrom", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Seq != 1 || m.Header.Type != unix.NLMSG_ERROR || len(m.Data) < 4 {
				continue
			}
			if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 {
				return unix.Errno(-code)
			}
			return nil
		}
	}
}
