package network

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime"
)

// UDP other than DNS: the gateway namespace's filter hands every other
// datagram of the guest to one transparent socket (nftables tproxy to
// UDPPort, with a policy route delivering the marked packets locally),
// which learns each datagram's original destination (IP_RECVORIGDSTADDR)
// — internal/egress judges and relays it. A reply goes back to the guest
// from a socket bound to that destination (IP_TRANSPARENT lets it bind an
// address that is not the namespace's), made in the gateway namespace on
// first use and kept while the destination is in use.

// UDPPort is the gateway's transparent UDP listener (tproxy target).
const UDPPort = 15002

// tproxyMark marks the guest's tproxied UDP for the policy route
// (tproxyTable: every address is local) that delivers it to UDPPort.
const (
	tproxyMark  = 0x1
	tproxyTable = 100
)

// maxReplySockets bounds the reply sockets of one sandbox (the gateway
// bounds its flows below it).
const maxReplySockets = 512

// UDPRelay is the gateway end of a sandbox's UDP: an egress.UDPRelay.
type UDPRelay struct {
	ns string       // the gateway namespace's path
	l  *net.UDPConn // IPv4
	l6 *net.UDPConn // IPv6 (open6; nil without IPv6 on the link)

	start sync.Once
	in    chan datagram
	done  chan struct{}

	mu      sync.Mutex
	replies map[netip.AddrPort]*net.UDPConn
	closed  bool
}

type datagram struct {
	b        []byte
	src, dst netip.AddrPort
	err      error
}

// openUDPRelay opens the transparent listener on addr:UDPPort in the
// current thread's namespace (inside Do).
func openUDPRelay(ns string, addr netip.Addr) (*UDPRelay, error) {
	fd, err := transparentSocket(netip.AddrPortFrom(addr, UDPPort), true)
	if err != nil {
		return nil, err
	}
	c, err := fileConn(fd, "udp-tproxy")
	if err != nil {
		return nil, err
	}
	return &UDPRelay{ns: ns, l: c, replies: map[netip.AddrPort]*net.UDPConn{}, in: make(chan datagram, 64), done: make(chan struct{})}, nil
}

// open6 adds the IPv6 transparent listener on addr:UDPPort (inside Do,
// before the first ReadFrom).
func (r *UDPRelay) open6(addr netip.Addr) error {
	fd, err := transparentSocket(netip.AddrPortFrom(addr, UDPPort), true)
	if err != nil {
		return err
	}
	c, err := fileConn(fd, "udp6-tproxy")
	if err != nil {
		return err
	}
	r.l6 = c
	return nil
}

// transparentSocket is a UDP socket with IP_TRANSPARENT bound to a
// (whichever namespace the calling thread is in); orig also asks for
// each datagram's original destination.
func transparentSocket(a netip.AddrPort, orig bool) (int, error) {
	family, level, transparent, recvOrig := unix.AF_INET, unix.SOL_IP, unix.IP_TRANSPARENT, unix.IP_RECVORIGDSTADDR
	if a.Addr().Is6() {
		family, level, transparent, recvOrig = unix.AF_INET6, unix.SOL_IPV6, unix.IPV6_TRANSPARENT, unix.IPV6_RECVORIGDSTADDR
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return -1, err
	}
	opts := [][2]int{{unix.SOL_SOCKET, unix.SO_REUSEADDR}, {level, transparent}}
	if orig {
		opts = append(opts, [2]int{level, recvOrig})
	}
	if family == unix.AF_INET6 {
		opts = append(opts, [2]int{unix.IPPROTO_IPV6, unix.IPV6_V6ONLY})
	}
	for _, o := range opts {
		if err := unix.SetsockoptInt(fd, o[0], o[1], 1); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("setsockopt %d/%d: %w", o[0], o[1], err)
		}
	}
	var sa unix.Sockaddr
	if family == unix.AF_INET6 {
		sa = &unix.SockaddrInet6{Port: int(a.Port()), Addr: a.Addr().As16()}
	} else {
		sa = &unix.SockaddrInet4{Port: int(a.Port()), Addr: a.Addr().As4()}
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind %v: %w", a, err)
	}
	return fd, nil
}

func fileConn(fd int, name string) (*net.UDPConn, error) {
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	pc, err := net.FilePacketConn(f)
	if err != nil {
		return nil, err
	}
	return pc.(*net.UDPConn), nil
}

// ReadFrom reads one datagram of the guest with its original
// destination, from the IPv4 or the IPv6 listener.
func (r *UDPRelay) ReadFrom(b []byte) (int, netip.AddrPort, netip.AddrPort, error) {
	r.start.Do(func() {
		ls := []*net.UDPConn{r.l}
		if r.l6 != nil {
			ls = append(ls, r.l6)
		}
		var wg sync.WaitGroup
		for _, l := range ls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.read(l)
			}()
		}
		go func() {
			wg.Wait()
			close(r.in)
		}()
	})
	d, ok := <-r.in
	if !ok {
		return 0, netip.AddrPort{}, netip.AddrPort{}, net.ErrClosed
	}
	if d.err != nil {
		return 0, netip.AddrPort{}, netip.AddrPort{}, d.err
	}
	return copy(b, d.b), d.src, d.dst, nil
}

// read feeds r.in from l until l fails (closed).
func (r *UDPRelay) read(l *net.UDPConn) {
	buf := make([]byte, 64<<10)
	oob := make([]byte, 128)
	for {
		n, oobn, _, src, err := l.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			select {
			case r.in <- datagram{err: err}:
			case <-r.done:
			}
			return
		}
		dst, ok := origDst(oob[:oobn])
		if !ok {
			continue // without its destination a datagram cannot be judged: drop it
		}
		d := datagram{b: append([]byte(nil), buf[:n]...), src: netip.AddrPortFrom(src.Addr().Unmap(), src.Port()), dst: dst}
		select {
		case r.in <- d:
		case <-r.done:
			return
		}
	}
}

// origDst finds IP_ORIGDSTADDR or IPV6_ORIGDSTADDR in a datagram's
// control messages.
func origDst(oob []byte) (netip.AddrPort, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return netip.AddrPort{}, false
	}
	for _, m := range msgs {
		switch {
		case m.Header.Level == unix.SOL_IP && m.Header.Type == unix.IP_ORIGDSTADDR && len(m.Data) >= unix.SizeofSockaddrInet4:
			// struct sockaddr_in: family, port (network order), address.
			port := binary.BigEndian.Uint16(m.Data[2:4])
			return netip.AddrPortFrom(netip.AddrFrom4([4]byte(m.Data[4:8])), port), true
		case m.Header.Level == unix.SOL_IPV6 && m.Header.Type == unix.IPV6_ORIGDSTADDR && len(m.Data) >= unix.SizeofSockaddrInet6:
			// struct sockaddr_in6: family, port, flowinfo, address.
			port := binary.BigEndian.Uint16(m.Data[2:4])
			return netip.AddrPortFrom(netip.AddrFrom16([16]byte(m.Data[8:24])).Unmap(), port), true
		}
	}
	return netip.AddrPort{}, false
}

// WriteFrom sends b to the guest's to from the address from.
func (r *UDPRelay) WriteFrom(b []byte, from, to netip.AddrPort) error {
	c, err := r.reply(from)
	if err != nil {
		return err
	}
	_, err = c.WriteToUDPAddrPort(b, to)
	return err
}

func (r *UDPRelay) reply(from netip.AddrPort) (*net.UDPConn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, net.ErrClosed
	}
	if c := r.replies[from]; c != nil {
		return c, nil
	}
	if len(r.replies) >= maxReplySockets {
		for a, c := range r.replies { // drop any one: flows come and go
			c.Close()
			delete(r.replies, a)
			break
		}
	}
	var c *net.UDPConn
	err := Do(r.ns, func() error {
		fd, err := transparentSocket(from, false)
		if err != nil {
			return err
		}
		c, err = fileConn(fd, "udp-reply")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("network: reply socket for %v: %w", from, err)
	}
	r.replies[from] = c
	return c, nil
}

// Close closes the listener and the reply sockets.
func (r *UDPRelay) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	cs := r.replies
	r.replies = nil
	r.mu.Unlock()
	close(r.done)
	err := r.l.Close()
	if r.l6 != nil {
		r.l6.Close()
	}
	for _, c := range cs {
		c.Close()
	}
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// tproxyRoute makes every address local to packets marked tproxyMark in
// the calling thread's namespace (the gateway's), so that the guest's
// tproxied UDP, whatever its destination, is delivered to UDPPort.
func tproxyRoute(v6 bool) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	type fam struct {
		af  int
		dst *net.IPNet
	}
	fams := []fam{{unix.AF_INET, &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}}}
	if v6 {
		fams = append(fams, fam{unix.AF_INET6, &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}})
	}
	for _, f := range fams {
		rt := &netlink.Route{LinkIndex: lo.Attrs().Index, Table: tproxyTable, Type: unix.RTN_LOCAL,
			Scope: netlink.SCOPE_HOST, Dst: f.dst, Family: f.af}
		if err := netlink.RouteAdd(rt); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("tproxy route (family %d): %w", f.af, err)
		}
		rule := netlink.NewRule()
		rule.Family = f.af
		rule.Mark = tproxyMark
		rule.Table = tproxyTable
		if err := netlink.RuleAdd(rule); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("tproxy rule (family %d): %w", f.af, err)
		}
	}
	return nil
}

// udpFilter adds the UDP rules to the gateway namespace's table: a
// mangle-priority prerouting chain that marks the guest's UDP other than
// DNS and hands it to UDPPort (tproxy), and the input rule admitting it.
func udpFilter(c *nftables.Conn, t *nftables.Table, input *nftables.Chain, fromGuest []expr.Any, v6 bool) {
	accept := nftables.ChainPolicyAccept
	tp := c.AddChain(&nftables.Chain{Name: "tproxy", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityMangle, Policy: &accept})
	notDNS := []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.BigEndian.PutUint16(DNSPort)},
	}
	fams := []struct {
		nfproto byte
		family  nftables.TableFamily
	}{{unix.NFPROTO_IPV4, nftables.TableFamilyIPv4}}
	if v6 {
		fams = append(fams, struct {
			nfproto byte
			family  nftables.TableFamily
		}{unix.NFPROTO_IPV6, nftables.TableFamilyIPv6})
	}
	for _, f := range fams {
		isFam := []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{f.nfproto}}}
		c.AddRule(&nftables.Rule{Table: t, Chain: tp, Exprs: cat(fromGuest, isFam, l4proto(unix.IPPROTO_UDP), notDNS, []expr.Any{
			&expr.Immediate{Register: 1, Data: binaryutil.NativeEndian.PutUint32(tproxyMark)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
			&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(UDPPort)},
			&expr.TProxy{Family: byte(f.family), TableFamily: byte(nftables.TableFamilyINet), RegPort: 2},
			&expr.Verdict{Kind: expr.VerdictAccept},
		})})
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: cat(fromGuest, l4proto(unix.IPPROTO_UDP), []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(tproxyMark)},
		&expr.Verdict{Kind: expr.VerdictAccept},
	})})
}

// ProbeEgress makes and removes a throwaway egress network (namespaces,
// veth, nftables with tproxy, the policy route, the gateway's sockets), to
// tell at start whether this machine can give sandboxes egress at all
// (root, network namespaces, nftables): nil if it can.
func ProbeEgress(ctx context.Context, cfg Config) error {
	id := model.NewID("probe")
	if _, err := Setup(ctx, id, runtime.Caps{}, cfg); err != nil {
		return err
	}
	ls, err := OpenGateway(id, cfg)
	if err == nil {
		ls.Close()
	}
	return errors.Join(err, Release(context.WithoutCancel(ctx), id))
}
