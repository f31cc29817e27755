package fake_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock/airlock/internal/runtime/fake"
	"github.com/airlock/airlock/internal/runtime/runtimetest"
)

// template makes a small root filesystem: the agent (a script: the fake
// checks it is there and a program, it does not run it), the files the
// suite deletes (/bin/true, /etc/debian_version) and the usual dirs.
func template(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"bin", "etc", "tmp", "root", "home/user", "usr/local/bin"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		"usr/local/bin/airlock-agent": "#!/bin/sh\n",
		"bin/true":                    "#!/bin/sh\n",
		"etc/debian_version":          "12.0\n",
		"etc/hostname":                "template\n",
	}
	for p, c := range files {
		if err := os.WriteFile(filepath.Join(root, p), []byte(c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestConformance runs the runtime conformance suite against the fake, as
// gvisor and qemu run it; the checks that need a Linux guest skip, saying
// so (Options.Simulated). No root needed.
func TestConformance(t *testing.T) {
	runtimetest.Run(t, fake.New(nil), runtimetest.Options{RootFS: template(t), Simulated: true, SuspendWakeCycles: 3})
}
