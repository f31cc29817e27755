package egresstest_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"

	"github.com/airlock/airlock/internal/egress/egresstest"
)

// TestInternet: from the host, the test internet's DNS answers its
// names, its HTTP and HTTPS servers answer on every address (HTTPS
// trusted through CAFile), git clones its repository over dumb HTTP, and
// Close leaves no namespace or veth behind.
func TestInternet(t *testing.T) {
	in := egresstest.Start(t, egresstest.Config{})
	t.Logf("internet %s on %s (host side %s), DNS %s", in.Netns, in.Prefix, in.HostIf, in.DNS)

	c := new(dns.Client)
	for name, want := range map[string]string{egresstest.WWW: in.Addr(2).String(), egresstest.B: in.Addr(3).String(), egresstest.Rebind: "10.0.0.1"} {
		m := new(dns.Msg).SetQuestion(egresstest.Name(name)+".", dns.TypeA)
		r, _, err := c.Exchange(m, in.DNS.String())
		if err != nil || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != want {
			t.Errorf("A %s: %v %v, want %s", name, r, err, want)
		}
	}
	m := new(dns.Msg).SetQuestion(egresstest.Name(egresstest.Missing)+".", dns.TypeA)
	if r, _, err := c.Exchange(m, in.DNS.String()); err != nil || r.Rcode != dns.RcodeNameError {
		t.Errorf("missing name: %v %v", r, err)
	}

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(in.CAPEM)
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	// Names of the zone go to a's address (the host does not resolve them).
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, port, _ := net.SplitHostPort(addr)
			if strings.HasSuffix(host, ".test.airlock") {
				host = in.Addr(3).String()
			}
			return dialer.DialContext(ctx, network, net.JoinHostPort(host, port))
		},
	}}
	for _, u := range []string{"http://" + in.Addr(2).String() + "/x", "https://" + egresstest.Name(egresstest.A) + "/y"} {
		resp, err := hc.Get(u)
		if err != nil {
			t.Fatalf("GET %s: %v", u, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasPrefix(string(b), "airlock-inet ") {
			t.Errorf("GET %s: %d %q", u, resp.StatusCode, b)
		}
	}
	reqs := in.Requests()
	if len(reqs) != 2 || reqs[1].SNI != egresstest.Name(egresstest.A) || reqs[1].Local.Addr() != in.Addr(3) || reqs[0].Path != "/x" {
		t.Errorf("requests %+v", reqs)
	}

	if in.GitRepo == "" {
		t.Logf("SKIPPED git: %s", in.GitReason)
	} else {
		dst := filepath.Join(t.TempDir(), "clone")
		out, err := exec.Command("git", "clone", "-q", "http://"+in.Addr(2).String()+in.GitRepo, dst).CombinedOutput()
		if err != nil {
			t.Fatalf("git clone: %v: %s", err, out)
		}
		head, _ := exec.Command("git", "-C", dst, "rev-parse", "HEAD").Output()
		if strings.TrimSpace(string(head)) != in.GitHead {
			t.Errorf("cloned HEAD %q, want %s", head, in.GitHead)
		}
	}

	pc, err := net.Dial("udp4", netip.AddrPortFrom(in.Addr(5), 9999).String())
	if err != nil {
		t.Fatal(err)
	}
	pc.Write([]byte("x"))
	pc.Close()
	deadline := time.Now().Add(5 * time.Second)
	for in.UDPSeen()[netip.MustParseAddrPort("0.0.0.0:9999")] == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := in.UDPSeen()[netip.MustParseAddrPort("0.0.0.0:9999")]; n != 1 {
		t.Errorf("udp sink saw %d datagrams, want 1 (%v)", n, in.UDPSeen())
	}

	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/run/netns/" + in.Netns); err == nil {
		t.Errorf("namespace %s left behind", in.Netns)
	}
	if h, err := netns.GetFromName(in.Netns); err == nil {
		h.Close()
		t.Errorf("namespace %s still opens", in.Netns)
	}
	if _, err := net.InterfaceByName(in.HostIf); err == nil {
		t.Errorf("veth %s left behind", in.HostIf)
	}
}

// TestInternetIPv6: from the host, six.test.airlock's AAAA is the
// internet's Addr6(2), and its HTTP and HTTPS servers answer on it.
func TestInternetIPv6(t *testing.T) {
	in := egresstest.Start(t, egresstest.Config{})
	if !in.Prefix6.IsValid() {
		t.Skipf("no IPv6 on the test internet's link: %s", in.IPv6Reason)
	}
	m := new(dns.Msg).SetQuestion(egresstest.Name(egresstest.Six)+".", dns.TypeAAAA)
	r, _, err := new(dns.Client).Exchange(m, in.DNS.String())
	if err != nil || len(r.Answer) != 1 || r.Answer[0].(*dns.AAAA).AAAA.String() != in.Addr6(2).String() {
		t.Fatalf("AAAA %s: %v %v, want %s", egresstest.Six, r, err, in.Addr6(2))
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(in.CAPEM)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	host := "[" + in.Addr6(2).String() + "]"
	for _, u := range []string{"http://" + host + "/six", "https://" + host + "/six"} {
		resp, err := hc.Get(u)
		if err != nil {
			t.Fatalf("GET %s: %v", u, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasPrefix(string(b), "airlock-inet ") {
			t.Errorf("GET %s: %d %q", u, resp.StatusCode, b)
		}
	}
	reqs := in.Requests()
	if len(reqs) != 2 || reqs[0].Local.Addr() != in.Addr6(2) || !reqs[1].TLS {
		t.Errorf("requests %+v", reqs)
	}
	echo := netip.AddrPortFrom(in.Addr6(2), egresstest.EchoPort)
	u, err := net.Dial("udp6", echo.String())
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	u.SetDeadline(time.Now().Add(5 * time.Second)) // a safety net
	u.Write([]byte("ping"))
	buf := make([]byte, 64)
	if n, err := u.Read(buf); err != nil || string(buf[:n]) != "echo:ping" || in.UDPSeen()[echo] != 1 {
		t.Errorf("UDP echo on %s: %q %v, seen %d", echo, buf[:n], err, in.UDPSeen()[echo])
	}
}
