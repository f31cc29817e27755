package egress

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlock/airlock/internal/tlsca"
)

// TLS interception: a connection admitted by a rule with "tls":
// "intercept" is terminated here with a leaf certificate for its SNI
// signed by the sandbox's org CA (Interception.CA, which the guest
// trusts), and every request on it is re-originated over TLS to the
// connection's original destination — verified against Config.UpstreamRoots
// for the same name — with the rule's headers set from the org's secrets.
// HTTP/1.1 and HTTP/2 are spoken on both sides (ALPN). Each request is
// judged again: its Host (:authority) must be the SNI (421 otherwise: a
// client that coalesces connections retries on a new one), and the
// sandbox's current policy must still intercept it.

// tlsIntercept is Decision.TLS of a rule that intercepts.
const tlsIntercept = "intercept"

// Interception limits.
const (
	// interceptHeaderLimit bounds an intercepted request's header block.
	interceptHeaderLimit = 64 << 10
	// interceptIdle closes an intercepted connection idle this long.
	interceptIdle = 2 * time.Minute
	// upstreamHeaderTimeout bounds the wait for an upstream's response
	// header (an LLM API may think for a while before it answers).
	upstreamHeaderTimeout = 5 * time.Minute
)

// Interception is what the gateway needs to intercept a sandbox's TLS:
// its org's CA and the secret values its policy's inject rules name.
// Secrets are held in memory only.
type Interception struct {
	CA      *tlsca.CA
	Secrets map[string]string
}

// WithInterception returns p with the interception material ic: a Policy
// the gateway intercepts with (Update swaps the policy and the material
// at once). ic nil: p itself.
func WithInterception(p Policy, ic *Interception) Policy {
	if ic == nil {
		return p
	}
	if r, ok := p.(Reacher); ok {
		return reachingIntercepting{intercepting{p, ic}, r}
	}
	return intercepting{p, ic}
}

type intercepting struct {
	Policy
	ic *Interception
}

func (p intercepting) interception() *Interception { return p.ic }

type reachingIntercepting struct {
	intercepting
	r Reacher
}

func (p reachingIntercepting) Reachable(ip netip.Addr) Decision { return p.r.Reachable(ip) }

func interceptionOf(p Policy) *Interception {
	if ip, ok := p.(interface{ interception() *Interception }); ok {
		return ip.interception()
	}
	return nil
}

// replayConn reads the bytes the proxy peeked before the rest of the
// client's stream.
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// oneConnListener hands out one connection, then blocks until closed.
type oneConnListener struct {
	c      net.Conn
	once   sync.Once
	closed chan struct{}
	addr   net.Addr
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() { c = l.c })
	if c != nil {
		return c, nil
	}
	<-l.closed
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error {
	select {
	case <-l.closed:
	default:
		close(l.closed)
	}
	return nil
}

func (l *oneConnListener) Addr() net.Addr { return l.addr }

// intercept serves pc (a TLS connection admitted for name under rule d,
// p its peeked ClientHello) until it ends.
func (g *Gateway) intercept(sb *sandbox, pc *proxyConn, p peeked, name string, ic *Interception) {
	c := pc.client
	leaf, err := ic.CA.Leaf(name, time.Now())
	if err != nil {
		g.emit(Event{SandboxID: sb.id, Kind: KindTCP, Name: name, SNI: p.sni, IP: pc.dst.Addr(), Port: pc.dst.Port(), Rule: -1, Reason: "interception: " + err.Error()})
		pc.cut()
		return
	}
	tc := tls.Server(&replayConn{Conn: c, r: io.MultiReader(bytes.NewReader(p.buf), c)}, &tls.Config{
		Certificates: []tls.Certificate{*leaf},
		NextProtos:   []string{"h2", "http/1.1"},
		MinVersion:   tls.VersionTLS12,
	})
	_ = c.SetDeadline(time.Now().Add(peekTimeout))
	if err := tc.Handshake(); err != nil {
		// The guest does not trust the CA, or hung up: nothing was sent
		// upstream. Say so: it is the first thing to check.
		g.emit(Event{SandboxID: sb.id, Kind: KindTCP, Name: name, SNI: p.sni, IP: pc.dst.Addr(), Port: pc.dst.Port(), Rule: -1,
			Reason: "interception: TLS handshake with the sandbox failed (does it trust the org's Airlock CA?): " + err.Error()})
		pc.cut()
		return
	}
	_ = c.SetDeadline(time.Time{})

	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			// Always the connection's original destination: the name is
			// never resolved again here (DNS attribution admitted dst).
			ctx, cancel := context.WithTimeout(ctx, dialTimeout)
			defer cancel()
			return g.dial(ctx, "tcp", pc.dst.String())
		},
		TLSClientConfig:       &tls.Config{ServerName: name, RootCAs: g.cfg.UpstreamRoots, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          8,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       interceptIdle,
		TLSHandshakeTimeout:   dialTimeout,
		ResponseHeaderTimeout: upstreamHeaderTimeout,
	}
	defer tr.CloseIdleConnections()
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme = "https"
			r.Out.URL.Host = r.In.Host
			r.Out.Host = r.In.Host
		},
		Transport:     tr,
		FlushInterval: -1, // stream (server-sent events of LLM APIs)
		ErrorLog:      log.New(io.Discard, "", 0),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			msg := "upstream: " + err.Error()
			if isCertError(err) {
				msg = "upstream certificate for " + name + " is not trusted: " + err.Error()
				g.emit(Event{SandboxID: sb.id, Kind: KindHTTP, Name: name, SNI: p.sni, Host: r.Host, IP: pc.dst.Addr(), Port: pc.dst.Port(), Rule: -1,
					Reason: "interception: " + msg})
			} else {
				g.log.Debug("egress intercept: upstream", "sandbox", sb.id, "name", name, "err", err)
			}
			httpError(w, http.StatusBadGateway, msg)
		},
	}

	l := &oneConnListener{c: tc, closed: make(chan struct{}), addr: c.LocalAddr()}
	hs := &http.Server{
		Handler:           g.interceptHandler(sb, pc, p.sni, name, rp),
		ReadHeaderTimeout: peekTimeout,
		IdleTimeout:       interceptIdle,
		MaxHeaderBytes:    interceptHeaderLimit,
		ErrorLog:          log.New(io.Discard, "", 0),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateClosed || s == http.StateHijacked {
				l.Close()
			}
		},
	}
	_ = hs.Serve(l)
	pc.finish()
}

// interceptHandler judges and forwards each request of an intercepted
// connection admitted for name.
func (g *Gateway) interceptHandler(sb *sandbox, pc *proxyConn, sni, name string, rp *httputil.ReverseProxy) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ev := Event{SandboxID: sb.id, Kind: KindHTTP, Name: name, SNI: sni, Host: r.Host, IP: pc.dst.Addr(), Port: pc.dst.Port(), Rule: -1}
		deny := func(status int, reason string) {
			ev.Reason = reason
			g.emit(ev)
			httpError(w, status, "denied: "+reason)
		}
		if r.Method == http.MethodConnect {
			deny(http.StatusMethodNotAllowed, "CONNECT through an intercepted connection")
			return
		}
		host, ip, err := hostOf(r.Host)
		if err != nil {
			deny(http.StatusBadRequest, err.Error())
			return
		}
		if host != name || ip.IsValid() {
			deny(http.StatusMisdirectedRequest, fmt.Sprintf("Host %s does not match the connection's SNI %s", r.Host, name))
			return
		}
		if r.URL.Host != "" && !strings.EqualFold(r.URL.Host, r.Host) {
			deny(http.StatusBadRequest, fmt.Sprintf("absolute URI for %s on a connection to %s", r.URL.Host, name))
			return
		}
		d, reason := g.admit(sb, pc, name, pc.dst)
		ev.Rule = d.Rule
		if reason != "" {
			deny(http.StatusForbidden, reason)
			pc.cut()
			return
		}
		policy, _, _ := sb.snapshot()
		ic := interceptionOf(policy)
		if d.TLS != tlsIntercept || ic == nil {
			// The policy changed under the connection: it no longer
			// intercepts this name. Start over.
			ev.Reason = "policy updated: " + name + " is no longer intercepted"
			g.emit(ev)
			pc.cut()
			return
		}
		injected := make([]string, 0, len(d.Inject))
		for header, secret := range d.Inject {
			v, ok := ic.Secrets[secret]
			if !ok {
				deny(http.StatusBadGateway, fmt.Sprintf("secret %q of header %s is not set for the sandbox's org", secret, header))
				return
			}
			r.Header.Set(header, v)
			injected = append(injected, header)
		}
		sort.Strings(injected)
		ev.Allowed, ev.Reason = true, d.Reason
		if len(injected) > 0 {
			ev.Reason = strings.TrimPrefix(ev.Reason+"; injected "+strings.Join(injected, ", "), "; ")
		}
		g.emit(ev)
		rp.ServeHTTP(w, r)
	})
}

// httpError answers an intercepted request with a plain-text error the
// tool in the sandbox shows its user.
func httpError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Airlock-Egress", "denied")
	w.Header().Set("Content-Length", strconv.Itoa(len(msg)+len("airlock egress: \n")))
	w.WriteHeader(status)
	io.WriteString(w, "airlock egress: "+msg+"\n")
}

func isCertError(err error) bool {
	var (
		ua x509.UnknownAuthorityError
		ci x509.CertificateInvalidError
		hn x509.HostnameError
		cv *tls.CertificateVerificationError
	)
	return errors.As(err, &ua) || errors.As(err, &ci) || errors.As(err, &hn) || errors.As(err, &cv)
}
