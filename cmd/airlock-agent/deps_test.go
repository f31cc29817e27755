package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps keeps the agent static and small: only the standard library,
// golang.org/x/sys and the agent's own packages may be linked.
func TestDeps(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("needs the go tool in PATH")
	}
	out, err := exec.Command(goBin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	allowed := map[string]bool{
		"github.com/airlock/airlock/cmd/airlock-agent": true,
		"github.com/airlock/airlock/internal/agent":    true,
		"github.com/airlock/airlock/internal/agentapi": true,
	}
	var seen int
	for _, pkg := range strings.Fields(string(out)) {
		seen++
		if allowed[pkg] || strings.HasPrefix(pkg, "golang.org/x/sys/") {
			continue
		}
		t.Errorf("airlock-agent depends on %s; only the standard library, golang.org/x/sys and internal/{agent,agentapi} are allowed", pkg)
	}
	if seen < 3 {
		t.Fatalf("go list found only %d non-standard packages (%q); expected at least the agent's own", seen, out)
	}
}
