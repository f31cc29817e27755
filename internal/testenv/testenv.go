// Package testenv is how a test says what it needs. Each Require… function
// skips the test, loudly and naming what is missing, when the machine or
// the test tier does not give it; Short marks a test as too heavy for the
// fast tier.
//
// There are two tiers. `go test -short ./...` is the fast tier that
// developers run on every change: no root, no runsc, no QEMU, no network
// namespaces, no agent builds, no private PostgreSQL servers (pgtest uses
// one only when $AIRLOCK_TEST_POSTGRES_URL names it), nothing that takes
// more than a few seconds; the worker, controller and service run there on
// SQLite and the fake runtime. The full suite (`sudo ./scripts/test.sh`,
// which CI runs) runs everything, as root, against real runsc, QEMU,
// SQLite and PostgreSQL.
//
// Every skip says why: under -short "-short: needs root and runsc; the
// full suite (sudo ./scripts/test.sh) runs it", otherwise what to install
// or how to run it.
//
// The package imports only the standard library, so any test may use it.
package testenv

import (
	"flag"
	"os"
	"os/exec"
	"testing"
)

// FullSuite is how to run what the fast tier skips.
const FullSuite = "the full suite (sudo ./scripts/test.sh) runs it"

// short reports whether the fast tier runs. It parses the test flags if
// they are not yet parsed (from a TestMain, before m.Run).
func short() bool {
	if !flag.Parsed() {
		flag.Parse()
	}
	return testing.Short()
}

// ShortReason is the skip message of a test that is too heavy for the fast
// tier (why names what makes it heavy: "builds airlock-agent"), or "" when
// the full suite runs. For a TestMain; tests call Short.
func ShortReason(why string) string {
	if short() {
		return "-short: " + why + "; " + FullSuite
	}
	return ""
}

// Short skips tb in the fast tier; why names what makes it heavy.
func Short(tb testing.TB, why string) {
	tb.Helper()
	if r := ShortReason(why); r != "" {
		tb.Skip(r)
	}
}

// RootReason is the skip message of a test that needs root (why says what
// for: "creates cgroups"), or "" when it may run: as root and not under
// -short. For a TestMain; tests call RequireRoot.
func RootReason(why string) string {
	if r := ShortReason("needs root (" + why + ")"); r != "" {
		return r
	}
	if os.Geteuid() != 0 {
		return "needs root (" + why + "): run it as root, e.g. sudo ./scripts/test.sh"
	}
	return ""
}

// RequireRoot skips tb unless it runs as root, and always in the fast tier;
// why says what root is for.
func RequireRoot(tb testing.TB, why string) {
	tb.Helper()
	if r := RootReason(why); r != "" {
		tb.Skip(r)
	}
}

// RequireRunsc skips tb unless it may run real gVisor sandboxes: as root
// (runsc run, cgroups, mounts) and not in the fast tier. Finding or
// building runsc stays with the test's fixture (setup.EnsureRunsc).
func RequireRunsc(tb testing.TB) {
	tb.Helper()
	if r := ShortReason("needs root and runsc"); r != "" {
		tb.Skip(r)
	}
	RequireRoot(tb, "runsc run, cgroups, mounts")
}

// RequireQEMU skips tb unless it may run real QEMU microVMs: as root
// (network namespaces, apt-get for the QEMU packages) and not in the fast
// tier. Installing QEMU stays with the fixture (setup.EnsureQEMU).
func RequireQEMU(tb testing.TB) {
	tb.Helper()
	if r := ShortReason("needs root and QEMU"); r != "" {
		tb.Skip(r)
	}
	RequireRoot(tb, "network namespaces, apt-get")
}

// RequireTool returns the path of the named program on $PATH, or skips tb
// saying it is missing and what it is for.
func RequireTool(tb testing.TB, name, why string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		tb.Skipf("needs %s on $PATH (%s)", name, why)
	}
	return p
}

// RequireGoBuild returns the go tool for a test that builds a binary (what
// names it: "airlock-agent"); it skips in the fast tier, where a build of
// a whole command costs seconds to minutes, and without the go tool.
func RequireGoBuild(tb testing.TB, what string) string {
	tb.Helper()
	Short(tb, "builds "+what+" with the go tool")
	return RequireTool(tb, "go", "to build "+what)
}
