package token

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
)

// FuzzVerify checks that no input but a token this key signed verifies, and
// that Verify never panics on hostile input (tokens arrive in headers and
// query strings from anyone). Claims that are signed come back unchanged.
func FuzzVerify(f *testing.F) {
	key := []byte("0123456789abcdef0123456789abcdef")
	now := time.Unix(1_800_000_000, 0)
	good, err := Sign(key, Claims{SandboxID: "sb-1", OrgID: "org-1", Scope: ScopeFiles, Expires: now.Unix() + 60})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good, "sb-1", ScopeFiles, int64(60))
	f.Add("v1..", "", "", int64(0))
	f.Add("v1.e30.", "x", ScopeCommand, int64(-1))
	f.Add(strings.Repeat("v1.", 100), "sb", ScopeEnvd, int64(1<<40))
	f.Fuzz(func(t *testing.T, tok, sid, scope string, ttl int64) {
		if ttl > 1<<40 || ttl < -(1<<40) {
			ttl %= 1 << 40 // now+ttl must not overflow
		}
		if c, err := Verify(key, tok, now); err == nil {
			again, serr := Sign(key, c)
			if serr != nil {
				t.Fatalf("verified claims do not sign: %v", serr)
			}
			if _, err := Verify(key, again, now); err != nil {
				t.Fatalf("re-signed claims do not verify: %v", err)
			}
			if tok != good {
				// Only an exact MAC over the payload passes; anything else
				// that verifies must at least carry a live expiry.
				if now.Unix() >= c.Expires {
					t.Fatalf("expired claims verified: %+v", c)
				}
			}
		}
		c := Claims{SandboxID: sid, OrgID: "org", Scope: scope, Expires: now.Unix() + ttl,
			Command: &model.CommandSpec{Argv: []string{sid}}}
		signed, err := Sign(key, c)
		if err != nil {
			return // claims that cannot be encoded (invalid UTF-8 is replaced, never an error)
		}
		got, err := Verify(key, signed, now)
		if ttl <= 0 {
			if err == nil {
				t.Fatalf("token with ttl %d verified", ttl)
			}
			return
		}
		if err != nil {
			t.Fatalf("signed token does not verify: %v", err)
		}
		if got.Kid != KeyID(key) {
			t.Fatalf("token names key %q, want %q", got.Kid, KeyID(key))
		}
		got.Kid = "" // Sign sets it
		if strings.ToValidUTF8(sid, "\uFFFD") == sid && strings.ToValidUTF8(scope, "\uFFFD") == scope && !reflect.DeepEqual(got, c) {
			t.Fatalf("claims changed: %+v != %+v", got, c)
		}
		if _, err := Verify([]byte("another key, another installation"), signed, now); err == nil {
			t.Fatal("token verified under another key")
		}
		if _, err := Verify(key, signed+"x", now); err == nil {
			t.Fatal("tampered token verified")
		}
	})
}
