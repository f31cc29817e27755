package egress

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"
)

// BenchmarkProxyHTTP measures a small HTTP request through the gateway
// against the same request sent directly, in the same run: on one
// kept-alive connection, and on a new connection per request (which
// pays admission: peek, policy, attribution, upstream dial).
func BenchmarkProxyHTTP(b *testing.B) {
	e := newEnv(b)
	e.attach("sb1", sb1, policyAll())
	e.resolve(sb1, "allowed.test")
	direct := func(keepAlive bool) *http.Client {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(sb1)}}
		return &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return d.DialContext(ctx, "tcp", e.httpDst.String())
			},
			DisableKeepAlives: !keepAlive,
		}}
	}
	gateway := func(keepAlive bool) *http.Client {
		c := e.client(sb1, e.httpDst)
		c.Transport.(*http.Transport).DisableKeepAlives = !keepAlive
		return c
	}
	for _, bc := range []struct {
		name      string
		keepAlive bool
	}{{"keepalive", true}, {"newconn", false}} {
		b.Run(bc.name, func(b *testing.B) {
			dc, gc := direct(bc.keepAlive), gateway(bc.keepAlive)
			var dDirect, dGateway time.Duration
			for b.Loop() {
				t0 := time.Now()
				if _, err := get(dc, "http://allowed.test/"); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if _, err := get(gc, "http://allowed.test/"); err != nil {
					b.Fatal(err)
				}
				dDirect += t1.Sub(t0)
				dGateway += time.Since(t1)
			}
			n := float64(b.N)
			b.ReportMetric(float64(dDirect.Nanoseconds())/n/1e3, "direct-µs/req")
			b.ReportMetric(float64(dGateway.Nanoseconds())/n/1e3, "gateway-µs/req")
			b.ReportMetric(float64((dGateway-dDirect).Nanoseconds())/n/1e3, "added-µs/req")
		})
	}
}
