package qemu_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/network"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/qemu"
)

// standInGateway serves a sandbox's gateway listeners (network.OpenGateway)
// as the egress gateway's stand-in: every redirected TCP connection gets
// one line naming where it came from and where it was sent, every DNS
// query the answer "dns-ok".
func standInGateway(t *testing.T, id string, cfg network.Config) {
	t.Helper()
	ls, err := network.OpenGateway(id, cfg)
	if err != nil {
		t.Fatalf("open the gateway's listeners: %v", err)
	}
	t.Cleanup(func() { ls.Close() })
	go func() {
		for {
			c, err := ls.Proxy.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "gateway from=%s to=%s\n", c.RemoteAddr(), originalDst(c))
			c.Close()
		}
	}()
	go func() {
		buf := make([]byte, 512)
		for {
			_, from, err := ls.DNS.ReadFrom(buf)
			if err != nil {
				return
			}
			ls.DNS.WriteTo([]byte("dns-ok"), from)
		}
	}()
}

// originalDst is a redirected connection's destination (SO_ORIGINAL_DST).
func originalDst(c net.Conn) string {
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return err.Error()
	}
	var out string
	raw.Control(func(fd uintptr) {
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			out = err.Error()
			return
		}
		b := m.Multiaddr
		out = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), binary.BigEndian.Uint16(b[2:4])).String()
	})
	return out
}

// guestEgress checks, from inside the guest, the network it configured
// and that TCP and DNS reach the gateway.
func guestEgress(t *testing.T, c *agentclient.Client, when string) {
	t.Helper()
	out, code := run(t, c, "sh", "-c", `cat /etc/resolv.conf; cat /sys/class/net/eth0/address; echo ipv6off=$(cat /proc/sys/net/ipv6/conf/all/disable_ipv6); `+
		`awk '$2 == "00000000" { print "default", $1, $3 }' /proc/net/route; `+
		`timeout 20 bash -c 'exec 3<>/dev/tcp/198.18.7.7/80; head -1 <&3'; echo tcp=$?; `+
		`timeout 20 bash -c 'exec 3<>/dev/udp/8.8.8.8/53; printf q >&3; head -c 6 <&3'; echo; echo dns=$?`)
	t.Logf("%s: guest (exit %d):\n%s", when, code, out)
	for _, want := range []string{
		"nameserver 100.64.0.1\n",
		network.GuestMAC + "\n",
		"ipv6off=1\n",
		"default eth0 01004064\n", // via 100.64.0.1, little-endian hex
		"gateway from=100.64.0.2:", " to=198.18.7.7:80\n", "tcp=0\n",
		"dns-ok\ndns=0\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("%s: the guest's output lacks %q", when, want)
		}
	}
}

// TestEgressVM: a VM on an egress network (network.Config.Egress) gets
// its address, route and resolver at boot, reaches the gateway's
// listeners (TCP to any address, DNS to any resolver) from its own
// address, and after a suspend and a wake under another id (as on another
// worker: new namespaces, same addresses and MACs) reaches them again at
// once. Delete leaves no namespace.
func TestEgressVM(t *testing.T) {
	f := fixture(t, qemu.AccelTCG)
	cfg := network.Config{Egress: true}
	f.d = &netDriver{Driver: f.d.Driver, cfg: cfg}
	id, _, c := start(t, f)
	if !network.HasGateway(id) {
		t.Fatal("the sandbox has no gateway namespace")
	}
	standInGateway(t, id, cfg)
	guestEgress(t, c, "boot")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	snap := t.TempDir()
	if err := f.d.Checkpoint(ctx, id, snap, false); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	c.Close()
	if err := f.d.Delete(ctx, id); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	for _, p := range []string{network.Path(id), network.GatewayPath(id)} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s remains after Delete", p)
		}
	}

	id2 := id + "-w"
	sb, err := f.d.Restore(ctx, runtime.Spec{ID: id2, RootFS: f.rootfs}, snap)
	if err != nil {
		t.Fatalf("Restore under %s: %v", id2, err)
	}
	t.Cleanup(func() {
		sb.Close()
		if err := f.d.Delete(context.Background(), id2); err != nil {
			t.Errorf("Delete: %v", err)
		}
		for _, p := range []string{network.Path(id2), network.GatewayPath(id2)} {
			if _, err := os.Lstat(p); err == nil {
				t.Errorf("%s remains after Delete", p)
			}
		}
	})
	standInGateway(t, id2, cfg)
	c2 := newClient(sb)
	defer c2.Close()
	if err := c2.WaitReady(ctx); err != nil {
		serial, _ := os.ReadFile(filepath.Join(f.run, id2, "serial.log"))
		t.Fatalf("agent after wake: %v\nserial:\n%s", err, serial)
	}
	guestEgress(t, c2, "after wake under another id")

	// An isolated network cannot take this guest: it believes in a link
	// that network does not have.
	iso := &netDriver{Driver: f.d.Driver}
	if _, err := iso.Restore(ctx, runtime.Spec{ID: id + "-iso", RootFS: f.rootfs}, snap); err == nil {
		iso.Delete(context.Background(), id+"-iso")
		t.Error("a snapshot taken on an egress network restored into an isolated one")
	} else {
		t.Logf("restore into an isolated network: %v", err)
	}
}

// TestEgressVMFailedStart: a start that fails on an egress network (here
// the template has no agent) leaves neither namespace behind, as the
// worker's withNetwork does it: Setup, the driver's Start, Release.
func TestEgressVMFailedStart(t *testing.T) {
	f := fixture(t, qemu.AccelTCG)
	d := &netDriver{Driver: f.d.Driver, cfg: network.Config{Egress: true}}
	id := "sb-egress-failed"
	if _, err := d.Start(context.Background(), runtime.Spec{ID: id, RootFS: t.TempDir()}); err == nil {
		d.Delete(context.Background(), id)
		t.Fatal("Start of a template without an agent succeeded")
	}
	for _, p := range []string{network.Path(id), network.GatewayPath(id)} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s remains after a failed Start", p)
		}
	}
	if ids, _ := f.d.List(context.Background()); len(ids) != 0 {
		t.Errorf("a failed Start left %v", ids)
	}
}
