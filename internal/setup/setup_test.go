package setup

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/image"
	"github.com/airlock/airlock/internal/testenv"
)

// testCacheDir is shared by every test run on the machine so the Debian
// layer is debootstrapped once.
const testCacheDir = "/var/tmp/airlock-test-cache"

// buildStatic compiles a tiny static Go program printing msg.
func buildStatic(t *testing.T, msg string) string {
	t.Helper()
	testenv.RequireTool(t, "go", "to build a static test binary")
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "go.mod"), []byte("module hello\ngo 1.26\n"), 0o644)
	os.WriteFile(filepath.Join(src, "main.go"), []byte("package main\nfunc main() { println(\""+msg+"\") }\n"), 0o644)
	out := filepath.Join(t.TempDir(), "hello")
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build static binary: %v\n%s", err, b)
	}
	return out
}

func TestEnsureRunscReuse(t *testing.T) {
	static := buildStatic(t, "runsc")
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "bin"), 0o755)
	b, _ := os.ReadFile(static)
	os.WriteFile(filepath.Join(dir, "bin/runsc"), b, 0o755)

	t.Setenv(RunscEnv, "")
	t.Setenv("PATH", "") // a rebuild would need go and fail

	t.Run("stale marker needs go", func(t *testing.T) {
		os.WriteFile(filepath.Join(dir, "bin/runsc.version"), []byte(RunscModule+"@v0.0.0-old\n"), 0o644)
		_, err := EnsureRunsc(context.Background(), dir, nil)
		if err == nil || !strings.Contains(err.Error(), "install Go 1.26") {
			t.Fatalf("err = %v, want a hint to install Go", err)
		}
	})
	t.Run("current marker is reused", func(t *testing.T) {
		os.WriteFile(filepath.Join(dir, "bin/runsc.version"), []byte(runscMarker()+"\n"), 0o644)
		var progress bytes.Buffer
		p, err := EnsureRunsc(context.Background(), dir, &progress)
		if err != nil {
			t.Fatal(err)
		}
		if p != filepath.Join(dir, "bin/runsc") {
			t.Errorf("path = %s", p)
		}
		if progress.Len() != 0 {
			t.Errorf("reuse printed progress: %q", progress.String())
		}
	})
	t.Run("env override static", func(t *testing.T) {
		t.Setenv(RunscEnv, static)
		p, err := EnsureRunsc(context.Background(), t.TempDir(), nil)
		if err != nil || p != static {
			t.Fatalf("EnsureRunsc = %q, %v; want %q", p, err, static)
		}
	})
	t.Run("env override dynamic", func(t *testing.T) {
		t.Setenv(RunscEnv, "/bin/ls") // Debian's ls has an ELF interpreter
		_, err := EnsureRunsc(context.Background(), t.TempDir(), nil)
		if !errors.Is(err, errDynamic) {
			t.Fatalf("err = %v, want errDynamic", err)
		}
	})
}

// TestEnsureRunscBuild really builds the pinned runsc from the Go module
// proxy (about a minute; skipped with -short).
func TestEnsureRunscBuild(t *testing.T) {
	testenv.RequireGoBuild(t, "runsc from the module proxy")
	t.Setenv(RunscEnv, "")
	dir := t.TempDir()
	var progress bytes.Buffer
	p, err := EnsureRunsc(context.Background(), dir, &progress)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkStatic(p); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(p, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "spec:") {
		t.Fatalf("runsc --version: %v: %s", err, out)
	}
	// The generated registration names each precompiled program by its
	// configuration key; upstream's Go build has none, and builds the key
	// only at run time.
	bin, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{
		`GOARCH="amd64" Platform="systrap" HostNetwork=false HostNetworkRawSockets=false HostFilesystem=true`,
		`GOARCH="amd64" Platform="systrap" HostNetwork=false HostNetworkRawSockets=false HostFilesystem=false`,
	} {
		if goruntime.GOARCH == "amd64" && !bytes.Contains(bin, []byte(key)) {
			t.Errorf("runsc has no precompiled seccomp program for %s", key)
		}
	}
	if m, err := os.ReadFile(p + ".version"); err != nil || strings.TrimSpace(string(m)) != runscMarker() {
		t.Errorf("version marker = %q, %v; want %q", m, err, runscMarker())
	}
	if m, _ := filepath.Glob(filepath.Join(dir, ".runsc-build-*")); len(m) > 0 {
		t.Errorf("build dirs left behind: %v", m)
	}
	t.Logf("progress:\n%s", progress.String())
}

func TestEnsureDebianTemplate(t *testing.T) {
	testenv.RequireRoot(t, "debootstrap, chown")
	agentA := buildStatic(t, "agent A")
	ctx := context.Background()
	var progress bytes.Buffer
	t1, root1, _, err := ensureDebianTemplate(ctx, testCacheDir, agentA, &progress)
	if err != nil {
		t.Fatalf("first: %v\nprogress:\n%s", err, progress.String())
	}
	t.Logf("progress:\n%s", progress.String())
	layerDone := filepath.Join(testCacheDir, "cache", layerName+".done")
	doneBefore, err := os.Stat(layerDone)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("fast path", func(t *testing.T) {
		t2, root2, built, err := ensureDebianTemplate(ctx, testCacheDir, agentA, nil)
		if err != nil {
			t.Fatal(err)
		}
		if built {
			t.Error("second call rebuilt the template")
		}
		if t2 != t1 || root2 != root1 {
			t.Errorf("second call = %+v %s, want %+v %s", t2, root2, t1, root1)
		}
	})
	t.Run("contents", func(t *testing.T) {
		if t1.Name != DebianName || t1.Tag != DebianTag || t1.SizeBytes < 100<<20 {
			t.Errorf("template = %+v", t1)
		}
		if root1 != image.TemplateRootFS(testCacheDir, t1.Digest) {
			t.Errorf("rootfs %s != TemplateRootFS %s", root1, image.TemplateRootFS(testCacheDir, t1.Digest))
		}
		agent := filepath.Join(root1, guestAgentPath)
		fi, err := os.Stat(agent)
		if err != nil || fi.Mode().Perm() != 0o755 {
			t.Fatalf("agent in template: %v %v", fi, err)
		}
		a, _ := os.ReadFile(agentA)
		g, _ := os.ReadFile(agent)
		if !bytes.Equal(a, g) {
			t.Error("agent in template differs from the source")
		}
		passwd, _ := os.ReadFile(filepath.Join(root1, "etc/passwd"))
		if !strings.Contains(string(passwd), "\nuser:x:1000:1000::/home/user:/bin/bash\n") {
			t.Errorf("no default user in passwd:\n%s", passwd)
		}
		for _, bin := range []string{"bin/bash", "usr/bin/python3", "usr/bin/git", "usr/bin/curl", "bin/ps"} {
			if _, err := os.Stat(filepath.Join(root1, bin)); err != nil {
				t.Errorf("template lacks %s: %v", bin, err)
			}
		}
		if m, _ := filepath.Glob(filepath.Join(root1, "var/cache/apt/archives/*.deb")); len(m) > 0 {
			t.Errorf("apt archives not stripped: %d debs", len(m))
		}
		if m, _ := filepath.Glob(filepath.Join(root1, "var/lib/apt/lists/*_Packages")); len(m) > 0 {
			t.Errorf("apt lists not stripped: %v", m)
		}
		d, _, err := image.Digest(root1)
		if err != nil || d != t1.Digest {
			t.Errorf("recomputed digest %s (%v), stored %s", d, err, t1.Digest)
		}
	})
	t.Run("other agent, other template, same layer", func(t *testing.T) {
		agentB := buildStatic(t, "agent B")
		t3, root3, built, err := ensureDebianTemplate(ctx, testCacheDir, agentB, nil)
		if err != nil {
			t.Fatal(err)
		}
		if t3.Digest == t1.Digest || root3 == root1 {
			t.Errorf("different agents share template %s", t3.Digest)
		}
		_ = built // true the first time this agent is seen on this machine
		doneAfter, err := os.Stat(layerDone)
		if err != nil || !doneAfter.ModTime().Equal(doneBefore.ModTime()) {
			t.Errorf("Debian layer was rebuilt")
		}
		list, err := image.ListTemplates(testCacheDir)
		if err != nil {
			t.Fatal(err)
		}
		found := 0
		for _, tt := range list {
			if tt.Digest == t1.Digest || tt.Digest == t3.Digest {
				found++
			}
		}
		if found != 2 {
			t.Errorf("ListTemplates found %d of 2: %+v", found, list)
		}
	})
}
