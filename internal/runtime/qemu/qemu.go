// Package qemu is the runtime driver that runs every sandbox in its own
// QEMU "microvm" with its own guest kernel (the Debian cloud kernel that
// internal/setup.EnsureQEMU unpacks; the driver gets its files as
// image.VMAssets and builds template images with internal/image, never
// importing the installers: a test keeps it so). It uses KVM where a probe guest boots
// with it and TCG (software emulation) elsewhere; on hosts whose /dev/kvm
// cannot boot stock kernels (PVM) that is TCG.
//
// Guest: the initramfs's /init is airlock-agent in VM init mode (see
// internal/agent/vm.go). It mounts the template image (virtio-blk,
// read-only, serial agentapi.VMTemplateSerial, one image per template shared
// by all its sandboxes) under an overlayfs whose upper layer is on the
// sandbox's own writable disk (serial agentapi.VMDiskSerial, an ext4 image
// the host creates), switches to it and serves the agent protocol on the
// virtserialport agentapi.VMPortName; the host side is a unix-socket chardev
// (see internal/agentapi/vmlink.go for the devices, the kernel command line
// and the handshake that starts every session). The driver imports only
// that contract, never the guest agent itself (a test keeps it so).
//
// Per sandbox the driver owns RunDir/<id>/:
//
//	state.json   what the driver needs after a worker restart (spec, image, accel, cmdline)
//	qemu.pid     QEMU's pid (-pidfile); QEMU runs in its own session, confined
//	             (seccomp, -runas airlock-qemu, its own cgroup: confine.go)
//	qmp.sock     QMP (stop/cont/query-status/migrate)
//	agent.sock   the agent channel (chardev socket, QEMU listens)
//	disk.ext4    the writable disk (sparse)
//	mem.ram      guest RAM (memory-backend-file, share=on) so that a suspend
//	             migrates device state only (x-ignore-shared)
//	serial.log   the guest console; qemu.log QEMU's own messages (both cut
//	             at 1 MiB, the tail kept in <file>.1: internal/logcap)
//
// Delete releases all of it, also after a crash of the worker or of QEMU.
//
// The network is not the driver's: the worker's internal/network makes the
// sandbox's namespace (lo, and the tap behind the guest's virtio-net eth0;
// nothing routed beyond it, or with egress the tap bridged to the egress
// gateway) and hands it over in runtime.Spec.Network, and releases it
// after Delete. QEMU runs in that namespace (nsenter --net) and opens that
// tap, with the NIC's MAC the network names; a Spec without a namespace and
// one tap is refused. A network with guest addresses (egress) goes to the
// guest on the kernel command line (airlock.net=, agentapi.VMNet), where
// the agent configures eth0 and /etc/resolv.conf at boot. A snapshot keeps
// the guest's configuration in its memory, so a restore must be handed the
// same addresses and MAC (internal/network's are fixed); one that is not is
// refused, which makes a template image built without egress rebuilt for
// a worker with it instead of waking guests with no network.
package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/cgroup"
	"github.com/airlock/airlock/internal/image"
	"github.com/airlock/airlock/internal/logcap"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime"
)

// Name is the driver name reported to the control plane.
const Name = "qemu"

// Accelerators.
const (
	AccelAuto = "auto" // probe KVM once, fall back to TCG
	AccelKVM  = "kvm"
	AccelTCG  = "tcg"
)

// Config configures the driver.
type Config struct {
	Assets   image.VMAssets // from setup.EnsureQEMU
	CacheDir string         // data dir: template images are built under it (image.EnsureTemplateImage)
	RunDir   string         // per-sandbox directories
	Accel    string         // auto (default), kvm or tcg
	DiskMiB  int            // size of each sandbox's writable disk (sparse); default 4096
	// ProbeTimeout bounds the KVM probe boot (default 5 s; a real KVM host boots it in well under one).
	ProbeTimeout time.Duration
	// User is the unprivileged user QEMU drops to (-runas) once it has
	// opened its files; default airlock-qemu, created if missing.
	User string
	// CgroupParent is the parent of every VM's cgroup (qemu-<id>); default /airlock.
	CgroupParent string
	Logger       *slog.Logger
}

// Driver runs sandboxes as QEMU microVMs.
type Driver struct {
	cfg Config
	log *slog.Logger

	accelOnce sync.Once
	accel     string

	// cg is the host's cgroup layout, cgErr why none was found.
	cg    cgroup.Hierarchy
	cgErr error

	mu     sync.Mutex
	locks  map[string]*sync.Mutex
	images map[string]string // template rootfs → its ext4 image (templates are immutable)
}

var (
	_ runtime.Driver      = (*Driver)(nil)
	_ runtime.Pauser      = (*Driver)(nil)
	_ runtime.Snapshotter = (*Driver)(nil)
	_ runtime.Describer   = (*Driver)(nil)
)

// New checks the configuration and returns a driver.
func New(cfg Config) (*Driver, error) {
	if cfg.Accel == "" {
		cfg.Accel = AccelAuto
	}
	if cfg.DiskMiB == 0 {
		cfg.DiskMiB = 4096
	}
	if cfg.ProbeTimeout == 0 {
		cfg.ProbeTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.User == "" {
		cfg.User = DefaultUser
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = DefaultCgroupParent
	}
	if !filepath.IsAbs(cfg.CgroupParent) || cfg.CgroupParent == "/" {
		return nil, fmt.Errorf("qemu config: cgroup parent %q must be an absolute path other than /: %w", cfg.CgroupParent, model.ErrInvalid)
	}
	switch cfg.Accel {
	case AccelAuto, AccelKVM, AccelTCG:
	default:
		return nil, fmt.Errorf("qemu config: accel %q is not auto, kvm or tcg: %w", cfg.Accel, model.ErrInvalid)
	}
	for name, p := range map[string]string{"run dir": cfg.RunDir, "cache dir": cfg.CacheDir} {
		if !filepath.IsAbs(p) {
			return nil, fmt.Errorf("qemu config: %s %q must be an absolute path: %w", name, p, model.ErrInvalid)
		}
	}
	for name, p := range map[string]string{"qemu": cfg.Assets.QEMU, "kernel": cfg.Assets.Kernel, "initramfs": cfg.Assets.Initrd} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("qemu config: %s: %w", name, err)
		}
	}
	if err := os.MkdirAll(cfg.RunDir, 0o700); err != nil {
		return nil, fmt.Errorf("qemu config: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, _, err := ensureSystemUser(ctx, cfg.User); err != nil {
		return nil, fmt.Errorf("qemu config: QEMU runs as user %s: %w", cfg.User, err)
	}
	d := &Driver{cfg: cfg, log: cfg.Logger, locks: map[string]*sync.Mutex{}, images: map[string]string{}}
	d.cg, d.cgErr = cgroup.Detect(cgroup.DefaultRoot)
	go d.capLogs()
	return d, nil
}

func (d *Driver) Name() string { return Name }

// Info is what the qemu runtime declares: pause, suspend and wake, template
// images (one image restored under many ids: Fork), and a network device.
// Its Checkpoint can leave a guest running (runtimetest's Fork does), but
// it does not declare LeaveRunning: checkpoints, rollback, forks of a
// checkpoint and export/import stay gvisor's for now (docs/api.md), and
// this is the one line that opens them.
var Info = runtime.Info{Name: Name, Caps: runtime.Caps{Pause: true, Snapshot: true, Fork: true, Network: true}}

// Describe returns Info.
func (d *Driver) Describe(context.Context) runtime.Info { return Info }

// PreferredForAuto: "auto" sandboxes go to qemu only where hardware KVM
// boots guests; under TCG emulation gVisor is far faster.
func (d *Driver) PreferredForAuto(ctx context.Context) bool { return d.Accel(ctx) == "kvm" }

// lock serialises operations on one sandbox.
func (d *Driver) lock(id string) func() {
	d.mu.Lock()
	m, ok := d.locks[id]
	if !ok {
		m = &sync.Mutex{}
		d.locks[id] = m
	}
	d.mu.Unlock()
	m.Lock()
	return m.Unlock
}

// state is RunDir/<id>/state.json.
type state struct {
	ID        string `json:"id"`
	RootFS    string `json:"rootfs"`
	Image     string `json:"image"`
	MemoryMiB int    `json:"memory_mib"`
	VCPUs     int    `json:"vcpus"`
	DiskMiB   int    `json:"disk_mib,omitempty"` // the writable disk's size; 0: Config.DiskMiB
	Accel     string `json:"accel"`
	Append    string `json:"append"`
	// Network is the namespace QEMU runs in and the tap behind the NIC,
	// as handed over in the spec (a restore takes the new spec's).
	Network runtime.Network `json:"network"`
}

func (d *Driver) dir(id string) string { return filepath.Join(d.cfg.RunDir, id) }

// The guest NIC's MAC when the network names none: the same in every
// sandbox (each has its own namespace), so snapshots restore anywhere.
// (internal/network's egress networks name this one too.)
const guestMAC = "52:54:00:a1:70:01"

// checkNetwork accepts the network a VM needs: a namespace and one link
// (the tap its NIC attaches to), with at most a MAC, one IPv4 address and
// a gateway for the guest (an egress network: guestNet).
func checkNetwork(n runtime.Network) error {
	if n.Namespace == "" || !filepath.IsAbs(n.Namespace) || len(n.Interfaces) != 1 || n.Interfaces[0].Name == "" || strings.ContainsAny(n.Interfaces[0].Name, ", \t\n") {
		return fmt.Errorf("network %+v: a VM needs a network namespace with one tap (runtime.Spec.Network, made by internal/network): %w", n, model.ErrInvalid)
	}
	if m := n.Interfaces[0].MAC; m != "" {
		if hw, err := net.ParseMAC(m); err != nil || len(hw) != 6 || hw[0]&1 != 0 {
			return fmt.Errorf("network: guest MAC %q is not a unicast Ethernet address: %w", m, model.ErrInvalid)
		}
	}
	if len(n.Interfaces[0].Addresses) > 0 || n.Gateway.IsValid() || len(n.Nameservers) > 0 {
		g := guestNet(n)
		if _, err := agentapi.ParseVMNet(g.String()); err != nil || len(n.Interfaces[0].Addresses) != 1 {
			return fmt.Errorf("network: guest addresses %v via %s (resolvers %v): want one IPv4 prefix and a gateway in it: %w",
				n.Interfaces[0].Addresses, n.Gateway, n.Nameservers, model.ErrInvalid)
		}
	}
	return nil
}

// guestNet is what the guest configures on its NIC (agentapi.VMNet, on
// the kernel command line): zero for a network without addresses (the
// isolated tap: eth0 stays down).
func guestNet(n runtime.Network) agentapi.VMNet {
	if len(n.Interfaces) != 1 || len(n.Interfaces[0].Addresses) == 0 {
		return agentapi.VMNet{}
	}
	return agentapi.VMNet{Addr: n.Interfaces[0].Addresses[0], Gateway: n.Gateway, DNS: n.Nameservers}
}

// nicMAC is the MAC of the guest's NIC on network n.
func nicMAC(n runtime.Network) string {
	if len(n.Interfaces) == 1 && n.Interfaces[0].MAC != "" {
		return strings.ToLower(n.Interfaces[0].MAC)
	}
	return guestMAC
}

func validID(id string) error {
	if id == "" || len(id) > 64 || strings.ContainsAny(id, "/ \t\n.") {
		return fmt.Errorf("sandbox id %q: %w", id, model.ErrInvalid)
	}
	return nil
}

func readState(dir string) (state, error) {
	var st state
	b, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(b, &st)
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// Accel returns the accelerator in use, probing KVM once for "auto".
func (d *Driver) Accel(ctx context.Context) string {
	d.accelOnce.Do(func() {
		switch d.cfg.Accel {
		case AccelKVM, AccelTCG:
			d.accel = d.cfg.Accel
		default:
			start := time.Now()
			err := d.probeKVM(ctx)
			if err == nil {
				d.accel = AccelKVM
			} else {
				d.accel = AccelTCG
			}
			d.log.Info("qemu: accelerator chosen", "accel", d.accel, "kvm_probe", errString(err), "probe_time", time.Since(start).Round(time.Millisecond))
		}
	})
	return d.accel
}

func errString(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// probeKVM boots the guest kernel with KVM and waits for it to reach
// userspace ("Run /init") on the serial console within ProbeTimeout.
func (d *Driver) probeKVM(ctx context.Context) error {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open /dev/kvm: %w", err)
	}
	f.Close()
	ctx, cancel := context.WithTimeout(ctx, d.cfg.ProbeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.cfg.Assets.QEMU, "-M", "microvm", "-accel", "kvm", "-cpu", "host,-arch-capabilities",
		"-m", "128", "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-kernel", d.cfg.Assets.Kernel, "-initrd", d.cfg.Assets.Initrd,
		"-append", "console=ttyS0 panic=-1 airlock.probe=1", "-serial", "stdio")
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// The probe must die with us: a worker killed mid-probe would otherwise
	// leave a guest spinning in KVM's instruction emulator forever.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start probe: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return fmt.Errorf("probe guest exited (%v) before userspace: %s", err, lastLine(out.String()))
		case <-tick.C:
			if strings.Contains(out.String(), "Run /init as init process") {
				cmd.Process.Kill()
				<-done
				return nil
			}
		case <-ctx.Done():
			cmd.Process.Kill()
			<-done
			return fmt.Errorf("probe guest did not reach userspace within %v", d.cfg.ProbeTimeout)
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}

// checkAgent verifies the template carries an executable ELF agent, since
// the guest execs it as PID 1.
func checkAgent(rootfs string) error {
	p := filepath.Join(rootfs, "usr/local/bin/airlock-agent")
	st, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("template %s: %w", rootfs, err)
	}
	if !st.Mode().IsRegular() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("template %s: the agent is not an executable file: %w", rootfs, model.ErrInvalid)
	}
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("template %s: %w", rootfs, err)
	}
	defer f.Close()
	magic := make([]byte, 4)
	if _, err := f.Read(magic); err != nil || string(magic) != "\x7fELF" {
		return fmt.Errorf("template %s: the agent is not an ELF program: %w", rootfs, model.ErrInvalid)
	}
	return nil
}

// Start creates the sandbox's disk and boots its VM in spec.Network.
func (d *Driver) Start(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	if err := validID(spec.ID); err != nil {
		return nil, fmt.Errorf("qemu start: %w", err)
	}
	if strings.ContainsAny(spec.Hostname, " \t\n=") {
		return nil, fmt.Errorf("qemu start: hostname %q: %w", spec.Hostname, model.ErrInvalid)
	}
	if err := checkNetwork(spec.Network); err != nil {
		return nil, fmt.Errorf("qemu start %s: %w", spec.ID, err)
	}
	if spec.WritableRoot {
		return nil, runtime.Unsupported(Name, "build", "run template build steps")
	}
	unlock := d.lock(spec.ID)
	defer unlock()
	dir := d.dir(spec.ID)
	if _, err := os.Lstat(dir); err == nil {
		return nil, fmt.Errorf("qemu start %s: %w", spec.ID, model.ErrConflict)
	}
	if err := checkAgent(spec.RootFS); err != nil {
		return nil, fmt.Errorf("qemu start %s: %w", spec.ID, err)
	}
	img, err := d.image(ctx, spec.RootFS)
	if err != nil {
		return nil, fmt.Errorf("qemu start %s: %w", spec.ID, err)
	}
	st := state{
		ID: spec.ID, RootFS: spec.RootFS, Image: img,
		MemoryMiB: max(spec.MemoryMiB, 64), VCPUs: max(spec.VCPUs, 1),
		DiskMiB: spec.DiskMiB,
		Accel:   d.Accel(ctx),
		Append:  kernelCmdline(spec),
		Network: spec.Network,
	}
	sb, err := d.boot(ctx, st, "")
	if err != nil {
		d.deleteLocked(context.WithoutCancel(ctx), spec.ID)
		return nil, fmt.Errorf("qemu start %s: %w", spec.ID, err)
	}
	return sb, nil
}

// image returns the template's ext4 image, building it on first use.
func (d *Driver) image(ctx context.Context, rootfs string) (string, error) {
	d.mu.Lock()
	img, ok := d.images[rootfs]
	d.mu.Unlock()
	if ok {
		if _, err := os.Stat(img); err == nil {
			return img, nil
		}
	}
	img, err := image.EnsureTemplateImage(ctx, d.cfg.CacheDir, rootfs, nil)
	if err != nil {
		return "", err
	}
	d.mu.Lock()
	d.images[rootfs] = img
	d.mu.Unlock()
	return img, nil
}

func kernelCmdline(spec runtime.Spec) string {
	parts := []string{"console=ttyS0", "quiet", "tsc_early_khz=2000000", "panic=-1", "reboot=t", "airlock.vm=1"}
	if spec.Hostname != "" {
		parts = append(parts, "airlock.hostname="+spec.Hostname)
	}
	if g := guestNet(spec.Network); !g.IsZero() {
		parts = append(parts, "airlock.net="+g.String())
	}
	if len(spec.AgentArgs) > 0 {
		parts = append(parts, "airlock.args="+agentapi.VMCmdlineArgs(spec.AgentArgs))
	}
	return strings.Join(parts, " ")
}

// boot prepares the run dir and starts QEMU. With snapshot != "" it copies
// the snapshot's RAM and disk and starts QEMU waiting for the migration.
func (d *Driver) boot(ctx context.Context, st state, snapshot string) (*sandbox, error) {
	dir := d.dir(st.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := writeJSON(filepath.Join(dir, "state.json"), st); err != nil {
		return nil, fmt.Errorf("write state: %w", err)
	}
	if snapshot == "" {
		// The guest's writable disk is exactly its disk_mib: a full disk
		// is ENOSPC inside the guest, and the sparse file on the host
		// never grows past it.
		diskMiB := st.DiskMiB
		if diskMiB <= 0 {
			diskMiB = d.cfg.DiskMiB
		}
		if err := image.MakeExt4(ctx, filepath.Join(dir, "disk.ext4"), int64(diskMiB)<<20, ""); err != nil {
			return nil, err
		}
	} else {
		for _, f := range []string{"disk.ext4", "mem.ram"} {
			if err := sparseCopy(ctx, filepath.Join(snapshot, f), filepath.Join(dir, f)); err != nil {
				return nil, err
			}
		}
	}
	args := d.qemuArgs(st, dir)
	if snapshot != "" {
		args = append(args, "-incoming", "defer")
	}
	// Confined (confine.go): seccomp, an unprivileged user, its own cgroup.
	if err := d.launch(ctx, st, dir, args); err != nil {
		return nil, err
	}
	return d.handle(st.ID), nil
}

// qemuArgs is the QEMU command line of a sandbox (without -incoming); a
// restore must use exactly the same devices.
func (d *Driver) qemuArgs(st state, dir string) []string {
	accel := []string{"-accel", "tcg,tb-size=32", "-cpu", "qemu64"}
	if st.Accel == AccelKVM {
		accel = []string{"-accel", "kvm", "-cpu", "host,-arch-capabilities"}
	}
	// The guest kernel keeps some RAM for itself; give it that on top so
	// MemTotal inside is about what was asked for.
	mem := st.MemoryMiB + guestOverheadMiB
	p := func(name string) string { return filepath.Join(dir, name) }
	args := []string{"-name", "airlock-" + st.ID, "-M", "microvm,memory-backend=mem0"}
	args = append(args, accel...)
	args = append(args,
		"-m", strconv.Itoa(mem)+"M", "-smp", strconv.Itoa(st.VCPUs),
		"-object", fmt.Sprintf("memory-backend-file,id=mem0,size=%dM,mem-path=%s,share=on", mem, p("mem.ram")),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-kernel", d.cfg.Assets.Kernel, "-initrd", d.cfg.Assets.Initrd, "-append", st.Append,
		// append=on (O_APPEND): the driver cuts the file (logcap) and QEMU
		// goes on writing at its new end.
		"-chardev", "file,id=console,path="+p("serial.log")+",append=on",
		"-serial", "chardev:console",
		"-drive", "id=tmpl,file="+st.Image+",format=raw,if=none,readonly=on",
		"-device", "virtio-blk-device,drive=tmpl,serial="+agentapi.VMTemplateSerial,
		"-drive", "id=disk,file="+p("disk.ext4")+",format=raw,if=none,discard=unmap,file.auto-read-only=off",
		"-device", "virtio-blk-device,drive=disk,serial="+agentapi.VMDiskSerial,
		"-netdev", "tap,id=net0,ifname="+st.Network.Interfaces[0].Name+",script=no,downscript=no",
		"-device", "virtio-net-device,netdev=net0,mac="+nicMAC(st.Network),
		"-device", "virtio-serial-device,max_ports=2",
		"-chardev", "socket,id=agent,path="+p("agent.sock")+",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name="+agentapi.VMPortName,
		"-object", "rng-random,id=rng0,filename=/dev/urandom",
		"-device", "virtio-rng-device,rng=rng0",
		"-qmp", "unix:"+p("qmp.sock")+",server=on,wait=off",
		"-pidfile", p("qemu.pid"),
	)
	return append(args, d.confineArgs()...)
}

// guestOverheadMiB is RAM the guest kernel reserves (kernel image, memmap):
// a microvm guest reports about this much less than -m as MemTotal (measured: 237720 kB with -m 272M).
const guestOverheadMiB = 40

// pid returns QEMU's pid if that process is alive and is this sandbox's.
func (d *Driver) pid(id string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(d.dir(id), "qemu.pid"))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	return pid, d.isOurs(pid, id)
}

// isOurs reports whether pid is a live (not zombie) process whose command
// line names this sandbox's run dir.
func (d *Driver) isOurs(pid int, id string) bool {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(cmdline, []byte(d.dir(id)+"/")) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
		return false
	}
	return true
}

// processesOf lists every live process whose command line names the run
// dir of id (QEMU, or an nsenter that has not exec'ed yet).
func (d *Driver) processesOf(id string) []int {
	var pids []int
	paths, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range paths {
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if d.isOurs(pid, id) {
			pids = append(pids, pid)
		}
	}
	for _, pid := range d.cgroupPids(id) {
		if !slices.Contains(pids, pid) && pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}

func (d *Driver) handle(id string) *sandbox {
	s := &sandbox{d: d, id: id, dir: d.dir(id), free: make(chan struct{}, 1), closed: make(chan struct{})}
	s.free <- struct{}{}
	return s
}

// Adopt reattaches to a sandbox whose QEMU is still running.
func (d *Driver) Adopt(ctx context.Context, id string) (runtime.Sandbox, error) {
	if err := validID(id); err != nil {
		return nil, fmt.Errorf("qemu adopt: %w", err)
	}
	if _, err := readState(d.dir(id)); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("qemu adopt %s: %w", id, runtime.ErrNotFound)
		}
		return nil, fmt.Errorf("qemu adopt %s: %w", id, err)
	}
	if _, ok := d.pid(id); !ok {
		return nil, fmt.Errorf("qemu adopt %s: qemu is not running", id)
	}
	return d.handle(id), nil
}

// Delete kills QEMU and removes its cgroup and the run dir. Idempotent.
// The network namespace is internal/network's to release.
func (d *Driver) Delete(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return fmt.Errorf("qemu delete: %w", err)
	}
	unlock := d.lock(id)
	defer unlock()
	return d.deleteLocked(ctx, id)
}

func (d *Driver) deleteLocked(ctx context.Context, id string) error {
	var errs []error
	for attempt := 0; ; attempt++ {
		pids := d.processesOf(id)
		if len(pids) == 0 {
			break
		}
		if attempt == 200 { // 10 s
			errs = append(errs, fmt.Errorf("qemu delete %s: processes %v survive SIGKILL", id, pids))
			break
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := d.removeCgroup(id); err != nil {
		errs = append(errs, fmt.Errorf("qemu delete %s: %w", id, err))
	}
	if err := os.RemoveAll(d.dir(id)); err != nil {
		errs = append(errs, fmt.Errorf("qemu delete %s: %w", id, err))
	}
	return errors.Join(errs...)
}

// List returns the ids with a run dir.
func (d *Driver) List(ctx context.Context) ([]string, error) {
	ents, err := os.ReadDir(d.cfg.RunDir)
	if err != nil {
		return nil, fmt.Errorf("qemu list: %w", err)
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// Status maps QEMU's run state: a dead QEMU (crash, guest panic, poweroff
// with -no-reboot) is stopped.
func (d *Driver) Status(ctx context.Context, id string) (runtime.Status, error) {
	if err := validID(id); err != nil {
		return "", fmt.Errorf("qemu status: %w", err)
	}
	if _, err := os.Lstat(d.dir(id)); errors.Is(err, os.ErrNotExist) {
		return runtime.StatusGone, nil
	}
	if _, ok := d.pid(id); !ok {
		return runtime.StatusStopped, nil
	}
	st, err := d.queryStatus(ctx, id)
	if err != nil {
		if _, ok := d.pid(id); !ok {
			return runtime.StatusStopped, nil
		}
		return "", fmt.Errorf("qemu status %s: %w", id, err)
	}
	return mapStatus(st), nil
}

func mapStatus(s string) runtime.Status {
	switch s {
	case "running":
		return runtime.StatusRunning
	case "paused", "suspended", "inmigrate", "postmigrate", "prelaunch", "finish-migrate", "save-vm", "restore-vm", "debug", "colo":
		return runtime.StatusPaused
	default: // shutdown, guest-panicked, internal-error, io-error, watchdog
		return runtime.StatusStopped
	}
}

func (d *Driver) queryStatus(ctx context.Context, id string) (string, error) {
	var r struct {
		Status string `json:"status"`
	}
	if err := d.qmp(ctx, id, "query-status", nil, &r); err != nil {
		return "", err
	}
	return r.Status, nil
}

// Pause stops the guest's vCPUs (QMP stop).
func (d *Driver) Pause(ctx context.Context, id string) error {
	unlock := d.lock(id)
	defer unlock()
	if err := d.qmp(ctx, id, "stop", nil, nil); err != nil {
		return fmt.Errorf("qemu pause %s: %w", id, err)
	}
	return nil
}

// Resume continues a paused guest (QMP cont).
func (d *Driver) Resume(ctx context.Context, id string) error {
	unlock := d.lock(id)
	defer unlock()
	if err := d.qmp(ctx, id, "cont", nil, nil); err != nil {
		return fmt.Errorf("qemu resume %s: %w", id, err)
	}
	return nil
}

// sparseCopy copies a file keeping holes (guest RAM and disks are sparse).
func sparseCopy(ctx context.Context, src, dst string) error {
	if out, err := exec.CommandContext(ctx, "cp", "--sparse=always", "--reflink=auto", src, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("copy %s: %w: %s", filepath.Base(src), err, bytes.TrimSpace(out))
	}
	return nil
}

// StopReason explains why a stopped sandbox's VM ended, from its serial
// console and QEMU's log: "guest kernel panic: ..." or "qemu exited". It
// returns "" while QEMU runs or when nothing is known.
func (d *Driver) StopReason(id string) string {
	if validID(id) != nil {
		return ""
	}
	if _, ok := d.pid(id); ok {
		return ""
	}
	dir := d.dir(id)
	if _, err := os.Lstat(dir); err != nil {
		return ""
	}
	// Only the tail, cut lines: the console is the guest's to write.
	d.capLogsOf(id)
	serial := logcap.Tail(filepath.Join(dir, "serial.log"), reasonScan)
	const panicMark = "Kernel panic - not syncing: "
	if i := bytes.LastIndex(serial, []byte(panicMark)); i >= 0 {
		return "guest kernel panic: " + strings.TrimSuffix(cutLine(serial, i+len(panicMark)), " ]---")
	}
	if i := bytes.LastIndex(serial, []byte("vm init failed")); i >= 0 {
		return "guest " + cutLine(serial, i)
	}
	if b := bytes.TrimSpace(logcap.Tail(filepath.Join(dir, "qemu.log"), 4096)); len(b) > 0 {
		i := bytes.LastIndexByte(b, '\n') + 1
		return "qemu exited: " + cutLine(b, i)
	}
	return "qemu exited"
}
