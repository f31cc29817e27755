// Package egressbench is `airlock bench`'s egress group
// (bench.GroupEgress): the worker's egress data path measured against a
// direct path on the same machine, in the same run, each request of one
// path interleaved with the same request on the other so that the noise
// of a shared machine hits both.
//
// Both clients run in this process, with the same code: Go's net/http
// (keep-alives off unless a case says otherwise, TLS session resumption
// off, so every HTTPS request pays a full handshake), its sockets opened
// on an OS thread that entered the path's network namespace.
//
//   - direct: a namespace of the bench's own whose eth0 (100.64.0.2/30) is
//     a veth straight into the test internet's namespace (one veth hop,
//     no nftables, no gateway): the least a sandbox's packets could cost.
//   - gateway: a sandbox's guest namespace made by internal/network
//     (network.Setup with Config.Egress: the same veth, gateway namespace
//     and nftables redirect a gVisor sandbox gets), its listeners
//     (network.OpenGateway) served by a real gateway (egress.New +
//     AttachListeners, under a compiled NetworkPolicyV1 with the default
//     guard), which dials upstream from the host's namespace over the test
//     internet's veth: two veth hops and the user-space proxy.
//
// The servers are internal/egress/testinet's test internet (HTTP :80,
// HTTPS :443 with a CA of the run's own, DNS :53 in 198.18.0.0/15) and a
// bulk endpoint of the bench's own on :8080 of the same namespace.
// Everything is removed before Run returns. Run needs root; without it
// the report says it was skipped and why.
package egressbench

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/bench"
	"github.com/airlock/airlock/internal/egress"
	"github.com/airlock/airlock/internal/egress/testinet"
	"github.com/airlock/airlock/internal/netpolicy"
	"github.com/airlock/airlock/internal/network"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/tlsca"
)

var _ bench.EgressFunc = Run

// Targets on the development machines (issue 12).
const (
	targetPassthroughMs = 1.0 // added p50, plain HTTP and TLS passthrough
	targetInterceptMs   = 5.0 // added p50, TLS interception (handshake included)
	targetThroughput    = 0.8 // gateway over direct, p50
)

// Addresses of the test internet the cases use (testinet.Internet.Addr).
const (
	wwwAddr   = 2 // testinet.WWW
	otherAddr = 4 // testinet.Other
	bulkPort  = 8080
	warmup    = 5
	// refreshAfter re-resolves a name through the gateway, untimed, so its
	// DNS attribution (the test zone's TTL is 60 s) never lapses mid-case.
	refreshAfter = 20 * time.Second
)

// Run measures the egress group; it implements bench.EgressFunc. Cases
// that fail are recorded in the report (EgressCase.Error) and do not stop
// the others; the returned error is for what stopped the whole group.
func Run(ctx context.Context, cfg bench.EgressConfig) (bench.EgressReport, error) {
	cfg.Defaults()
	if os.Geteuid() != 0 {
		return bench.EgressReport{Skipped: "needs root: it makes network namespaces, veths and nftables tables (run `sudo airlock bench --only egress`)"}, nil
	}
	e := &env{cfg: cfg}
	defer e.close()
	if skip, err := e.setup(ctx); skip != "" || err != nil {
		return bench.EgressReport{Skipped: skip}, err
	}
	rep := bench.EgressReport{
		Paths: map[string]string{
			"direct":  "a network namespace whose eth0 (100.64.0.2/30) is a veth straight into the test internet's namespace: one veth hop, no nftables, no gateway",
			"gateway": "a sandbox guest namespace made by internal/network (eth0 100.64.0.2/30, veth to its gateway namespace, whose nftables redirect TCP to the gateway's proxy listener and DNS to its resolver) served by egress.New + AttachListeners in this process, dialling upstream from the host namespace over the test internet's veth: two veth hops and the user-space proxy",
			"client":  "Go net/http in the bench process, its sockets opened on a thread inside the path's namespace; the same client code and request on both paths, interleaved (direct first on even requests, gateway first on odd ones)",
			"server":  "internal/egress/testinet in 198.18.0.0/15 (HTTP :80, HTTPS :443 with an ECDSA P-256 certificate of the run's own CA, DNS :53) and the bench's bulk endpoint on :8080 of the same namespace",
		},
		Policy: e.policyJSON,
	}
	for _, c := range e.cases() {
		if ctx.Err() != nil {
			break
		}
		e.progress("%s ...", c.name)
		ec := e.measure(ctx, c)
		ec.Derive()
		rep.Cases = append(rep.Cases, ec)
	}
	for _, c := range curlCases() {
		if ctx.Err() != nil {
			break
		}
		e.progress("%s ...", c.name)
		ec := e.measureCurl(ctx, c)
		ec.Derive()
		rep.Cases = append(rep.Cases, ec)
	}
	rep.Targets = []bench.EgressTarget{
		{Case: "http_get_new_connection", Metric: "added_p50_ms", Limit: targetPassthroughMs, Text: "plain HTTP, new connection: ≤ +1 ms p50"},
		{Case: "http_get_keepalive", Metric: "added_p50_ms", Limit: targetPassthroughMs, Text: "plain HTTP, kept-alive connection: ≤ +1 ms p50"},
		{Case: "https_get_passthrough", Metric: "added_p50_ms", Limit: targetPassthroughMs, Text: "TLS passthrough, handshake included: ≤ +1 ms p50"},
		{Case: "https_get_intercept", Metric: "added_p50_ms", Limit: targetInterceptMs, Text: "TLS intercept, handshake included: ≤ +5 ms p50"},
		{Case: downloadName(cfg.DownloadBytes), Metric: "ratio_p50", Limit: targetThroughput, Text: "download throughput through the gateway ≥ 80% of direct (p50)"},
	}
	for i := range rep.Targets {
		rep.Targets[i].Judge(rep.Cases)
	}
	if err := ctx.Err(); err != nil {
		return rep, fmt.Errorf("egress bench interrupted: %w", err)
	}
	return rep, nil
}

func downloadName(n int64) string { return fmt.Sprintf("download_%s", sizeName(n)) }
func uploadName(n int64) string   { return fmt.Sprintf("upload_%s", sizeName(n)) }

func sizeName(n int64) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%dmib", n>>20)
	}
	return fmt.Sprintf("%db", n)
}

// env is one run's namespaces, gateway and clients.
type env struct {
	cfg        bench.EgressConfig
	in         *testinet.Internet
	id         string // the guest's sandbox id
	netw       runtime.Network
	directNS   string // the direct namespace's name
	gw         *egress.Gateway
	guest      *nsThread
	direct     *nsThread
	roots      *x509.CertPool
	policyJSON string
	bulk       *http.Server
	closers    []func() error

	evMu   sync.Mutex
	denied []egress.Event // the latest denials, for the cases' errors

	resMu    sync.Mutex
	resolved map[string]time.Time // name → when the gateway last resolved it for the guest
}

func (e *env) progress(format string, args ...any) {
	fmt.Fprintf(e.cfg.Progress, "bench: egress: "+format+"\n", args...)
}

// setup makes everything; skip is the reason the machine cannot run the
// group (no network namespaces).
func (e *env) setup(ctx context.Context) (skip string, err error) {
	var rnd [3]byte
	rand.Read(rnd[:])
	tag := hex.EncodeToString(rnd[:])
	e.id = "bench-" + tag
	e.directNS = "airlockbench-" + tag

	in, err := testinet.New(testinet.Config{})
	if err != nil {
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
			return "cannot make network namespaces and veths here: " + err.Error(), nil
		}
		return "", fmt.Errorf("test internet: %w", err)
	}
	e.in = in
	e.closers = append(e.closers, in.Close)
	e.roots = x509.NewCertPool()
	if !e.roots.AppendCertsFromPEM(in.CAPEM) {
		return "", errors.New("test internet: CA does not parse")
	}
	upstreamRoots := e.roots.Clone()
	// The org CA the gateway intercepts with; the client trusts it as a
	// sandbox does (its bundle holds both).
	caCert, caKey, err := tlsca.Generate("Airlock CA bench", time.Now())
	if err != nil {
		return "", err
	}
	ca, err := tlsca.Parse(caCert, caKey)
	if err != nil {
		return "", err
	}
	e.roots.AppendCertsFromPEM(caCert)
	if err := e.serveBulk(); err != nil {
		return "", err
	}
	if err := e.makeDirect(); err != nil {
		return "", err
	}

	// The sandbox's side, as the worker makes it (internal/worker/network.go).
	ncfg := network.Config{Egress: true}
	if e.netw, err = network.Setup(ctx, e.id, runtime.Caps{}, ncfg); err != nil {
		return "", err
	}
	e.closers = append(e.closers, func() error { return network.Release(context.Background(), e.id) })
	ls, err := network.OpenGateway(e.id, ncfg)
	if err != nil {
		return "", err
	}
	www, other := testinet.Name(testinet.WWW), testinet.Name(testinet.Other)
	e.policyJSON = fmt.Sprintf(`{"version":1,"default":"deny","rules":[`+
		`{"action":"allow","domains":[%q],"ports":[80,443,%d]},`+
		`{"action":"allow","domains":[%q],"ports":[443],"tls":"intercept"}]}`, www, bulkPort, other)
	p, err := netpolicy.Parse([]byte(e.policyJSON))
	if err != nil {
		ls.Close()
		return "", err
	}
	compiled, err := netpolicy.Compile(p, netpolicy.DefaultGuard(hostPrefixes()...))
	if err != nil {
		ls.Close()
		return "", err
	}
	log := slog.New(slog.NewTextHandler(e.cfg.Progress, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e.gw = egress.New(egress.Config{
		Upstreams:     []string{in.DNS.String()},
		Logger:        log.With("component", "egress"),
		OnEvent:       e.onEvent,
		UpstreamRoots: upstreamRoots,
	})
	e.closers = append(e.closers, e.gw.Close)
	policy := egress.WithInterception(egress.FromPolicy(compiled), &egress.Interception{CA: ca})
	if err := e.gw.AttachListeners(e.id, policy, ls.Proxy, ls.DNS, ls.DNSTCP); err != nil {
		ls.Close()
		return "", err
	}
	if e.guest, err = newNSThread(network.Path(e.id)); err != nil {
		return "", fmt.Errorf("enter %s: %w", network.Path(e.id), err)
	}
	e.closers = append(e.closers, e.guest.close)
	if e.direct, err = newNSThread(filepath.Join(network.Dir, e.directNS)); err != nil {
		return "", fmt.Errorf("enter %s: %w", e.directNS, err)
	}
	e.closers = append(e.closers, e.direct.close)
	e.resolved = map[string]time.Time{}
	return "", nil
}

// close removes everything, last made first.
func (e *env) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		if err := e.closers[i](); err != nil {
			e.progress("cleanup: %v", err)
		}
	}
	e.closers = nil
}

func (e *env) onEvent(ev egress.Event) {
	if ev.Allowed {
		return
	}
	e.evMu.Lock()
	e.denied = append(e.denied, ev)
	if len(e.denied) > 64 {
		e.denied = e.denied[len(e.denied)-64:]
	}
	e.evMu.Unlock()
}

// lastDenial returns the latest denial the gateway reported at or after
// the given time.
func (e *env) lastDenial(after time.Time) (egress.Event, bool) {
	e.evMu.Lock()
	defer e.evMu.Unlock()
	for i := len(e.denied) - 1; i >= 0; i-- {
		if !e.denied[i].Time.Before(after) {
			return e.denied[i], true
		}
	}
	return egress.Event{}, false
}

// serveBulk serves GET /bytes?n=N (N zero bytes) and POST /sink (reads
// the body, answers its length) on wwwAddr:bulkPort in the test internet.
func (e *env) serveBulk() error {
	var l net.Listener
	addr := netip.AddrPortFrom(e.in.Addr(wwwAddr), bulkPort).String()
	if err := network.Do(filepath.Join(network.Dir, e.in.Netns), func() (err error) {
		l, err = net.Listen("tcp4", addr)
		return err
	}); err != nil {
		return fmt.Errorf("bulk endpoint %s: %w", addr, err)
	}
	chunk := make([]byte, 256<<10)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /bytes", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		if err != nil || n < 0 {
			http.Error(w, "want n=bytes", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		w.Header().Set("Content-Type", "application/octet-stream")
		for n > 0 {
			k, err := w.Write(chunk[:min(int64(len(chunk)), n)])
			if err != nil {
				return
			}
			n -= int64(k)
		}
	})
	mux.HandleFunc("POST /sink", func(w http.ResponseWriter, r *http.Request) {
		n, err := drain(r.Body, make([]byte, 256<<10))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d", n)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "airlock bench\n") })
	e.bulk = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go e.bulk.Serve(l)
	e.closers = append(e.closers, e.bulk.Close)
	return nil
}

func drain(r io.Reader, buf []byte) (int64, error) {
	var n int64
	for {
		k, err := r.Read(buf)
		n += int64(k)
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// Link addresses of the direct namespace: the guest's, so both clients
// send from the same address.
const (
	directIf   = "eth0"
	directPeer = "direct0" // its end in the test internet's namespace
)

// makeDirect makes the direct namespace: eth0 with the guest's address and
// a default route over a veth whose other end, in the test internet's
// namespace, holds the guest link's gateway address.
func (e *env) makeDirect() error {
	l := network.DefaultLink
	done := make(chan error, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread ends with the goroutine
		inet, err := netns.GetFromName(e.in.Netns)
		if err != nil {
			done <- err
			return
		}
		defer inet.Close()
		ns, err := netns.NewNamed(e.directNS) // the thread is now in ns
		if err != nil {
			done <- fmt.Errorf("create namespace %s: %w", e.directNS, err)
			return
		}
		defer ns.Close()
		if err := setLinkUp("lo"); err != nil {
			done <- err
			return
		}
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: directIf}, PeerName: directPeer, PeerNamespace: netlink.NsFd(int(inet))}
		if err := netlink.LinkAdd(veth); err != nil {
			done <- fmt.Errorf("add veth %s/%s: %w", directIf, directPeer, err)
			return
		}
		if err := network.GuestAddress(l); err != nil {
			done <- err
			return
		}
		if err := netns.Set(inet); err != nil {
			done <- err
			return
		}
		peer, err := netlink.LinkByName(directPeer)
		if err == nil {
			err = netlink.AddrAdd(peer, &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(l.Gateway.AsSlice()), Mask: net.CIDRMask(l.Guest.Bits(), 32)}})
		}
		if err == nil {
			err = netlink.LinkSetUp(peer)
		}
		done <- err
	}()
	err := <-done
	// Removed whatever happened (the veth goes with the namespace).
	e.closers = append(e.closers, func() error {
		if _, err := os.Stat(filepath.Join(network.Dir, e.directNS)); err != nil {
			return nil
		}
		return netns.DeleteNamed(e.directNS)
	})
	if err != nil {
		return fmt.Errorf("direct namespace %s: %w", e.directNS, err)
	}
	return nil
}

func setLinkUp(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %s: %w", name, err)
	}
	return netlink.LinkSetUp(l)
}

// hostPrefixes are the host's own addresses, which the guard blocks (as
// the daemon's gateway does).
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

// nsThread is an OS thread inside a network namespace that opens sockets
// for the rest of the process (a socket stays in the namespace it was
// made in). Only socket creation and connect run on it.
type nsThread struct {
	reqs chan func()
	once sync.Once
}

func newNSThread(path string) (*nsThread, error) {
	t := &nsThread{reqs: make(chan func())}
	ready := make(chan error, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread ends with the goroutine
		ns, err := netns.GetFromPath(path)
		if err == nil {
			err = netns.Set(ns)
			ns.Close()
		}
		ready <- err
		if err != nil {
			return
		}
		for fn := range t.reqs {
			fn()
		}
	}()
	return t, <-ready
}

func (t *nsThread) close() error {
	t.once.Do(func() { close(t.reqs) })
	return nil
}

// run runs fn on the thread.
func (t *nsThread) run(fn func()) {
	done := make(chan struct{})
	t.reqs <- func() { fn(); close(done) }
	<-done
}

// dial connects from the thread's namespace.
func (t *nsThread) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	fn := func() {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		ch <- result{c, err}
	}
	select {
	case t.reqs <- fn:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	r := <-ch
	return r.c, r.err
}

// path is one side of a comparison.
type path struct {
	name   string // "direct" or "gateway"
	thread *nsThread
}

// request is what one case sends.
type request struct {
	method    string
	url       string         // names the host (Host, SNI)
	addr      netip.AddrPort // where it is dialled
	keepAlive bool
	body      int64 // bytes of a POST body
	want      int64 // bytes the response must have (-1: any)
}

// kase is one row of the table.
type kase struct {
	name, desc string
	rule       string // the policy rule that admits it
	tls        netpolicy.TLSMode
	req        request
	dnsName    string // resolve through the gateway first (the domain rule's DNS attribution)
	throughput bool   // MB/s of req.want (or req.body) bytes, cfg.DownloadRuns times
	dns        bool   // a DNS query for dnsName instead of an HTTP request
}

func (e *env) cases() []kase {
	www, other := testinet.Name(testinet.WWW), testinet.Name(testinet.Other)
	wwwAP := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(e.in.Addr(wwwAddr), port) }
	n, size := e.cfg.DownloadBytes, sizeName(e.cfg.DownloadBytes)
	return []kase{
		{name: "dns_query", desc: "an A query for " + www + " to the test internet's resolver (the gateway's nftables redirect it to the gateway's resolver, which forwards it), UDP, socket made untimed (ms)",
			rule: "rule 0 (domains)", dns: true, dnsName: www, req: request{addr: e.in.DNS}},
		{name: "http_get_new_connection", desc: "GET http://" + www + "/ on a new connection each time (connect, request, ~80-byte answer, close) (ms)",
			rule: "rule 0 (domains, tls passthrough)", dnsName: www,
			req: request{method: "GET", url: "http://" + www + "/", addr: wwwAP(80), want: -1}},
		{name: "http_get_keepalive", desc: "GET http://" + www + "/ on one kept-alive connection (ms)",
			rule: "rule 0 (domains)", dnsName: www,
			req: request{method: "GET", url: "http://" + www + "/", addr: wwwAP(80), keepAlive: true, want: -1}},
		{name: "https_get_passthrough", desc: "GET https://" + www + "/ on a new connection each time, full TLS 1.3 handshake (no resumption), TLS passed through (ms)",
			rule: "rule 0 (domains, tls passthrough)", tls: netpolicy.Passthrough, dnsName: www,
			req: request{method: "GET", url: "https://" + www + "/", addr: wwwAP(443), want: -1}},
		{name: "https_get_intercept", desc: "GET https://" + other + "/ on a new connection each time, full handshake, under a rule with \"tls\": \"intercept\" (the gateway terminates TLS and re-originates it) (ms)",
			rule: "rule 1 (domains, tls intercept)", tls: netpolicy.Intercept, dnsName: other,
			req: request{method: "GET", url: "https://" + other + "/", addr: netip.AddrPortFrom(e.in.Addr(otherAddr), 443), want: -1}},
		{name: downloadName(n), desc: fmt.Sprintf("GET of %s (%d bytes) over plain HTTP on a new connection, read in 256 KiB buffers (MB/s, MB = 10^6 bytes)", size, n),
			rule: "rule 0 (domains)", dnsName: www, throughput: true,
			req: request{method: "GET", url: fmt.Sprintf("http://%s:%d/bytes?n=%d", www, bulkPort, n), addr: wwwAP(bulkPort), want: n}},
		{name: uploadName(n), desc: fmt.Sprintf("POST of %s (%d bytes, Content-Length) over plain HTTP, every upload on one kept-alive connection (so the gateway must find each next request after a body; the sink checks the length) (MB/s)", size, n),
			rule: "rule 0 (domains)", dnsName: www, throughput: true,
			req: request{method: "POST", url: fmt.Sprintf("http://%s:%d/sink", www, bulkPort), addr: wwwAP(bulkPort), body: n, want: -1, keepAlive: true}},
	}
}

// measure runs one case on both paths, interleaved.
func (e *env) measure(ctx context.Context, c kase) bench.EgressCase {
	out := bench.EgressCase{Name: c.name, Description: c.desc, Rule: c.rule}
	paths := [2]path{{"direct", e.direct}, {"gateway", e.guest}}
	var send [2]func() (time.Duration, error)
	for i, p := range paths {
		if c.dns {
			send[i] = func() (time.Duration, error) { return e.query(ctx, p, c) }
			continue
		}
		cl := e.client(p, c.req)
		defer cl.CloseIdleConnections()
		buf := make([]byte, 256<<10)
		send[i] = func() (time.Duration, error) {
			if p.name == "gateway" {
				if err := e.fresh(ctx, c.dnsName, false); err != nil {
					return 0, err
				}
			}
			return e.do(ctx, cl, c.req, buf)
		}
	}
	// A first request on each path says whether the case runs at all.
	for i, p := range paths {
		mark := time.Now()
		if _, err := send[i](); err != nil {
			if d, ok := e.lastDenial(mark); ok && p.name == "gateway" {
				if c.tls == netpolicy.Intercept && strings.Contains(d.Reason, "no org CA reached the gateway") {
					out.Skipped = "interception not available (the gateway refused the connection: " + d.Reason + ")"
					e.progress("%s: SKIPPED: %s", c.name, out.Skipped)
					return out
				}
				err = fmt.Errorf("%w (the gateway denied it: %s)", err, d.Reason)
			}
			out.Error = fmt.Sprintf("%s: %v", p.name, err)
			return out
		}
	}
	runs := e.cfg.Requests
	if c.throughput {
		runs = e.cfg.DownloadRuns
	} else {
		for range warmup {
			for i := range paths {
				if _, err := send[i](); err != nil {
					out.Error = fmt.Sprintf("%s: warm-up: %v", paths[i].name, err)
					return out
				}
			}
		}
	}
	var samples [2][]float64
	for k := range runs {
		if ctx.Err() != nil {
			out.Error = ctx.Err().Error()
			return out
		}
		order := [2]int{0, 1}
		if k%2 == 1 {
			order = [2]int{1, 0}
		}
		for _, i := range order {
			d, err := send[i]()
			if err != nil {
				out.Error = fmt.Sprintf("%s: request %d: %v", paths[i].name, k+1, err)
				return out
			}
			if c.throughput {
				n := c.req.want
				if c.req.body > 0 {
					n = c.req.body
				}
				samples[i] = append(samples[i], bench.MBps(n, d))
				e.progress("%s %s %d/%d: %.0f MB/s", c.name, paths[i].name, k+1, runs, samples[i][len(samples[i])-1])
			} else {
				samples[i] = append(samples[i], float64(d)/float64(time.Millisecond))
			}
		}
	}
	unit := "ms"
	if c.throughput {
		unit = "MB/s"
	}
	d, g := bench.Summarize(unit, samples[0]), bench.Summarize(unit, samples[1])
	out.Direct, out.Gateway = &d, &g
	if !c.throughput {
		e.progress("%s: direct p50 %.3f ms, gateway p50 %.3f ms", c.name, d.P50, g.P50)
	}
	return out
}

// client is the HTTP client of one path for req: every connection is
// dialled from the path's namespace to req.addr.
func (e *env) client(p path, req request) *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return p.thread.dial(ctx, "tcp4", req.addr.String())
			},
			DisableKeepAlives:   !req.keepAlive,
			MaxIdleConnsPerHost: 1,
			DisableCompression:  true,
			// No ClientSessionCache: every handshake is a full one.
			TLSClientConfig: &tls.Config{RootCAs: e.roots},
		},
		Timeout: 2 * time.Minute,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// do sends req once and reads the whole answer; it returns the time from
// sending to the last byte.
func (e *env) do(ctx context.Context, cl *http.Client, req request, buf []byte) (time.Duration, error) {
	var body io.Reader
	if req.body > 0 {
		body = io.LimitReader(zeros{}, req.body)
	}
	r, err := http.NewRequestWithContext(ctx, req.method, req.url, body)
	if err != nil {
		return 0, err
	}
	if req.body > 0 {
		r.ContentLength = req.body
	}
	t0 := time.Now()
	resp, err := cl.Do(r)
	if err != nil {
		return 0, err
	}
	var n int64
	var answer []byte
	if req.body > 0 {
		answer, err = io.ReadAll(io.LimitReader(resp.Body, 64))
		n = int64(len(answer))
	} else {
		n, err = drain(resp.Body, buf)
	}
	resp.Body.Close()
	d := time.Since(t0)
	switch {
	case err != nil:
		return 0, fmt.Errorf("read the answer: %w", err)
	case resp.StatusCode != http.StatusOK:
		return 0, fmt.Errorf("status %s", resp.Status)
	case req.want >= 0 && n != req.want:
		return 0, fmt.Errorf("got %d bytes, want %d", n, req.want)
	case req.body > 0 && string(answer) != strconv.FormatInt(req.body, 10):
		return 0, fmt.Errorf("the sink read %q bytes, want %d", answer, req.body)
	}
	return d, nil
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// query sends one A query for c.dnsName to c.req.addr from the path's
// namespace; the socket is made untimed.
func (e *env) query(ctx context.Context, p path, c kase) (time.Duration, error) {
	conn, err := p.thread.dial(ctx, "udp4", c.req.addr.String())
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	co := &dns.Conn{Conn: conn}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(c.dnsName), dns.TypeA)
	t0 := time.Now()
	if err := co.WriteMsg(m); err != nil {
		return 0, err
	}
	r, err := co.ReadMsg()
	d := time.Since(t0)
	if err != nil {
		return 0, err
	}
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
		return 0, fmt.Errorf("answer %s with %d records", dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	if p.name == "gateway" {
		e.resMu.Lock()
		e.resolved[strings.ToLower(c.dnsName)] = time.Now()
		e.resMu.Unlock()
	}
	return d, nil
}

// fresh resolves name through the gateway (untimed) unless it did so
// within refreshAfter (or force), so that the domain rule's DNS
// attribution holds.
func (e *env) fresh(ctx context.Context, name string, force bool) error {
	if name == "" {
		return nil
	}
	e.resMu.Lock()
	last := e.resolved[name]
	e.resMu.Unlock()
	if !force && time.Since(last) < refreshAfter {
		return nil
	}
	_, err := e.query(ctx, path{"gateway", e.guest}, kase{dnsName: name, req: request{addr: e.in.DNS}})
	if err != nil {
		return fmt.Errorf("resolve %s through the gateway: %w", name, err)
	}
	return nil
}
