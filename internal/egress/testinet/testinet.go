// Package testinet is a small "internet" of a test's own, for the
// egress suites (internal/e2e's egress tests, internal/redteam, through
// the testing wrapper internal/egress/egresstest) and the egress benchmark
// (internal/bench/egressbench, which the airlock binary links: so this
// package does not import testing): a network namespace airlock-inet-<random> joined to the host by one veth,
// on a /24 of the benchmark range 198.18.0.0/15 (RFC 2544, reserved for
// tests: the host side is .1, the namespace side .2 with .3–.9 as extra
// addresses on the same link for distinct services) and, when the host
// has IPv6, on a /64 of the documentation range 2001:db8::/32 (Prefix6:
// 2001:db8:<n>::/64 for the n-th /24, so the first internet's is
// 2001:db8::/64; the host side ::1, the namespace ::2 to ::9, Addr6),
// holding
//
//   - an HTTP server (port 80 on every address, IPv4 and IPv6) that answers who it is,
//     and serves a git "dumb HTTP" repository under /git/ when git is
//     installed;
//   - an HTTPS server (port 443 on every address, IPv4 and IPv6) with a certificate for
//     *.test.airlock and every address, signed by a CA generated for the
//     run (CAFile), HTTP/2 and HTTP/1.1 — but on Addr(8) (BadTLS) a
//     self-signed certificate nobody trusts;
//   - an authoritative DNS server (github.com/miekg/dns) for the zone
//     test.airlock. on .2:53, UDP and TCP: the address to give the
//     gateway as its upstream (--egress-resolver);
//   - UDP sinks on ports 53 of .3, 443 and 9999 of every address, which
//     count what arrives (nothing should), and a UDP echo on port 7
//     (EchoPort) of every address (IPv6 ones too), for UDP rules.
//
// Every server records what reached it (Requests, UDPSeen), so a test can
// check that a denied attempt never arrived. Nothing is routed beyond the
// link: the namespace has no default route, and the host reaches it only
// through the /24 on its side of the veth. Close removes all of it.
//
// The sockets are opened on a thread that entered the namespace; the
// servers run on ordinary goroutines (a socket stays in the namespace it
// was made in). Creating a namespace needs root (egresstest.Start skips
// the test otherwise, and in the fast tier).
package testinet

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/airlock/airlock/internal/network"
)

// Zone is the test internet's DNS zone.
const Zone = "test.airlock."

// EchoPort is the UDP echo (RFC 862) on every address: it answers each
// datagram with "echo:" and the datagram, and counts it in UDPSeen.
const EchoPort = 7

// Names of the default zone (Records), relative to Zone. Addr(i) is the
// i-th address of the namespace (2 to 9).
const (
	WWW     = "www"     // Addr(2): the HTTP, HTTPS and git server's main name
	A       = "a"       // Addr(3), shared with B: two names on one IP (shared-IP fronting)
	B       = "b"       // Addr(3)
	Other   = "other"   // Addr(4): another name on its own IP
	Rebind  = "rebind"  // 10.0.0.1: DNS rebinding to a private address
	Loop    = "loop"    // 127.0.0.1: rebinding to loopback
	Meta    = "meta"    // 169.254.169.254: rebinding to the metadata address
	HostN   = "host"    // the host's side of the veth (.1): rebinding to the host
	Six     = "six"     // AAAA Addr6(2) only (2001:db8::2 for the first internet, and without IPv6)
	Missing = "missing" // not in the zone: NXDOMAIN
	BadTLS  = "badtls"  // Addr(8): its HTTPS certificate is from a CA nobody trusts
	UDPN    = "udp"     // Addr(5): a name for UDP rules (the echo on port EchoPort)
)

// Config adjusts the internet. The zero Config is the default zone.
type Config struct {
	// Records adds or replaces A/AAAA records: name relative to Zone (or
	// absolute, ending in ".") → addresses.
	Records map[string][]netip.Addr
}

// Request is one HTTP request a server received.
type Request struct {
	Local  netip.AddrPort // the address it arrived on
	TLS    bool
	SNI    string // TLS server name (TLS only)
	Host   string
	Path   string
	Proto  string      // "HTTP/1.1", "HTTP/2.0"
	Header http.Header // as received
}

// Internet is a running test internet.
type Internet struct {
	Netns    string         // namespace name, airlock-inet-<random>
	HostIf   string         // the host side of the veth
	Prefix   netip.Prefix   // the /24 of the link
	HostAddr netip.Addr     // .1, on the host
	DNS      netip.AddrPort // the authoritative DNS server (.2:53)
	CAFile   string         // PEM of the CA that signed the HTTPS certificate
	CAPEM    []byte
	// GitRepo is the URL path of the dumb-HTTP git repository ("/git/repo.git",
	// on every address over http and https), "" without git; GitReason says why.
	GitRepo, GitReason string
	// GitHead is the commit of the repository's main branch.
	GitHead string

	// Prefix6 is the link's IPv6 /64 and HostAddr6 its ::1 on the host;
	// both invalid when the host has no IPv6 (IPv6Reason says why).
	Prefix6    netip.Prefix
	HostAddr6  netip.Addr
	IPv6Reason string

	dir       string
	cert      tls.Certificate
	badCert   tls.Certificate // Addr(8)'s: self-signed, trusted by nobody
	servers   []*http.Server
	dnsSrv    []*dns.Server
	closers   []func() error
	mu        sync.Mutex
	records   map[string][]netip.Addr // absolute lower-case name → addresses
	requests  []Request
	udpSeen   map[netip.AddrPort]int
	dnsSeen   []string // names asked
	closeOnce sync.Once
	closeErr  error
}

// Addr is the i-th address of the link (1 is the host's, 2–9 the
// namespace's).
func (in *Internet) Addr(i int) netip.Addr {
	b := in.Prefix.Addr().As4()
	b[3] = byte(i)
	return netip.AddrFrom4(b)
}

// Addr6 is the i-th IPv6 address of the link (1 is the host's, 2–9 the
// namespace's); 2001:db8::i without IPv6 on the link.
func (in *Internet) Addr6(i int) netip.Addr {
	b := netip.MustParseAddr("2001:db8::").As16()
	if in.Prefix6.IsValid() {
		b = in.Prefix6.Addr().As16()
	}
	b[15] = byte(i)
	return netip.AddrFrom16(b)
}

// Name is name (relative to Zone) as a fully qualified name without the
// trailing dot: "www" → "www.test.airlock".
func Name(name string) string { return strings.TrimSuffix(name+"."+Zone, ".") }

// New makes the internet (root only); Close removes it.
func New(cfg Config) (in *Internet, err error) {
	var rnd [3]byte
	rand.Read(rnd[:])
	tag := hex.EncodeToString(rnd[:])
	dir, err := os.MkdirTemp("", "airlock-inet-")
	if err != nil {
		return nil, err
	}
	in = &Internet{Netns: "airlock-inet-" + tag, HostIf: "ainet" + tag, dir: dir, udpSeen: map[netip.AddrPort]int{}}
	defer func() {
		if err != nil {
			in.Close()
			in = nil
		}
	}()
	// Allocation and creation under one host-wide lock, so concurrent test
	// binaries never pick the same /24.
	unlock, err := lockFile("/run/airlock-inet.lock")
	if err != nil {
		return nil, err
	}
	p, err := freePrefix()
	if err == nil {
		in.Prefix = p
		in.HostAddr = in.Addr(1)
		in.DNS = netip.AddrPortFrom(in.Addr(2), 53)
		in.prefix6()
		err = in.makeLink()
	}
	unlock()
	if err != nil {
		return nil, err
	}
	in.records = defaultRecords(in)
	for n, as := range cfg.Records {
		in.records[absName(n)] = as
	}
	if err := in.makePKI(); err != nil {
		return nil, err
	}
	in.makeGit()
	if err := in.serve(); err != nil {
		return nil, err
	}
	return in, nil
}

func defaultRecords(in *Internet) map[string][]netip.Addr {
	return map[string][]netip.Addr{
		absName(WWW):    {in.Addr(2)},
		absName(A):      {in.Addr(3)},
		absName(B):      {in.Addr(3)},
		absName(Other):  {in.Addr(4)},
		absName(BadTLS): {in.Addr(8)},
		absName(UDPN):   {in.Addr(5)},
		absName(Rebind): {netip.MustParseAddr("10.0.0.1")},
		absName(Loop):   {netip.MustParseAddr("127.0.0.1")},
		absName(Meta):   {netip.MustParseAddr("169.254.169.254")},
		absName(HostN):  {in.HostAddr},
		absName(Six):    {in.Addr6(2)},
	}
}

func absName(n string) string {
	n = strings.ToLower(n)
	if strings.HasSuffix(n, ".") {
		return n
	}
	return n + "." + Zone
}

// SetRecord replaces name's addresses (none: the name no longer exists).
func (in *Internet) SetRecord(name string, addrs ...netip.Addr) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if len(addrs) == 0 {
		delete(in.records, absName(name))
		return
	}
	in.records[absName(name)] = addrs
}

// Requests is every HTTP(S) request received so far.
func (in *Internet) Requests() []Request {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]Request(nil), in.requests...)
}

// UDPSeen is how many datagrams arrived on each UDP sink.
func (in *Internet) UDPSeen() map[netip.AddrPort]int {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := map[netip.AddrPort]int{}
	for k, v := range in.udpSeen {
		out[k] = v
	}
	return out
}

// DNSQueries is every name the DNS server was asked, in order (lower
// case, fully qualified).
func (in *Internet) DNSQueries() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]string(nil), in.dnsSeen...)
}

// URL is scheme://name path for a name relative to Zone.
func URL(scheme, name, path string) string { return scheme + "://" + Name(name) + path }

// freePrefix picks a /24 of 198.18.0.0/15 that no address or route of
// the host touches, starting with 198.18.0.0/24.
func freePrefix() (netip.Prefix, error) {
	used := map[netip.Prefix]bool{}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			used[netip.PrefixFrom(ip, 24).Masked()] = true
		}
	}
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("list routes: %w", err)
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		if ip, ok := netip.AddrFromSlice(r.Dst.IP.To4()); ok {
			used[netip.PrefixFrom(ip, 24).Masked()] = true
		}
	}
	for i := 0; i < 512; i++ {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18 + byte(i/256), byte(i % 256), 0}), 24)
		if !used[p] {
			return p, nil
		}
	}
	return netip.Prefix{}, errors.New("no free /24 in 198.18.0.0/15")
}

// prefix6 sets Prefix6 to the /64 of 2001:db8::/32 that goes with Prefix
// (2001:db8:<n>::/64 for the n-th /24 of 198.18.0.0/15), unless the host
// has no IPv6 or an address or route of the host touches it.
func (in *Internet) prefix6() {
	if b, err := os.ReadFile("/proc/sys/net/ipv6/conf/default/disable_ipv6"); err != nil || strings.TrimSpace(string(b)) != "0" {
		in.IPv6Reason = "IPv6 is disabled on this host"
		return
	}
	v4 := in.Prefix.Addr().As4()
	n := (int(v4[1])-18)*256 + int(v4[2])
	b := netip.MustParseAddr("2001:db8::").As16()
	b[4], b[5] = byte(n>>8), byte(n)
	p := netip.PrefixFrom(netip.AddrFrom16(b), 64)
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V6)
	if err != nil {
		in.IPv6Reason = "list IPv6 routes: " + err.Error()
		return
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		if ip, ok := netip.AddrFromSlice(r.Dst.IP); ok {
			ones, _ := r.Dst.Mask.Size()
			if q := netip.PrefixFrom(ip, ones); q.Bits() > 0 && q.Overlaps(p) {
				in.IPv6Reason = fmt.Sprintf("the host routes %s already", q)
				return
			}
		}
	}
	in.Prefix6 = p
	in.HostAddr6 = in.Addr6(1)
}

func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// inNetns runs fn on a thread in the internet's namespace (network.Do).
func (in *Internet) inNetns(fn func() error) error {
	return network.Do(filepath.Join(network.Dir, in.Netns), fn)
}

// makeLink makes the namespace, the veth and the addresses.
func (in *Internet) makeLink() error {
	done := make(chan error, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread ends with the goroutine
		origin, err := netns.Get()
		if err != nil {
			done <- err
			return
		}
		defer origin.Close()
		ns, err := netns.NewNamed(in.Netns) // the thread is now in ns
		if err != nil {
			done <- fmt.Errorf("create namespace %s: %w", in.Netns, err)
			return
		}
		defer ns.Close()
		if err := netns.Set(origin); err != nil {
			done <- err
			return
		}
		peer := in.HostIf + "n"
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: in.HostIf}, PeerName: peer, PeerNamespace: netlink.NsFd(int(ns))}
		if err := netlink.LinkAdd(veth); err != nil {
			done <- fmt.Errorf("add veth %s: %w", in.HostIf, err)
			return
		}
		host, err := netlink.LinkByName(in.HostIf)
		if err == nil {
			err = netlink.AddrAdd(host, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(in.HostAddr, 24))})
		}
		if err == nil && in.Prefix6.IsValid() {
			err = netlink.AddrAdd(host, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(in.HostAddr6, 64)), Flags: syscall.IFA_F_NODAD})
		}
		if err == nil {
			err = netlink.LinkSetUp(host)
		}
		if err != nil {
			done <- fmt.Errorf("host side %s: %w", in.HostIf, err)
			return
		}
		if err := netns.Set(ns); err != nil {
			done <- err
			return
		}
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			done <- err
			return
		}
		l, err := netlink.LinkByName(peer)
		if err != nil {
			done <- err
			return
		}
		for i := 2; i <= 9; i++ {
			bits := 24
			if i > 2 {
				bits = 32 // secondary addresses: the /24 route comes with .2
			}
			if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(in.Addr(i), bits))}); err != nil {
				done <- fmt.Errorf("address %s: %w", in.Addr(i), err)
				return
			}
			if !in.Prefix6.IsValid() {
				continue
			}
			bits = 64
			if i > 2 {
				bits = 128
			}
			if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(in.Addr6(i), bits)), Flags: syscall.IFA_F_NODAD}); err != nil {
				done <- fmt.Errorf("address %s: %w", in.Addr6(i), err)
				return
			}
		}
		done <- netlink.LinkSetUp(l)
	}()
	return <-done
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// makePKI generates the CA and the servers' certificate.
func (in *Internet) makePKI() error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "airlock test internet CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "*." + strings.TrimSuffix(Zone, ".")},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		DNSNames:    []string{"*." + strings.TrimSuffix(Zone, "."), strings.TrimSuffix(Zone, ".")},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for i := 2; i <= 9; i++ {
		leaf.IPAddresses = append(leaf.IPAddresses, net.IP(in.Addr(i).AsSlice()))
		if in.Prefix6.IsValid() {
			leaf.IPAddresses = append(leaf.IPAddresses, net.IP(in.Addr6(i).AsSlice()))
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	in.CAPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	in.CAFile = filepath.Join(in.dir, "ca.pem")
	if err := os.WriteFile(in.CAFile, in.CAPEM, 0o644); err != nil {
		return err
	}
	in.cert = tls.Certificate{Certificate: [][]byte{der, caDER}, PrivateKey: key}
	bad := &x509.Certificate{
		SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: Name(BadTLS)},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		DNSNames: []string{Name(BadTLS)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	bder, err := x509.CreateCertificate(rand.Reader, bad, bad, &key.PublicKey, key)
	if err != nil {
		return err
	}
	in.badCert = tls.Certificate{Certificate: [][]byte{bder}, PrivateKey: key}
	return nil
}

// makeGit makes a bare repository with one commit, ready for dumb HTTP
// (git update-server-info), under dir/www/git/repo.git.
func (in *Internet) makeGit() {
	gitPath, err := exec.LookPath("git")
	if err != nil {
		in.GitReason = "git is not installed on the host (needed to build the test repository)"
		return
	}
	www := filepath.Join(in.dir, "www", "git")
	work := filepath.Join(in.dir, "work")
	bare := filepath.Join(www, "repo.git")
	env := append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+in.dir,
		"GIT_AUTHOR_NAME=airlock", "GIT_AUTHOR_EMAIL=test@test.airlock",
		"GIT_COMMITTER_NAME=airlock", "GIT_COMMITTER_EMAIL=test@test.airlock")
	git := func(dir string, args ...string) (string, error) {
		cmd := exec.Command(gitPath, args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out)), nil
	}
	steps := func() error {
		if err := os.MkdirAll(work, 0o755); err != nil {
			return err
		}
		if err := os.MkdirAll(www, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(work, "README"), []byte("airlock test repository\n"), 0o644); err != nil {
			return err
		}
		for _, a := range [][]string{{"init", "-q", "-b", "main"}, {"add", "README"}, {"commit", "-q", "-m", "test"}} {
			if _, err := git(work, a...); err != nil {
				return err
			}
		}
		head, err := git(work, "rev-parse", "HEAD")
		if err != nil {
			return err
		}
		if _, err := git(www, "clone", "-q", "--bare", work, bare); err != nil {
			return err
		}
		if _, err := git(bare, "update-server-info"); err != nil {
			return err
		}
		in.GitHead = head
		return nil
	}
	if err := steps(); err != nil {
		in.GitReason = err.Error()
		return
	}
	in.GitRepo = "/git/repo.git"
}

func (in *Internet) handler(isTLS bool) http.Handler {
	files := http.FileServer(http.Dir(filepath.Join(in.dir, "www")))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
		req := Request{Local: addrPort(local), TLS: isTLS, Host: r.Host, Path: r.URL.Path, Proto: r.Proto, Header: r.Header.Clone()}
		if r.TLS != nil {
			req.SNI = r.TLS.ServerName
		}
		in.mu.Lock()
		in.requests = append(in.requests, req)
		in.mu.Unlock()
		if strings.HasPrefix(r.URL.Path, "/git/") && in.GitRepo != "" {
			files.ServeHTTP(w, r)
			return
		}
		fmt.Fprintf(w, "airlock-inet addr=%s host=%s sni=%s path=%s\n", req.Local.Addr(), req.Host, req.SNI, req.Path)
	})
}

func addrPort(a net.Addr) netip.AddrPort {
	switch v := a.(type) {
	case *net.TCPAddr:
		return netip.AddrPortFrom(unmap(v.IP), uint16(v.Port))
	case *net.UDPAddr:
		return netip.AddrPortFrom(unmap(v.IP), uint16(v.Port))
	}
	return netip.AddrPort{}
}

func unmap(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

// serve opens every socket in the namespace and starts the servers.
func (in *Internet) serve() error {
	type socks struct {
		http, https, dnsTCP net.Listener
		http6, https6       net.Listener // nil without IPv6
		dnsUDP              net.PacketConn
		sinks               []net.PacketConn
	}
	var s socks
	err := in.inNetns(func() error {
		var err error
		if s.http, err = net.Listen("tcp4", "0.0.0.0:80"); err != nil {
			return err
		}
		if s.https, err = net.Listen("tcp4", "0.0.0.0:443"); err != nil {
			return err
		}
		if in.Prefix6.IsValid() {
			if s.http6, err = net.Listen("tcp6", "[::]:80"); err != nil {
				return err
			}
			if s.https6, err = net.Listen("tcp6", "[::]:443"); err != nil {
				return err
			}
		}
		if s.dnsUDP, err = net.ListenPacket("udp4", in.DNS.String()); err != nil {
			return err
		}
		if s.dnsTCP, err = net.Listen("tcp4", in.DNS.String()); err != nil {
			return err
		}
		sinks := []string{netip.AddrPortFrom(in.Addr(3), 53).String(), "0.0.0.0:443", "0.0.0.0:9999"}
		for i := 2; i <= 9; i++ { // one echo per address, so that each answers from its own
			sinks = append(sinks, netip.AddrPortFrom(in.Addr(i), EchoPort).String())
		}
		if in.Prefix6.IsValid() {
			for i := 2; i <= 9; i++ {
				sinks = append(sinks, netip.AddrPortFrom(in.Addr6(i), EchoPort).String())
			}
		}
		for _, a := range sinks {
			family := "udp4"
			if strings.HasPrefix(a, "[") {
				family = "udp6"
			}
			pc, err := net.ListenPacket(family, a)
			if err != nil {
				return err
			}
			s.sinks = append(s.sinks, pc)
		}
		return nil
	})
	for _, c := range []interface{ Close() error }{s.http, s.https, s.http6, s.https6, s.dnsTCP, s.dnsUDP} {
		if c != nil && !isNilCloser(c) {
			in.closers = append(in.closers, c.Close)
		}
	}
	for _, pc := range s.sinks {
		in.closers = append(in.closers, pc.Close)
	}
	if err != nil {
		return fmt.Errorf("open sockets in %s: %w", in.Netns, err)
	}
	plain := &http.Server{Handler: in.handler(false), ReadHeaderTimeout: 10 * time.Second}
	secure := &http.Server{Handler: in.handler(true), ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{NextProtos: []string{"h2", "http/1.1"}, GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if addrPort(hi.Conn.LocalAddr()).Addr() == in.Addr(8) {
				return &in.badCert, nil
			}
			return &in.cert, nil
		}}}
	in.servers = append(in.servers, plain, secure)
	go plain.Serve(s.http)
	go secure.ServeTLS(s.https, "", "")
	if s.http6 != nil {
		go plain.Serve(s.http6)
		go secure.ServeTLS(s.https6, "", "")
	}
	mux := dns.HandlerFunc(in.answer)
	udp := &dns.Server{PacketConn: s.dnsUDP, Handler: mux}
	tcp := &dns.Server{Listener: s.dnsTCP, Handler: mux}
	in.dnsSrv = append(in.dnsSrv, udp, tcp)
	started := make(chan struct{}, 2)
	udp.NotifyStartedFunc = func() { started <- struct{}{} }
	tcp.NotifyStartedFunc = func() { started <- struct{}{} }
	go udp.ActivateAndServe()
	go tcp.ActivateAndServe()
	for i := 0; i < 2; i++ {
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			return errors.New("dns server did not start")
		}
	}
	for _, pc := range s.sinks {
		go in.sink(pc)
	}
	return nil
}

func isNilCloser(c interface{ Close() error }) bool {
	switch v := c.(type) {
	case net.Listener:
		return v == nil
	case net.PacketConn:
		return v == nil
	}
	return false
}

func (in *Internet) sink(pc net.PacketConn) {
	local := addrPort(pc.LocalAddr())
	buf := make([]byte, 2048)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		in.mu.Lock()
		in.udpSeen[local]++
		in.mu.Unlock()
		if local.Port() == EchoPort {
			pc.WriteTo(append([]byte("echo:"), buf[:n]...), from)
		}
	}
}

// answer is the authoritative server of Zone: A and AAAA from the
// records (TTL 60), NXDOMAIN for other names in the zone, REFUSED
// outside it.
func (in *Internet) answer(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	if len(req.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		w.WriteMsg(m)
		return
	}
	q := req.Question[0]
	name := strings.ToLower(q.Name)
	in.mu.Lock()
	in.dnsSeen = append(in.dnsSeen, name)
	addrs, ok := in.records[name]
	in.mu.Unlock()
	switch {
	case !dns.IsSubDomain(Zone, name):
		m.Rcode = dns.RcodeRefused
		m.Authoritative = false
	case !ok:
		m.Rcode = dns.RcodeNameError
	}
	for _, a := range addrs {
		hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: 60}
		switch {
		case a.Is4() && q.Qtype == dns.TypeA:
			hdr.Rrtype = dns.TypeA
			m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: net.IP(a.AsSlice())})
		case a.Is6() && q.Qtype == dns.TypeAAAA:
			hdr.Rrtype = dns.TypeAAAA
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: net.IP(a.AsSlice())})
		}
	}
	w.WriteMsg(m)
}

// Close stops the servers and removes the veth, the namespace and the
// files.
func (in *Internet) Close() error {
	in.closeOnce.Do(func() {
		var errs []error
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, s := range in.servers {
			if err := s.Shutdown(ctx); err != nil {
				s.Close()
			}
		}
		for _, s := range in.dnsSrv {
			s.Shutdown()
		}
		for _, c := range in.closers {
			c() // already closed by the servers, mostly
		}
		if l, err := netlink.LinkByName(in.HostIf); err == nil {
			if err := netlink.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("delete veth %s: %w", in.HostIf, err))
			}
		}
		if _, err := os.Stat(filepath.Join("/run/netns", in.Netns)); err == nil {
			if err := netns.DeleteNamed(in.Netns); err != nil {
				errs = append(errs, fmt.Errorf("delete namespace %s: %w", in.Netns, err))
			}
		}
		if in.dir != "" {
			if err := os.RemoveAll(in.dir); err != nil {
				errs = append(errs, err)
			}
		}
		in.closeErr = errors.Join(errs...)
	})
	return in.closeErr
}
