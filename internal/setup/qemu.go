package setup

// Set-up of the qemu runtime (EnsureQEMU). Layout under dir:
//
//	qemu/kernel-<release>/vmlinuz         the Debian cloud kernel, unpacked with dpkg -x
//	qemu/kernel-<release>/modules/NN-*.ko the virtio/overlay modules, in load order
//	qemu/kernel-<release>.done            completion marker
//	qemu/initrd-<release>-<agent sha>.cpio.gz
//	                                      initramfs (image.BuildInitrd): /init is the static agent, /modules/*.ko
//
// The template images the driver boots from are built at run time by
// image.EnsureTemplateImage.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/airlock/airlock/internal/image"
)

// QEMUModules are the guest kernel modules the initramfs loads, in
// dependency order (paths under lib/modules/<release>/kernel, without .ko).
// The Debian cloud kernel builds virtio as modules; loading virtio before
// virtio_ring fails with "Unknown symbol virtio_break_device".
var QEMUModules = []string{
	"drivers/virtio/virtio_ring",
	"drivers/virtio/virtio",
	"drivers/virtio/virtio_mmio",
	"drivers/block/virtio_blk",
	"net/core/failover",
	"drivers/net/net_failover",
	"drivers/net/virtio_net",
	"drivers/char/virtio_console",
	"fs/overlayfs/overlay",
	"drivers/char/hw_random/virtio-rng",
}

// qemuPackages are the Debian packages the qemu runtime needs on the host.
var qemuPackages = map[string]string{ // command → package
	"qemu-system-x86_64": "qemu-system-x86",
	"cpio":               "cpio",
	"mkfs.ext4":          "e2fsprogs",
	"depmod":             "kmod",
	"nsenter":            "util-linux", // the launcher enters the sandbox's network namespace
}

// EnsureQEMU installs QEMU and the tools it needs (apt), downloads and
// unpacks the Debian cloud kernel (never installed on the host) and builds
// the initramfs around the static agent at agentPath. Everything is cached
// under dir; a second call only checks markers.
func EnsureQEMU(ctx context.Context, dir, agentPath string, progress io.Writer) (image.VMAssets, error) {
	var a image.VMAssets
	if err := checkStatic(agentPath); err != nil {
		return a, fmt.Errorf("qemu set-up: the agent is the guest's /init and must be static: %w", err)
	}
	agentSum, err := fileSHA256(agentPath)
	if err != nil {
		return a, fmt.Errorf("qemu set-up: %w", err)
	}
	if err := ensurePackages(ctx, progress); err != nil {
		return a, fmt.Errorf("qemu set-up: %w", err)
	}
	if a.QEMU, err = exec.LookPath("qemu-system-x86_64"); err != nil {
		return a, fmt.Errorf("qemu set-up: %w", err)
	}
	// Fast path: a release already unpacked and an initramfs for this agent.
	if rel, ok := cachedKernel(dir); ok {
		a.KernelRelease = rel
		a.Kernel = filepath.Join(dir, "qemu", "kernel-"+rel, "vmlinuz")
		a.Initrd = filepath.Join(dir, "qemu", "initrd-"+rel+"-"+agentSum[:16]+".cpio.gz")
		if _, err := os.Stat(a.Initrd); err == nil {
			return a, nil
		}
	}
	unlock, err := lock(dir)
	if err != nil {
		return a, fmt.Errorf("qemu set-up: %w", err)
	}
	defer unlock()
	rel, ok := cachedKernel(dir)
	if !ok {
		if rel, err = kernelRelease(ctx); err != nil {
			return a, fmt.Errorf("qemu set-up: %w", err)
		}
		if err := unpackKernel(ctx, dir, rel, progress); err != nil {
			return a, fmt.Errorf("qemu set-up: %w", err)
		}
	}
	kdir := filepath.Join(dir, "qemu", "kernel-"+rel)
	a.KernelRelease = rel
	a.Kernel = filepath.Join(kdir, "vmlinuz")
	a.Initrd = filepath.Join(dir, "qemu", "initrd-"+rel+"-"+agentSum[:16]+".cpio.gz")
	if _, err := os.Stat(a.Initrd); err == nil {
		return a, nil
	}
	progressf(progress, "qemu: building the initramfs around %s", agentPath)
	if err := image.BuildInitrd(ctx, filepath.Join(kdir, "modules"), agentPath, a.Initrd); err != nil {
		return a, fmt.Errorf("qemu set-up: %w", err)
	}
	return a, nil
}

// ensurePackages installs the missing Debian packages in one apt-get call.
func ensurePackages(ctx context.Context, progress io.Writer) error {
	var missing []string
	for cmd, pkg := range qemuPackages {
		if _, err := exec.LookPath(cmd); err != nil {
			if _, err := os.Stat(filepath.Join("/usr/sbin", cmd)); err == nil {
				continue // root's PATH may lack /usr/sbin in tests
			}
			missing = append(missing, pkg)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	progressf(progress, "qemu: installing %s", strings.Join(missing, " "))
	args := append([]string{"-o", "DPkg::Lock::Timeout=120", "install", "-y", "--no-install-recommends"}, missing...)
	cmd := exec.CommandContext(ctx, "apt-get", args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get install %s: %w\n%s", strings.Join(missing, " "), err, tail(out))
	}
	return nil
}

// cachedKernel returns the release of an unpacked kernel, if any.
func cachedKernel(dir string) (string, bool) {
	m, _ := filepath.Glob(filepath.Join(dir, "qemu", "kernel-*.done"))
	if len(m) == 0 {
		return "", false
	}
	return strings.TrimSuffix(strings.TrimPrefix(filepath.Base(m[len(m)-1]), "kernel-"), ".done"), true
}

var kernelDep = regexp.MustCompile(`Depends: linux-image-([0-9][^\s]*-cloud-amd64)`)

// kernelRelease resolves the release linux-image-cloud-amd64 points at in
// the installed package index.
func kernelRelease(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "apt-cache", "depends", "linux-image-cloud-amd64").CombinedOutput()
	if err != nil || !kernelDep.Match(out) {
		// The index may be empty on a fresh host.
		if uerr := exec.CommandContext(ctx, "apt-get", "-o", "DPkg::Lock::Timeout=120", "update").Run(); uerr != nil {
			return "", fmt.Errorf("apt-get update: %w", uerr)
		}
		out, err = exec.CommandContext(ctx, "apt-cache", "depends", "linux-image-cloud-amd64").CombinedOutput()
	}
	if err != nil {
		return "", fmt.Errorf("apt-cache depends linux-image-cloud-amd64: %w\n%s", err, tail(out))
	}
	m := kernelDep.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("resolve the cloud kernel: no linux-image-*-cloud-amd64 dependency in %q", tail(out))
	}
	return string(m[1]), nil
}

// unpackKernel downloads linux-image-<rel> (apt-get download, nothing is
// installed), unpacks it with dpkg -x and keeps vmlinuz and the modules.
func unpackKernel(ctx context.Context, dir, rel string, progress io.Writer) error {
	progressf(progress, "qemu: downloading the guest kernel linux-image-%s", rel)
	work, err := os.MkdirTemp(filepath.Join(dir), ".kernel-*")
	if err != nil {
		return fmt.Errorf("unpack kernel: %w", err)
	}
	defer os.RemoveAll(work)
	dl := exec.CommandContext(ctx, "apt-get", "download", "linux-image-"+rel)
	dl.Dir = work
	if out, err := dl.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get download linux-image-%s: %w\n%s", rel, err, tail(out))
	}
	debs, _ := filepath.Glob(filepath.Join(work, "linux-image-"+rel+"_*.deb"))
	if len(debs) != 1 {
		return fmt.Errorf("apt-get download linux-image-%s: found %d .deb files", rel, len(debs))
	}
	kroot := filepath.Join(work, "kroot")
	if out, err := exec.CommandContext(ctx, "dpkg", "-x", debs[0], kroot).CombinedOutput(); err != nil {
		return fmt.Errorf("dpkg -x: %w\n%s", err, tail(out))
	}
	// modules.dep is not shipped; generate it so the tree is complete for
	// anyone using modprobe on it (the initramfs loads by explicit order).
	if depmod, err := exec.LookPath("depmod"); err == nil {
		if out, err := exec.CommandContext(ctx, depmod, "-b", kroot, rel).CombinedOutput(); err != nil {
			return fmt.Errorf("depmod: %w\n%s", err, tail(out))
		}
	} else if out, err := exec.CommandContext(ctx, "/usr/sbin/depmod", "-b", kroot, rel).CombinedOutput(); err != nil {
		return fmt.Errorf("depmod: %w\n%s", err, tail(out))
	}
	kdir := filepath.Join(dir, "qemu", "kernel-"+rel)
	os.RemoveAll(kdir)
	if err := os.MkdirAll(filepath.Join(kdir, "modules"), 0o755); err != nil {
		return fmt.Errorf("unpack kernel: %w", err)
	}
	if err := copyFile(filepath.Join(kroot, "boot", "vmlinuz-"+rel), filepath.Join(kdir, "vmlinuz"), 0o644); err != nil {
		return fmt.Errorf("unpack kernel: vmlinuz: %w", err)
	}
	for i, m := range QEMUModules {
		src := filepath.Join(kroot, "lib", "modules", rel, "kernel", m+".ko")
		dst := filepath.Join(kdir, "modules", fmt.Sprintf("%02d-%s.ko", i, filepath.Base(m)))
		if err := copyFile(src, dst, 0o644); err != nil {
			return fmt.Errorf("unpack kernel: module %s: %w", m, err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "qemu", "kernel-"+rel+".done"), []byte(rel+"\n"), 0o644); err != nil {
		return fmt.Errorf("unpack kernel: marker: %w", err)
	}
	return nil
}

// tail returns the last lines of command output for error messages.
func tail(out []byte) string {
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > 10 {
		lines = lines[len(lines)-10:]
	}
	return strings.Join(lines, "\n")
}
