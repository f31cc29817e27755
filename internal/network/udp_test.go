package network_test

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/network"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/testenv"
)

// TestEgressUDPRelay: the guest's UDP other than DNS, to any address,
// reaches the gateway's transparent relay with its original destination,
// and the relay's reply reaches the guest from that destination; DNS still
// goes to the DNS listener.
func TestEgressUDPRelay(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces, veths, nftables tproxy")
	ctx := context.Background()
	id := model.NewID("sb")
	cfg := network.Config{Egress: true}
	t.Cleanup(func() { network.Release(ctx, id) })
	n, err := network.Setup(ctx, id, runtime.Caps{Pause: true}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := network.OpenGateway(id, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	if ls.UDP == nil {
		t.Fatal("no UDP relay")
	}
	type got struct{ src, dst netip.AddrPort }
	seen := make(chan got, 8)
	go func() {
		buf := make([]byte, 2048)
		for {
			n, src, dst, err := ls.UDP.ReadFrom(buf)
			if err != nil {
				return
			}
			seen <- got{src, dst}
			ls.UDP.WriteFrom(append([]byte("reply:"), buf[:n]...), dst, src)
		}
	}()
	dnsSeen := make(chan struct{}, 4)
	go func() {
		buf := make([]byte, 512)
		for {
			if _, _, err := ls.DNS.ReadFrom(buf); err != nil {
				return
			}
			dnsSeen <- struct{}{}
		}
	}()

	for _, dst := range []netip.AddrPort{netip.MustParseAddrPort("198.18.5.5:9999"), netip.MustParseAddrPort("203.0.113.7:443")} {
		var reply string
		var from netip.AddrPort
		err := network.Do(n.Namespace, func() error {
			c, err := net.ListenUDP("udp4", nil)
			if err != nil {
				return err
			}
			defer c.Close()
			if _, err := c.WriteToUDPAddrPort([]byte("hi"), dst); err != nil {
				return err
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second)) // a safety net, not a timed assertion
			buf := make([]byte, 64)
			k, f, err := c.ReadFromUDPAddrPort(buf)
			reply, from = string(buf[:k]), f
			return err
		})
		if err != nil {
			t.Fatalf("udp to %v from the guest: %v", dst, err)
		}
		g := <-seen
		if g.dst != dst || g.src.Addr() != network.DefaultLink.Guest.Addr() {
			t.Errorf("relay saw %v → %v, want the guest → %v", g.src, g.dst, dst)
		}
		if reply != "reply:hi" || netip.AddrPortFrom(from.Addr().Unmap(), from.Port()) != dst {
			t.Errorf("guest got %q from %v, want reply:hi from %v", reply, from, dst)
		}
	}
	// DNS is still the resolver's.
	err = network.Do(n.Namespace, func() error {
		c, err := net.Dial("udp4", "8.8.8.8:53")
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("q"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-dnsSeen:
	case g := <-seen:
		t.Fatalf("DNS went to the UDP relay: %+v", g)
	case <-time.After(5 * time.Second):
		t.Fatal("DNS never reached the resolver")
	}
}

// TestEgressCustomLink: a link other than DefaultLink (--sandbox-cidr)
// carries the guest's TCP to the proxy from the guest's address.
func TestEgressCustomLink(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces, veths and nftables")
	ctx := context.Background()
	id := model.NewID("sb")
	l := network.Link{Guest: netip.MustParsePrefix("10.200.0.10/29"), Gateway: netip.MustParseAddr("10.200.0.9")}
	cfg := network.Config{Egress: true, Link: l}
	t.Cleanup(func() { network.Release(ctx, id) })
	n, err := network.Setup(ctx, id, runtime.Caps{Pause: true}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n.Gateway != l.Gateway || n.Interfaces[0].Addresses[0] != l.Guest || n.Nameservers[0] != l.Gateway {
		t.Fatalf("network %+v, want the link %+v", n, l)
	}
	ls, err := network.OpenGateway(id, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ls.Proxy.Accept(); err == nil {
			accepted <- c
		}
	}()
	err = network.Do(n.Namespace, func() error {
		c, err := net.DialTimeout("tcp4", "198.18.5.5:443", 5*time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	c := <-accepted
	defer c.Close()
	if from := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr(); from != l.Guest.Addr() {
		t.Fatalf("from %v, want the guest's %v", from, l.Guest.Addr())
	}
}
