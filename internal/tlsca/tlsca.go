// Package tlsca is an org's Airlock CA: the certificate authority whose
// leaf certificates the egress gateway presents when it intercepts a
// sandbox's TLS (NetworkPolicyV1 rules with "tls": "intercept").
//
// The server generates one CA per org (Generate) and keeps it; the CA
// certificate goes into every egress sandbox's trust store, the private
// key only to the gateway of a worker hosting a sandbox whose policy
// intercepts — never into a guest. The gateway issues leaves with Leaf:
// one ECDSA P-256 key per CA for all its leaves (a leaf's key protects
// nothing the CA key does not), each leaf valid for a day and cached
// until an hour before it expires.
package tlsca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"sync"
	"time"
)

// Lifetimes.
const (
	// CAValidity is how long a generated CA is valid.
	CAValidity = 10 * 365 * 24 * time.Hour
	// LeafValidity is how long an issued leaf is valid (it is also
	// backdated an hour, for clocks a little behind).
	LeafValidity = 24 * time.Hour
	// maxLeaves bounds the leaf cache of one CA (names are the
	// intercepted SNIs of its org's sandboxes).
	maxLeaves = 4096
)

// Generate makes a CA named commonName (ECDSA P-256, valid CAValidity
// from now, allowed to sign leaves only) and returns its certificate and
// private key, PEM-encoded.
func Generate(commonName string, now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, nil, err
	}
	tpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"Airlock"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CAValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

func serialNumber() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// CA issues leaf certificates. It is safe for concurrent use.
type CA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     crypto.Signer
	leafKey *ecdsa.PrivateKey

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// Parse reads a CA from its PEM certificate and PKCS#8 (or EC) private
// key, checking that they belong together and that the certificate may
// sign certificates.
func Parse(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, errors.New("tlsca: no PEM CERTIFICATE")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("tlsca: certificate: %w", err)
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("tlsca: the certificate is not a CA's")
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, errors.New("tlsca: no PEM private key")
	}
	var key any
	switch kb.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(kb.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(kb.Bytes)
	default:
		return nil, fmt.Errorf("tlsca: private key block %q", kb.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("tlsca: private key: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, errors.New("tlsca: the private key cannot sign")
	}
	if pk, ok := signer.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !pk.Equal(cert.PublicKey) {
		return nil, errors.New("tlsca: the private key is not the certificate's")
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, certPEM: pem.EncodeToMemory(cb), key: signer, leafKey: leafKey, leaves: map[string]*tls.Certificate{}}, nil
}

// CertPEM is the CA certificate, PEM-encoded (what guests trust).
func (ca *CA) CertPEM() []byte { return ca.certPEM }

// Certificate is the parsed CA certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// Fingerprint is the SHA-256 of the CA certificate, hex.
func (ca *CA) Fingerprint() string {
	sum := sha256.Sum256(ca.cert.Raw)
	return hex.EncodeToString(sum[:])
}

// Fingerprint is the SHA-256 of a PEM certificate's DER, hex ("" if
// certPEM holds no certificate).
func Fingerprint(certPEM []byte) string {
	b, _ := pem.Decode(certPEM)
	if b == nil {
		return ""
	}
	sum := sha256.Sum256(b.Bytes)
	return hex.EncodeToString(sum[:])
}

// Leaf returns a certificate for the DNS name name (canonical: lower
// case, no trailing dot), chained to the CA, issuing it if none cached is
// valid for at least another hour at now.
func (ca *CA) Leaf(name string, now time.Time) (*tls.Certificate, error) {
	if name == "" {
		return nil, errors.New("tlsca: a leaf needs a name")
	}
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c, ok := ca.leaves[name]; ok && now.Add(time.Hour).Before(c.Leaf.NotAfter) {
		return c, nil
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(LeafValidity)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	tpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca.cert, &ca.leafKey.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("tlsca: issue %s: %w", name, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: ca.leafKey, Leaf: leaf}
	if len(ca.leaves) >= maxLeaves {
		for n := range ca.leaves { // drop any one: the cache is a cache
			delete(ca.leaves, n)
			break
		}
	}
	ca.leaves[name] = c
	return c, nil
}
