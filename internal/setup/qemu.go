package setup

// Set-up of the qemu runtime (EnsureQEMU, EnsureTemplateImage). Layout under dir:
//
//	qemu/kernel-<release>/vmlinuz         the Debian cloud kernel, unpacked with dpkg -x
//	qemu/kernel-<release>/modules/NN-*.ko the virtio/overlay modules, in load order
//	qemu/kernel-<release>.done            completion marker
//	qemu/initrd-<release>-<agent sha>.cpio.gz
//	                                      initramfs: /init is the static agent, /modules/*.ko
//	images/<template digest>.ext4         a template's read-only root image (mkfs.ext4 -d)
//	images/<template digest>.ext4.done    completion marker

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
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

// QEMUAssets are the host files the qemu runtime boots from.
type QEMUAssets struct {
	QEMU          string // qemu-system-x86_64
	Kernel        string // vmlinuz of the Debian cloud kernel
	Initrd        string // gzip'ed newc initramfs, /init = airlock-agent
	KernelRelease string // e.g. "6.1.0-57-cloud-amd64", what uname -r prints in the guest
}

// EnsureQEMU installs QEMU and the tools it needs (apt), downloads and
// unpacks the Debian cloud kernel (never installed on the host) and builds
// the initramfs around the static agent at agentPath. Everything is cached
// under dir; a second call only checks markers.
func EnsureQEMU(ctx context.Context, dir, agentPath string, progress io.Writer) (QEMUAssets, error) {
	var a QEMUAssets
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
	if err := buildInitrd(ctx, filepath.Join(kdir, "modules"), agentPath, a.Initrd); err != nil {
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

// buildInitrd writes a gzip'ed newc cpio: /init (the agent), /modules/*.ko
// and the empty mount points the agent's VM init uses.
func buildInitrd(ctx context.Context, modules, agentPath, out string) error {
	tree, err := os.MkdirTemp(filepath.Dir(out), ".initrd-*")
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	defer os.RemoveAll(tree)
	for _, d := range []string{"dev", "proc", "sys", "newroot", "mnt/ro", "mnt/rw", "modules"} {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
	}
	if err := copyFile(agentPath, filepath.Join(tree, "init"), 0o755); err != nil {
		return fmt.Errorf("initramfs: agent: %w", err)
	}
	mods, err := os.ReadDir(modules)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	for _, m := range mods {
		if err := copyFile(filepath.Join(modules, m.Name()), filepath.Join(tree, "modules", m.Name()), 0o644); err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
	}
	var list bytes.Buffer
	err = filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(tree, p)
		list.WriteString(rel + "\n")
		return nil
	})
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	cpioPath, err := exec.LookPath("cpio")
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	defer os.Remove(tmp)
	zw, _ := gzip.NewWriterLevel(f, gzip.BestSpeed)
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, cpioPath, "--quiet", "-o", "-H", "newc", "-R", "0:0")
	cmd.Dir = tree
	cmd.Stdin = &list
	cmd.Stdout = zw
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		f.Close()
		return fmt.Errorf("initramfs: cpio: %w\n%s", err, stderr.Bytes())
	}
	if err := zw.Close(); err != nil {
		f.Close()
		return fmt.Errorf("initramfs: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	return os.Rename(tmp, out)
}

// templateDigestRe matches dir/templates/<digest>/rootfs.
var templateDigestRe = regexp.MustCompile(`/templates/([0-9a-f]{64})/rootfs/?$`)

// EnsureTemplateImage returns a read-only ext4 image of the template root
// filesystem rootfs, built once per template digest under dir/images with
// mkfs.ext4 -d (no loop mount). A rootfs that is a cached template
// (dir/templates/<digest>/rootfs) is keyed by that digest without hashing.
func EnsureTemplateImage(ctx context.Context, dir, rootfs string, progress io.Writer) (string, error) {
	st, err := os.Stat(rootfs)
	if err != nil {
		return "", fmt.Errorf("template image: %w", err)
	}
	if !st.IsDir() {
		return "", fmt.Errorf("template image: %s is not a directory", rootfs)
	}
	var digest string
	if m := templateDigestRe.FindStringSubmatch(filepath.Clean(rootfs)); m != nil {
		digest = m[1]
	} else if digest, _, err = Digest(rootfs); err != nil {
		return "", fmt.Errorf("template image: %w", err)
	}
	digest = strings.TrimPrefix(digest, "sha256:")
	img := filepath.Join(dir, "images", digest+".ext4")
	if _, err := os.Stat(img + ".done"); err == nil {
		return img, nil
	}
	unlock, err := lock(dir)
	if err != nil {
		return "", fmt.Errorf("template image: %w", err)
	}
	defer unlock()
	if _, err := os.Stat(img + ".done"); err == nil {
		return img, nil
	}
	if err := os.MkdirAll(filepath.Dir(img), 0o755); err != nil {
		return "", fmt.Errorf("template image: %w", err)
	}
	used, err := treeBytes(rootfs)
	if err != nil {
		return "", fmt.Errorf("template image: %w", err)
	}
	size := used + used/4 + 32<<20
	progressf(progress, "qemu: building the template image %s (%d MiB)", filepath.Base(img), size>>20)
	tmp := img + ".tmp"
	os.Remove(tmp)
	defer os.Remove(tmp)
	if err := MakeExt4(ctx, tmp, size, rootfs); err != nil {
		return "", fmt.Errorf("template image: %w", err)
	}
	if err := os.Rename(tmp, img); err != nil {
		return "", fmt.Errorf("template image: %w", err)
	}
	if err := os.WriteFile(img+".done", []byte(rootfs+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("template image: marker: %w", err)
	}
	return img, nil
}

// MakeExt4 creates a sparse ext4 image of size bytes at path, filled from
// the directory from when it is not empty.
func MakeExt4(ctx context.Context, path string, size int64, from string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("create ext4 image: %w", err)
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		return fmt.Errorf("create ext4 image: %w", err)
	}
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		mkfs = "/usr/sbin/mkfs.ext4"
	}
	// No journal: the template is read-only, and the per-sandbox disk is
	// thrown away with the sandbox; it also keeps images small.
	args := []string{"-q", "-F", "-O", "^has_journal", "-E", "root_owner=0:0"}
	if from != "" {
		args = append(args, "-d", from)
	}
	args = append(args, path)
	if out, err := exec.CommandContext(ctx, mkfs, args...).CombinedOutput(); err != nil {
		os.Remove(path)
		return fmt.Errorf("mkfs.ext4 %s: %w\n%s", path, err, tail(out))
	}
	return nil
}

// treeBytes is the allocated size of a tree plus an inode's worth per entry.
func treeBytes(root string) (int64, error) {
	var n int64
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		n += 512
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		} else {
			n += info.Size()
		}
		return nil
	})
	return n, err
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
