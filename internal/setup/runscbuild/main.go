//go:build ignore

// The runsc command, built by internal/setup in a module of its own (this
// directory, with go.mod.in) so that the build can add what gVisor's own
// Bazel build generates: precompiled seccomp programs. Same as upstream's
// runsc/main.go otherwise.
package main

import (
	"gvisor.dev/gvisor/runsc/cli/maincli"
	"gvisor.dev/gvisor/runsc/version"
)

// version.Version is set by the linker in release builds; referencing it
// keeps it linked in.
var _ = version.Version()

func main() { maincli.Main() }
