package gvisor_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/egress"
	"github.com/airlock/airlock/internal/network"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/gvisor"
	"github.com/airlock/airlock/internal/runtime/runtimetest"
)

// TestNetworkFromSpec: gvisor takes its network from the spec. Without
// egress internal/network hands it the zero Network (loopback only: the
// conformance suite's NetworkLoopbackOnly).
func TestNetworkFromSpec(t *testing.T) {
	ctx := context.Background()
	id := runtimetest.NewID()
	n, err := network.Setup(ctx, id, gvisor.Info.Caps, network.Config{})
	if err != nil || n.Namespace != "" || len(n.Interfaces) != 0 {
		t.Fatalf("network for gvisor = %+v, %v; want the zero Network", n, err)
	}
}

// TestEgressNetwork: with an egress network gvisor joins its namespace
// (--network=sandbox): the guest's eth0 has the link's address and route,
// its resolv.conf names the gateway, and a connection to any address lands
// on the gateway's proxy listener with its original destination.
func TestEgressNetwork(t *testing.T) {
	d, rootfs, _ := fixture(t)
	ctx := context.Background()
	id := runtimetest.NewID()
	cfg := network.Config{Egress: true}
	t.Cleanup(func() { d.Delete(ctx, id); network.Release(ctx, id) })
	n, err := network.Setup(ctx, id, gvisor.Info.Caps, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := network.OpenGateway(id, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	go func() { // a stand-in proxy: answers with the original destination
		for {
			c, err := ls.Proxy.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				dst, err := egress.OriginalDst(c)
				req, rerr := http.ReadRequest(bufio.NewReader(c))
				if rerr == nil {
					req.Body.Close()
				}
				body := fmt.Sprintf("dst=%v err=%v", dst, err)
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
			}()
		}
	}()
	sb, err := d.Start(ctx, runtime.Spec{ID: id, RootFS: rootfs, VCPUs: 1, MemoryMiB: 256, Network: n})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
	defer c.Close()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	out, code := runtimetest.RunRoot(ctx, t, c, "p1", "/bin/sh", "-c",
		"cat /etc/resolv.conf; cat /proc/net/route | tail -n +2 | cut -f1-3; curl -sS -m 10 http://198.18.7.7:8080/x")
	if code != 0 {
		t.Fatalf("guest: exit %d: %s", code, out)
	}
	for _, want := range []string{"nameserver 100.64.0.1", "eth0\t00000000\t01004064", "dst=198.18.7.7:8080 err=<nil>"} {
		if !strings.Contains(out, want) {
			t.Errorf("guest output lacks %q:\n%s", want, out)
		}
	}
}

// TestEgressNetworkIPv6: with IPv6 on the egress link (Config.IPv6) the
// guest's netstack takes eth0's IPv6 address and ::/0 route too: an IPv6
// connection lands on the gateway's IPv6 proxy listener with its original
// destination, and still does after a checkpoint that leaves the sandbox
// running (the in-place restore puts the IPv6 address and route back).
func TestEgressNetworkIPv6(t *testing.T) {
	d, rootfs, _ := fixture(t)
	ctx := context.Background()
	id := runtimetest.NewID()
	cfg := network.Config{Egress: true, IPv6: true}
	t.Cleanup(func() { d.Delete(ctx, id); network.Release(ctx, id) })
	n, err := network.Setup(ctx, id, gvisor.Info.Caps, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := network.OpenGateway(id, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	if ls.Proxy6 == nil {
		t.Fatal("no IPv6 proxy listener")
	}
	go func() { // a stand-in proxy: answers with the original destination
		for {
			c, err := ls.Proxy6.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				dst, err := egress.OriginalDst(c)
				req, rerr := http.ReadRequest(bufio.NewReader(c))
				if rerr == nil {
					req.Body.Close()
				}
				body := fmt.Sprintf("dst=%v from=%v err=%v", dst, c.RemoteAddr(), err)
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
			}()
		}
	}()
	sb, err := d.Start(ctx, runtime.Spec{ID: id, RootFS: rootfs, VCPUs: 1, MemoryMiB: 256, Network: n})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
	defer c.Close()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		out, code := runtimetest.RunRoot(ctx, t, c, "p-"+when, "/bin/sh", "-c",
			"cat /proc/net/if_inet6; curl -sS -6 -m 10 'http://[2001:db8:7::7]:8080/x'")
		if code != 0 {
			t.Fatalf("guest (%s): exit %d: %s", when, code, out)
		}
		for _, want := range []string{"fd000064000000000000000000000002", "dst=[2001:db8:7::7]:8080 from=[fd00:64::2]:"} {
			if !strings.Contains(out, want) {
				t.Errorf("guest output (%s) lacks %q:\n%s", when, want, out)
			}
		}
	}
	check("start")
	dir := t.TempDir()
	if err := d.Checkpoint(ctx, id, dir, true); err != nil {
		t.Fatal(err)
	}
	c.Close()
	c = agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	check("restored")
}
