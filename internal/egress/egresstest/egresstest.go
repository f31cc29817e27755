// Package egresstest is the testing face of internal/egress/testinet, the
// egress suites' own small internet: Start makes one for a test and
// removes it when the test ends, skipping without root. The names, types
// and helpers are testinet's (see there for what the internet holds).
package egresstest

import (
	"testing"

	"github.com/airlock/airlock/internal/egress/testinet"
	"github.com/airlock/airlock/internal/testenv"
)

// Zone and the names of the default zone (testinet's).
const (
	Zone    = testinet.Zone
	WWW     = testinet.WWW
	A       = testinet.A
	B       = testinet.B
	Other   = testinet.Other
	Rebind  = testinet.Rebind
	Loop    = testinet.Loop
	Meta    = testinet.Meta
	HostN   = testinet.HostN
	Six     = testinet.Six
	Missing = testinet.Missing
	BadTLS  = testinet.BadTLS
	UDPN    = testinet.UDPN
	// EchoPort is testinet's UDP echo port.
	EchoPort = testinet.EchoPort
)

type (
	Config   = testinet.Config
	Request  = testinet.Request
	Internet = testinet.Internet
)

// Name is testinet.Name: "www" → "www.test.airlock".
func Name(name string) string { return testinet.Name(name) }

// URL is testinet.URL.
func URL(scheme, name, path string) string { return testinet.URL(scheme, name, path) }

// New is testinet.New (the caller closes it).
func New(cfg Config) (*Internet, error) { return testinet.New(cfg) }

// Start makes the internet and closes it when tb ends. It skips tb
// without root.
func Start(tb testing.TB, cfg Config) *Internet {
	tb.Helper()
	testenv.RequireRoot(tb, "egresstest: a network namespace, a veth and servers in it")
	in, err := testinet.New(cfg)
	if err != nil {
		tb.Fatalf("egresstest: %v", err)
	}
	tb.Cleanup(func() {
		if err := in.Close(); err != nil {
			tb.Errorf("egresstest: close: %v", err)
		}
	})
	return in
}
