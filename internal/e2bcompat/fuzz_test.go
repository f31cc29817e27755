package e2bcompat

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// FuzzSandboxTarget feeds the router's sandbox recognition arbitrary Host
// and E2B routing headers (anyone can send them): it must never panic, and
// a target it accepts names a sandbox and a valid TCP port.
func FuzzSandboxTarget(f *testing.F) {
	f.Add("49983-sb-abc.airlock.local", "", "")
	f.Add("localhost:7070", "sb-abc", "8000")
	f.Add("0-sb.x", "", "")
	f.Add("65536-sb.x", " sb ", "-1")
	f.Add("99999999999999999999-sb.example", "", "")
	f.Add("[::1]:80", "", "")
	f.Fuzz(func(t *testing.T, host, id, port string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Host = host
		if id != "" {
			r.Header.Set(HeaderSandboxID, id)
		}
		if port != "" {
			r.Header.Set(HeaderSandboxPort, port)
		}
		tg, ok, err := sandboxTarget(r)
		if !ok || err != nil {
			return
		}
		if tg.sandboxID == "" || tg.port < 1 || tg.port > 65535 {
			t.Fatalf("accepted %+v from host %q, id %q, port %q", tg, host, id, port)
		}
	})
}

// FuzzCheckSignature checks E2B file-URL signatures against arbitrary query
// strings: never a panic, and never accepted unless the signature is the
// one computed over the path, operation, user and expiry with the token.
func FuzzCheckSignature(f *testing.F) {
	const tok = "envd-token"
	now := time.Unix(1_800_000_000, 0)
	f.Add("path=/home/user/a&username=user&signature=v1_x", "GET")
	f.Add("path=/a&signature=v1_x&signature_expiration=notanumber", "POST")
	f.Add("signature=&path=", "GET")
	f.Fuzz(func(t *testing.T, query, method string) {
		if method != http.MethodGet && method != http.MethodPost {
			method = http.MethodGet
		}
		r := &http.Request{Method: method, URL: &url.URL{Path: "/files", RawQuery: query}}
		if err := checkSignature(r, tok, now); err == nil {
			q := r.URL.Query()
			if !strings.HasPrefix(q.Get("signature"), "v1_") {
				t.Fatalf("accepted signature %q", q.Get("signature"))
			}
			// Accepted only if it is the signature of another request's
			// fields with the same token: recompute with a wrong token.
			if err := checkSignature(r, tok+"x", now); err == nil {
				t.Fatalf("signature %q accepted for two tokens", q.Get("signature"))
			}
		}
	})
}
