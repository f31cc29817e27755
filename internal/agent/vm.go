package agent

// VM init mode: in a qemu sandbox the agent is the initramfs's /init. Stage
// one (VMBoot, in the initramfs) mounts proc/sys/devtmpfs, loads the virtio
// modules, mounts the template disk (read-only) and the sandbox disk
// (writable) under an overlayfs, moves to it as the new root and execs the
// template's own /usr/local/bin/airlock-agent as PID 1 again, with
// VMStageEnv set. Stage two serves the agent protocol on the virtio-serial
// port named agentapi.VMPortName (VMDialer).
//
// The kernel command line carries the parameters (agentapi.VMParams; the
// devices, words and handshake shared with the host are in
// internal/agentapi/vmlink.go), the network among them (vmnet.go).

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/agentapi"
)

const (
	// VMStageEnv is set (to "root") when stage one execs the template agent.
	VMStageEnv  = "AIRLOCK_VM_STAGE"
	vmAgentPath = "/usr/local/bin/airlock-agent"
)

// VMInitParams reports whether this process is stage one of VM init (PID 1
// with airlock.vm=1 and not yet re-executed from the new root); it mounts
// /proc to read the command line.
func VMInitParams() (agentapi.VMParams, bool) {
	if os.Getpid() != 1 || os.Getenv(VMStageEnv) != "" {
		return agentapi.VMParams{}, false
	}
	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		os.MkdirAll("/proc", 0o555)
		if unix.Mount("proc", "/proc", "proc", 0, "") != nil {
			return agentapi.VMParams{}, false
		}
		if b, err = os.ReadFile("/proc/cmdline"); err != nil {
			return agentapi.VMParams{}, false
		}
	}
	p := agentapi.ParseVMCmdline(string(b))
	return p, p.VM
}

// VMBoot is stage one. On success it does not return (it execs the
// template agent); on failure the caller powers the VM off.
func VMBoot(p agentapi.VMParams, log *slog.Logger) error {
	mounts := []struct{ src, dst, fstype string }{
		{"sysfs", "/sys", "sysfs"},
		{"devtmpfs", "/dev", "devtmpfs"},
	}
	for _, m := range mounts {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fstype, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	if err := loadModules("/modules", log); err != nil {
		return err
	}
	ro, err := waitDisk(agentapi.VMTemplateSerial, 60*time.Second)
	if err != nil {
		return err
	}
	rw, err := waitDisk(agentapi.VMDiskSerial, 60*time.Second)
	if err != nil {
		return err
	}
	for _, d := range []string{"/mnt/ro", "/mnt/rw", "/newroot"} {
		os.MkdirAll(d, 0o755)
	}
	if err := unix.Mount(ro, "/mnt/ro", "ext4", unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("mount template %s: %w", ro, err)
	}
	if err := unix.Mount(rw, "/mnt/rw", "ext4", 0, ""); err != nil {
		return fmt.Errorf("mount sandbox disk %s: %w", rw, err)
	}
	os.MkdirAll("/mnt/rw/upper", 0o755)
	os.MkdirAll("/mnt/rw/work", 0o755)
	if err := unix.Mount("overlay", "/newroot", "overlay", 0,
		"lowerdir=/mnt/ro,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work"); err != nil {
		return fmt.Errorf("mount overlay root: %w", err)
	}
	// Keep the layers reachable for debugging, and move the API mounts.
	for _, m := range []string{"/proc", "/sys", "/dev"} {
		dst := "/newroot" + m
		os.MkdirAll(dst, 0o755)
		if err := unix.Mount(m, dst, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s: %w", m, err)
		}
	}
	for _, m := range []struct{ src, dst, fstype, data string }{
		{"devpts", "/newroot/dev/pts", "devpts", "newinstance,ptmxmode=0666,mode=620,gid=5"},
		{"tmpfs", "/newroot/dev/shm", "tmpfs", "mode=1777"},
		{"tmpfs", "/newroot/run", "tmpfs", "mode=755"},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fstype, unix.MS_NOSUID, m.data); err != nil {
			log.Warn("vm init: mount", "dst", m.dst, "err", err)
		}
	}
	// switch_root: free the initramfs, make /newroot the root.
	os.RemoveAll("/modules")
	if err := os.Chdir("/newroot"); err != nil {
		return fmt.Errorf("chdir new root: %w", err)
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move new root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot new root: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return fmt.Errorf("chdir /: %w", err)
	}
	hostname := p.Hostname
	if hostname == "" {
		hostname = "sandbox"
	}
	if err := unix.Sethostname([]byte(hostname)); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	if err := linkUp("lo"); err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	if !p.Net.IsZero() {
		if err := vmNetwork(p.Net, log); err != nil {
			return fmt.Errorf("network: %w", err)
		}
	}
	env := []string{VMStageEnv + "=root", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
	argv := append([]string{vmAgentPath}, p.Args...)
	log.Info("vm init: starting the template agent", "root", ro, "disk", rw)
	err = unix.Exec(vmAgentPath, argv, env)
	return fmt.Errorf("exec %s: %w", vmAgentPath, err)
}

// loadModules insmods every *.ko in dir in name order (the set-up numbers
// them in dependency order).
func loadModules(dir string, log *slog.Logger) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("load modules: %w", err)
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".ko") {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return fmt.Errorf("load module %s: %w", n, err)
		}
		if err := unix.InitModule(b, ""); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("load module %s: %w", n, err)
		}
		log.Debug("vm init: module loaded", "module", n)
	}
	return nil
}

// waitDisk waits for the virtio disk whose serial is serial and returns its
// device node.
func waitDisk(serial string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		m, _ := filepath.Glob("/sys/block/vd*/serial")
		for _, p := range m {
			b, err := os.ReadFile(p)
			if err == nil && string(bytes.TrimSpace(b)) == serial {
				dev := "/dev/" + filepath.Base(filepath.Dir(p))
				if _, err := os.Stat(dev); err == nil {
					return dev, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("wait for disk %q: not found after %v", serial, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// linkUp sets IFF_UP on an interface.
func linkUp(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// VMPowerOff syncs and powers the VM off (QEMU then exits); used when init
// fails, since PID 1 must not exit.
func VMPowerOff() {
	unix.Sync()
	unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	for {
		time.Sleep(time.Hour)
	}
}

// vmPort finds the character device of the virtserialport named name.
func vmPort(name string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		m, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, p := range m {
			b, err := os.ReadFile(p)
			if err == nil && string(bytes.TrimSpace(b)) == name {
				dev := "/dev/" + filepath.Base(filepath.Dir(p))
				if _, err := os.Stat(dev); err == nil {
					return dev, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("virtio port %q: not found after %v", name, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
