package setup

import (
	"bytes"
	"compress/gzip"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/testenv"
)

func TestEnsureQEMU(t *testing.T) {
	testenv.RequireRoot(t, "apt-get")
	testenv.RequireTool(t, "apt-get", "Debian's package manager installs QEMU")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	agent := buildStatic(t, "init")
	var progress bytes.Buffer
	a, err := EnsureQEMU(ctx, testCacheDir, agent, &progress)
	if err != nil {
		t.Fatalf("EnsureQEMU: %v\n%s", err, progress.String())
	}
	t.Logf("assets %+v\n%s", a, progress.String())
	if !strings.HasSuffix(a.KernelRelease, "-cloud-amd64") {
		t.Errorf("kernel release %q, want a Debian cloud kernel", a.KernelRelease)
	}
	for _, p := range []string{a.QEMU, a.Kernel, a.Initrd} {
		if st, err := os.Stat(p); err != nil || st.Size() == 0 {
			t.Errorf("asset %s: %v", p, err)
		}
	}
	// The initramfs: /init is the agent, the modules are there in order.
	f, err := os.Open(a.Initrd)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("initramfs is not gzip: %v", err)
	}
	list := exec.Command("cpio", "-it", "--quiet")
	list.Stdin = zr
	out, err := list.Output()
	if err != nil {
		t.Fatalf("cpio -t: %v", err)
	}
	names := strings.Fields(string(out))
	want := []string{"init", "modules/00-virtio_ring.ko", "modules/08-overlay.ko", "dev", "proc", "sys"}
	for _, w := range want {
		found := false
		for _, n := range names {
			found = found || n == w
		}
		if !found {
			t.Errorf("initramfs lacks %s (has %v)", w, names)
		}
	}
	// Second call: cached, and it does not rebuild.
	progress.Reset()
	st1, _ := os.Stat(a.Initrd)
	start := time.Now()
	b, err := EnsureQEMU(ctx, testCacheDir, agent, &progress)
	if err != nil || b != a {
		t.Fatalf("second EnsureQEMU = %+v, %v; want %+v", b, err, a)
	}
	st2, _ := os.Stat(b.Initrd)
	if !st2.ModTime().Equal(st1.ModTime()) || progress.Len() > 0 {
		t.Errorf("second call rebuilt something: %s", progress.String())
	}
	t.Logf("second call %v", time.Since(start))
}
