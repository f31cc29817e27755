package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/testenv"
)

// TestDeps keeps the agent static and small: only the standard library,
// golang.org/x/sys, the agent's own packages and its RPC runtime (connect-go
// and protobuf, for the envd services) may be linked.
func TestDeps(t *testing.T) {
	goBin := testenv.RequireTool(t, "go", "to list dependencies")
	out, err := exec.Command(goBin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	allowed := map[string]bool{
		"github.com/airlock/airlock/cmd/airlock-agent":   true,
		"github.com/airlock/airlock/internal/agent":      true,
		"github.com/airlock/airlock/internal/agentapi":   true,
		"github.com/airlock/airlock/internal/agent/envd": true,
		"connectrpc.com/connect":                         true,
	}
	allowedPrefixes := []string{
		"golang.org/x/sys/",
		"connectrpc.com/connect/internal/",
		"google.golang.org/protobuf/",
		"github.com/airlock/airlock/internal/envdpb/",
	}
	var seen int
	for _, pkg := range strings.Fields(string(out)) {
		seen++
		if allowed[pkg] || slices.ContainsFunc(allowedPrefixes, func(p string) bool { return strings.HasPrefix(pkg, p) }) {
			continue
		}
		t.Errorf("airlock-agent depends on %s; only the standard library, golang.org/x/sys, connect-go, protobuf and internal/{agent,agent/envd,agentapi,envdpb} are allowed", pkg)
	}
	if seen < 3 {
		t.Fatalf("go list found only %d non-standard packages (%q); expected at least the agent's own", seen, out)
	}
}
