package egress

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/airlock/airlock/internal/tlsca"
)

// interceptEnv is a gateway whose sandbox sb1 intercepts tls.test (and
// intercept.test, whose upstream's certificate is for other names),
// injecting Authorization from the secret "api".
func interceptEnv(t *testing.T) (*env, *testPolicy, *Interception, *x509.CertPool) {
	e := newEnv(t)
	e.gw.cfg.UpstreamRoots = e.pool
	certPEM, keyPEM, err := tlsca.Generate("Airlock CA test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ca, err := tlsca.Parse(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	orgRoots := x509.NewCertPool()
	orgRoots.AppendCertsFromPEM(certPEM)
	p := allow("other.test")
	p.intercept["tls.test"] = true
	p.intercept["intercept.test"] = true
	p.inject = map[string]string{"Authorization": "api"}
	e.up.mu.Lock()
	e.up.zone["intercept.test."] = []dns.RR{rr(t, "intercept.test. 300 IN A 127.0.1.2")}
	e.up.mu.Unlock()
	ic := &Interception{CA: ca, Secrets: map[string]string{"api": "Bearer s3cret"}}
	if err := e.gw.Attach("sb1", netip.MustParseAddr(sb1), WithInterception(p, ic)); err != nil {
		t.Fatal(err)
	}
	e.resolve(sb1, "tls.test")
	e.resolve(sb1, "intercept.test")
	return e, p, ic, orgRoots
}

func (e *env) interceptClient(roots *x509.CertPool, h2 bool) *http.Client {
	c := e.client(sb1, e.tlsDst)
	tr := c.Transport.(*http.Transport)
	tr.TLSClientConfig = &tls.Config{RootCAs: roots}
	tr.ForceAttemptHTTP2 = h2
	if !h2 {
		tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
	}
	return c
}

func TestInterceptInjects(t *testing.T) {
	e, _, _, roots := interceptEnv(t)
	for _, h2 := range []bool{false, true} {
		c := e.interceptClient(roots, h2)
		req, _ := http.NewRequest("GET", "https://tls.test/headers", nil)
		req.Header.Set("Authorization", "Bearer from-the-guest")
		req.Header.Set("X-Guest", "kept")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("h2=%v: %v\n%s", h2, err, e.ev)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body := string(b)
		wantProto := "HTTP/1.1"
		if h2 {
			wantProto = "HTTP/2.0"
		}
		if resp.StatusCode != 200 || resp.Proto != wantProto {
			t.Fatalf("h2=%v: %s %s %q", h2, resp.Proto, resp.Status, body)
		}
		if !strings.Contains(body, `authorization="Bearer s3cret"`) || !strings.Contains(body, `x-guest="kept"`) || !strings.Contains(body, "host=tls.test") {
			t.Fatalf("h2=%v: upstream saw %q", h2, body)
		}
		if got := resp.TLS.PeerCertificates[0].Issuer.CommonName; got != "Airlock CA test" {
			t.Fatalf("leaf issued by %q", got)
		}
	}
	evs := e.ev.find(KindHTTP, true, "injected Authorization")
	if len(evs) < 2 || evs[0].Name != "tls.test" || evs[0].SandboxID != "sb1" {
		t.Fatalf("no allowed http events with the injection:\n%s", e.ev)
	}
	if strings.Contains(e.ev.String(), "s3cret") {
		t.Fatalf("secret value in an event:\n%s", e.ev)
	}
}

func TestInterceptRefusals(t *testing.T) {
	e, p, ic, roots := interceptEnv(t)
	t.Run("Host other than the SNI is misdirected", func(t *testing.T) {
		c := e.interceptClient(roots, false)
		req, _ := http.NewRequest("GET", "https://tls.test/headers", nil)
		req.Host = "other.test"
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMisdirectedRequest {
			t.Fatalf("status %s", resp.Status)
		}
		if len(e.ev.find(KindHTTP, false, "does not match the connection's SNI")) == 0 {
			t.Fatalf("no event:\n%s", e.ev)
		}
	})
	t.Run("upstream certificate not trusted", func(t *testing.T) {
		c := e.interceptClient(roots, false)
		resp, err := c.Get("https://intercept.test/headers")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(b), "not trusted") {
			t.Fatalf("%s %q", resp.Status, b)
		}
		if len(e.ev.find(KindHTTP, false, "upstream certificate for intercept.test is not trusted")) == 0 {
			t.Fatalf("no event:\n%s", e.ev)
		}
	})
	t.Run("guest that does not trust the CA", func(t *testing.T) {
		c := e.interceptClient(e.pool, false) // the upstream's CA, not the org's
		if _, err := c.Get("https://tls.test/headers"); err == nil {
			t.Fatal("request went through a leaf the client does not trust")
		}
		// The client gives up before the gateway reads its alert.
		for i := 0; len(e.ev.find(KindTCP, false, "does it trust the org's Airlock CA")) == 0; i++ {
			if i == 100 {
				t.Fatalf("no event:\n%s", e.ev)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	t.Run("missing secret", func(t *testing.T) {
		q := allow("other.test")
		q.intercept["tls.test"] = true
		q.inject = map[string]string{"Authorization": "nope"}
		if err := e.gw.Update("sb1", WithInterception(q, ic)); err != nil {
			t.Fatal(err)
		}
		defer e.gw.Update("sb1", WithInterception(p, ic))
		resp, err := e.interceptClient(roots, false).Get("https://tls.test/headers")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway || len(e.ev.find(KindHTTP, false, `secret "nope"`)) == 0 {
			t.Fatalf("%s\n%s", resp.Status, e.ev)
		}
	})
	t.Run("update to passthrough cuts the intercepted connection", func(t *testing.T) {
		c := e.interceptClient(roots, false)
		tr := c.Transport.(*http.Transport)
		tr.DisableKeepAlives = false
		resp, err := c.Get("https://tls.test/headers")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err := e.gw.Update("sb1", allow("tls.test", "other.test")); err != nil {
			t.Fatal(err)
		}
		if len(e.ev.find(KindTCP, false, "no longer intercepted")) == 0 {
			t.Fatalf("open intercepted connection not cut:\n%s", e.ev)
		}
		// A new connection is passed through: the client sees the
		// upstream's own certificate.
		resp, err = e.interceptClient(e.pool, false).Get("https://tls.test/headers")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), "s3cret") {
			t.Fatalf("passthrough injected: %q", b)
		}
	})
}

// TestHostAddrsNeverReachable: an address the host has now (Config.IsHostAddr,
// consulted on every decision) is refused in DNS answers and connections,
// whatever the policy says.
func TestHostAddrsNeverReachable(t *testing.T) {
	e := newEnv(t)
	host := netip.MustParseAddr("127.0.1.1")
	e.setHost(host)
	e.attach("sb1", sb1, allow("allowed.test").withCIDR("127.0.1.0/24"))
	if r := e.query(sb1, "allowed.test", dns.TypeA); r.Rcode != dns.RcodeRefused {
		t.Fatalf("a name resolving to a host address: %v", r)
	}
	expectReset(t, e.dial(sb1, e.httpDst))
	if len(e.ev.find(KindTCP, false, "is an address of the host")) == 0 {
		t.Fatalf("no event:\n%s", e.ev)
	}
	// Another address of the same CIDR is still reachable.
	if body, err := get(e.client(sb1, e.tlsDst), "https://tls.test/"); err != nil || !strings.Contains(body, "host=tls.test") {
		t.Fatalf("other address: %q %v", body, err)
	}
}
