package daemon

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"

	"github.com/airlock/airlock/internal/egress"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/netpolicy"
	"github.com/airlock/airlock/internal/network"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/tlsca"
	"github.com/airlock/airlock/internal/worker"
	"github.com/airlock/airlock/internal/workerapi"
)

// Egress (--egress, on by default): every sandbox of the worker, gVisor or
// QEMU, gets an egress network (internal/network) whose traffic the
// worker's gateway (internal/egress) admits under the sandbox's policy
// (docs/network.md); a sandbox without one gets --egress-profile. Where
// the machine cannot make egress networks (not root, no network
// namespaces or nftables) and --egress was not asked for explicitly, the
// worker starts without egress and says why: its sandboxes have loopback
// only.

type egressFlags struct {
	on       *bool
	cidr     *string
	resolver *string
	profile  *string
	caBundle *string
	fs       *flag.FlagSet
}

func addEgressFlags(fs *flag.FlagSet) egressFlags {
	return egressFlags{
		fs:       fs,
		on:       fs.Bool("egress", true, "give sandboxes a network whose traffic goes only through the worker's egress gateway, as their policies allow (false: loopback only)"),
		cidr:     fs.String("sandbox-cidr", network.DefaultLink.Guest.Masked().String(), "the `PREFIX` of every sandbox's egress link: the gateway takes its first address, the guest its second (every sandbox has the same pair, in namespaces of its own); choose one that cannot collide with the host's networks, the same on every worker (snapshots keep the guest's address)"),
		resolver: fs.String("egress-resolver", "", "upstream DNS resolver(s) of the egress gateway, comma-separated `ADDR:PORT` (default: the host's, from /etc/resolv.conf)"),
		caBundle: fs.String("egress-ca-bundle", "", "PEM `FILE` of CAs the egress gateway trusts besides the system roots when it re-originates intercepted TLS (a corporate proxy's, a test internet's)"),
		profile:  fs.String("egress-profile", netpolicy.ProfilePublic, "the profile of sandboxes without a policy of their own: public (any public address, nothing private), none, or an operator's profile; with `airlock up`, set explicitly, it becomes the default org's default profile"),
	}
}

// gateway returns the worker's network config and gateway (zero and nil
// without --egress); rec takes every decision (netlog.go).
func (f egressFlags) gateway(log *slog.Logger, rec *egressRecorder) (network.Config, worker.Gateway, error) {
	if !*f.on {
		return network.Config{}, nil, nil
	}
	link, err := linkOf(*f.cidr)
	if err != nil {
		return network.Config{}, nil, err
	}
	if err := network.ProbeEgress(context.Background(), network.Config{Egress: true, Link: link}); err != nil {
		if f.explicit("egress") {
			return network.Config{}, nil, fmt.Errorf("--egress: this machine cannot make egress networks: %w", err)
		}
		log.Warn("egress off: this machine cannot make egress networks (run as root with network namespaces and nftables, or pass --egress=false to silence this); sandboxes get loopback only", "err", err)
		return network.Config{}, nil, nil
	}
	p, ok := netpolicy.Builtin(*f.profile)
	if !ok {
		return network.Config{}, nil, fmt.Errorf("--egress-profile %q: want %s or %s", *f.profile, netpolicy.ProfilePublic, netpolicy.ProfileNone)
	}
	guard := netpolicy.DefaultGuard(append(hostPrefixes(), link.Guest.Masked())...)
	c, err := netpolicy.Compile(p, guard)
	if err != nil {
		return network.Config{}, nil, err
	}
	ups, err := resolvers(*f.resolver)
	if err != nil {
		return network.Config{}, nil, err
	}
	roots, err := upstreamRoots(*f.caBundle)
	if err != nil {
		return network.Config{}, nil, err
	}
	glog := log.With("component", "egress")
	hosts := watchHostAddrs(glog)
	gw := egress.New(egress.Config{Upstreams: ups, Logger: glog, UpstreamRoots: roots, IsHostAddr: hosts.has, OnEvent: func(ev egress.Event) {
		if !ev.Allowed {
			glog.Info("egress denied", "sandbox", ev.SandboxID, "kind", ev.Kind, "name", ev.Name, "sni", ev.SNI, "host", ev.Host, "ip", ev.IP, "port", ev.Port, "reason", ev.Reason)
		}
		rec.record(ev)
	}})
	none, err := netpolicy.Compile(netpolicy.None(), netpolicy.DefaultGuard())
	if err != nil {
		return network.Config{}, nil, err
	}
	return network.Config{Egress: true, Link: link}, &gatewayAdapter{gw: gw, def: egress.FromPolicy(c), none: egress.FromPolicy(none),
		guard: guard, log: glog, cas: map[string]*tlsca.CA{}}, nil
}

// linkOf is the egress link of --sandbox-cidr: the gateway on the
// prefix's first host address, the guest on its second.
func linkOf(cidr string) (network.Link, error) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil || !p.Addr().Is4() {
		return network.Link{}, fmt.Errorf("--sandbox-cidr %q: want an IPv4 prefix such as 100.64.0.0/30", cidr)
	}
	p = p.Masked()
	gw := p.Addr().Next()
	l := network.Link{Guest: netip.PrefixFrom(gw.Next(), p.Bits()), Gateway: gw}
	if err := l.Validate(); err != nil {
		return network.Link{}, fmt.Errorf("--sandbox-cidr %s: %w", cidr, err)
	}
	return l, nil
}

// upstreamRoots are the system roots plus the PEM certificates of file.
func upstreamRoots(file string) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if file == "" {
		return pool, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--egress-ca-bundle: %w", err)
	}
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("--egress-ca-bundle %s: no PEM certificate in it", file)
	}
	return pool, nil
}

// gatewayAdapter attaches sandboxes' listeners to the gateway under their
// policies (the worker's profile for a sandbox without one).
type gatewayAdapter struct {
	gw        *egress.Gateway
	def, none egress.Policy
	guard     netpolicy.Guard
	log       *slog.Logger

	mu  sync.Mutex
	cas map[string]*tlsca.CA // by certificate fingerprint
}

func (a *gatewayAdapter) Attach(id string, ls network.Listeners, n *model.SandboxNetwork, eg *workerapi.Egress) error {
	a.gw.Detach(id) // attaching again replaces the listeners
	if err := a.gw.AttachListenerSets(id, egress.WithInterception(a.policy(id, n), a.interception(id, eg)),
		egress.Listeners{Proxy: ls.Proxy, DNS: ls.DNS, DNSTCP: ls.DNSTCP}, egress.Listeners{Proxy: ls.Proxy6, DNS: ls.DNS6, DNSTCP: ls.DNSTCP6}); err != nil {
		return err
	}
	if ls.UDP != nil {
		go func() {
			// Ends when the sandbox is detached (which closes the relay).
			if err := a.gw.ServeUDP(id, ls.UDP); err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, egress.ErrNotFound) && !errors.Is(err, egress.ErrClosed) {
				a.log.Debug("egress udp relay ended", "sandbox", id, "err", err)
			}
		}()
	}
	return nil
}

// AllowsIPv6 tells the worker whether sandbox id's network needs IPv6.
func (a *gatewayAdapter) AllowsIPv6(id string, n *model.SandboxNetwork) bool {
	return egress.AllowsIPv6(a.policy(id, n))
}

func (a *gatewayAdapter) Update(id string, n *model.SandboxNetwork, eg *workerapi.Egress) error {
	return a.gw.Update(id, egress.WithInterception(a.policy(id, n), a.interception(id, eg)))
}

// interception is eg as the gateway takes it (nil without a CA key: the
// policy intercepts nothing, or the server sent no material). Parsed CAs
// are shared by fingerprint, so their leaf caches serve the whole org.
func (a *gatewayAdapter) interception(id string, eg *workerapi.Egress) *egress.Interception {
	if eg == nil || eg.CAKey == "" {
		return nil
	}
	fp := tlsca.Fingerprint([]byte(eg.CACert))
	a.mu.Lock()
	defer a.mu.Unlock()
	ca := a.cas[fp]
	if ca == nil {
		var err error
		if ca, err = tlsca.Parse([]byte(eg.CACert), []byte(eg.CAKey)); err != nil {
			a.log.Warn("egress: the org CA does not parse; interception refused", "sandbox", id, "err", err)
			return nil
		}
		if len(a.cas) >= 1024 {
			clear(a.cas)
		}
		a.cas[fp] = ca
	}
	return &egress.Interception{CA: ca, Secrets: eg.Secrets}
}

func (a *gatewayAdapter) Detach(id string) { a.gw.Detach(id) }

// policy compiles n; a policy that does not compile (the server validated
// it: a newer server's?) denies everything.
func (a *gatewayAdapter) policy(id string, n *model.SandboxNetwork) egress.Policy {
	if n == nil || len(n.Policy) == 0 {
		return a.def
	}
	p, err := netpolicy.Parse(n.Policy)
	var c *netpolicy.Compiled
	if err == nil {
		c, err = netpolicy.Compile(p, a.guard)
	}
	if err != nil {
		a.log.Warn("egress policy does not compile; denying all egress", "sandbox", id, "err", err)
		return a.none
	}
	return egress.FromPolicy(c)
}

// explicit reports whether flag name was given on the command line.
func (f egressFlags) explicit(name string) bool {
	set := false
	f.fs.Visit(func(fl *flag.Flag) { set = set || fl.Name == name })
	return set
}

// applyDefaultProfile makes an explicit --egress-profile the default
// org's default profile (airlock up: the server and the worker are one
// installation); without the flag the org's setting stays as it is.
func (f egressFlags) applyDefaultProfile(ctx context.Context, svc *service.Service) error {
	if !f.explicit("egress-profile") {
		return nil
	}
	op := service.Principal{OrgID: service.DefaultOrgID, Admin: true}
	org, err := svc.GetOrg(ctx, op, service.DefaultOrgID)
	if err != nil {
		return err
	}
	n := org.Network
	n.Default = *f.profile
	if _, err := svc.UpdateOrg(ctx, op, service.DefaultOrgID, service.OrgUpdate{Network: &n}); err != nil {
		return fmt.Errorf("--egress-profile %q: %w", *f.profile, err)
	}
	return nil
}

// resolvers parses --egress-resolver, or reads the host's resolvers.
func resolvers(flagValue string) ([]string, error) {
	var out []string
	if flagValue != "" {
		for _, s := range strings.Split(flagValue, ",") {
			ap, err := netip.ParseAddrPort(strings.TrimSpace(s))
			if err != nil {
				return nil, fmt.Errorf("--egress-resolver %q: want ADDR:PORT, e.g. 192.0.2.53:53", s)
			}
			out = append(out, ap.String())
		}
		return out, nil
	}
	cc, err := dns.ClientConfigFromFile("/etc/resolv.conf")
	if err != nil || len(cc.Servers) == 0 {
		return nil, fmt.Errorf("--egress: no resolver in /etc/resolv.conf (%v); name one with --egress-resolver ADDR:PORT", err)
	}
	for _, s := range cc.Servers {
		out = append(out, net.JoinHostPort(s, cc.Port))
	}
	return out, nil
}

// hostPrefixes are the host's own addresses, which no sandbox may reach.
// hostAddrs is the set of the host's addresses, kept current: re-read on
// every netlink address change and every 10 s (in case the subscription
// misses one), so an address the host gains after start is never
// reachable from a sandbox (the compiled guard holds the ones at start).
type hostAddrs struct {
	mu  sync.RWMutex
	set map[netip.Addr]struct{}
}

func watchHostAddrs(log *slog.Logger) *hostAddrs {
	h := &hostAddrs{}
	h.refresh()
	updates := make(chan netlink.AddrUpdate, 64)
	if err := netlink.AddrSubscribe(updates, nil); err != nil {
		log.Warn("egress: no netlink address updates; re-reading the host's addresses every 10 s", "err", err)
		updates = nil
	}
	go func() {
		tick := time.NewTicker(10 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-updates:
			case <-tick.C:
			}
			h.refresh()
		}
	}()
	return h
}

func (h *hostAddrs) refresh() {
	set := map[netip.Addr]struct{}{}
	for _, p := range hostPrefixes() {
		set[p.Addr()] = struct{}{}
	}
	h.mu.Lock()
	h.set = set
	h.mu.Unlock()
}

func (h *hostAddrs) has(ip netip.Addr) bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	_, ok := h.set[ip]
	return ok
}

func hostPrefixes() []netip.Prefix {
	addrs, _ := net.InterfaceAddrs()
	var out []netip.Prefix
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				ip = ip.Unmap()
				out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
			}
		}
	}
	return out
}
