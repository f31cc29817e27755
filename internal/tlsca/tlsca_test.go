package tlsca

import (
	"crypto/x509"
	"strings"
	"testing"
	"time"
)

func TestGenerateParseLeaf(t *testing.T) {
	now := time.Now()
	certPEM, keyPEM, err := Generate("Airlock CA test-org", now)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := Parse(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if ca.Fingerprint() != Fingerprint(certPEM) || len(ca.Fingerprint()) != 64 {
		t.Fatalf("fingerprints %q %q", ca.Fingerprint(), Fingerprint(certPEM))
	}
	leaf, err := ca.Leaf("api.example.com", now)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.example.com", Roots: roots, CurrentTime: now}); err != nil {
		t.Fatalf("leaf does not verify against the CA: %v", err)
	}
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "other.example.com", Roots: roots, CurrentTime: now}); err == nil {
		t.Fatal("leaf verifies for another name")
	}
	again, _ := ca.Leaf("api.example.com", now.Add(time.Minute))
	if again != leaf {
		t.Fatal("leaf not cached")
	}
	later, _ := ca.Leaf("api.example.com", now.Add(LeafValidity-30*time.Minute))
	if later == leaf {
		t.Fatal("a leaf expiring within the hour was served from the cache")
	}
	if _, err := ca.Leaf("", now); err == nil {
		t.Fatal("leaf without a name issued")
	}
}

func TestParseRejects(t *testing.T) {
	now := time.Now()
	c1, k1, _ := Generate("one", now)
	c2, k2, _ := Generate("two", now)
	for _, tc := range []struct {
		name       string
		cert, key  []byte
		wantSubstr string
	}{
		{"mismatched key", c1, k2, "not the certificate's"},
		{"no cert", nil, k1, "CERTIFICATE"},
		{"no key", c2, []byte("junk"), "private key"},
		{"key as cert", k1, k1, "CERTIFICATE"},
	} {
		if _, err := Parse(tc.cert, tc.key); err == nil || !strings.Contains(err.Error(), tc.wantSubstr) {
			t.Errorf("%s: err %v, want %q", tc.name, err, tc.wantSubstr)
		}
	}
}
