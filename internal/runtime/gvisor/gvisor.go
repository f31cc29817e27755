// Package gvisor is the runtime driver that runs every sandbox under gVisor's
// runsc (OCI "run --detach", systrap platform by default).
//
// Per sandbox the driver owns RunDir/<id>/:
//
//	bundle/config.json   the OCI spec (root = the shared template, never written)
//	chan/agent.sock      the host listener the in-guest agent dials; chan/ is
//	                     bind-mounted read-only at agentapi.ChannelDir and runsc
//	                     runs with --host-uds=open so the guest may connect
//	overlay/             the --overlay2 filestore: guest writes go to disk
//	runsc.log            stdio of runsc and of the agent (opened O_APPEND;
//	                     cut at 1 MiB, its tail kept in runsc.log.1: logcap)
//
// and the cgroup CgroupParent/<id> (cgroup v1: in every hierarchy; v2: the
// one unified cgroup; internal/cgroup finds which). Delete releases all
// of it even when Start failed half-way or an earlier worker process crashed.
//
// Pause does what `runsc pause` does — the sentry's "containerManager.Pause"
// over its control socket, status "paused" in runsc's state file — in
// process (~0.8 ms instead of ~7.5 ms for the runsc CLI; control.go);
// Resume undoes it the same way. (Freezing the sandbox's cgroup instead,
// ~0.3 ms, was tried and removed: the cgroup freezer stops the sentry and
// its systrap stubs at arbitrary points, and under a guest forking in a loop
// sandboxes died, in the conformance suite about once in 50 pause/resume
// rounds.)
package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/cgroup"
	"github.com/airlock/airlock/internal/logcap"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime"
)

// Name is the driver name reported to the control plane.
const Name = "gvisor"

// Config configures the driver.
type Config struct {
	RunscPath    string // a statically linked runsc
	StateDir     string // runsc --root
	RunDir       string // per-sandbox directories
	Platform     string // runsc --platform; default "systrap"
	CgroupParent string // parent of every sandbox cgroup; default "/airlock"
	Logger       *slog.Logger
}

// Validate checks the configuration after defaults are applied.
func (c *Config) Validate() error {
	if c.RunscPath == "" {
		return fmt.Errorf("gvisor config: runsc path is required: %w", model.ErrInvalid)
	}
	for name, dir := range map[string]string{"state dir": c.StateDir, "run dir": c.RunDir, "cgroup parent": c.CgroupParent} {
		if !filepath.IsAbs(dir) {
			return fmt.Errorf("gvisor config: %s %q must be an absolute path: %w", name, dir, model.ErrInvalid)
		}
	}
	if c.CgroupParent == "/" {
		return fmt.Errorf("gvisor config: cgroup parent must not be the root cgroup: %w", model.ErrInvalid)
	}
	switch c.Platform {
	case "systrap", "ptrace", "kvm":
	default:
		return fmt.Errorf("gvisor config: unknown platform %q (want systrap, ptrace or kvm): %w", c.Platform, model.ErrInvalid)
	}
	return nil
}

func (c *Config) setDefaults() {
	if c.Platform == "" {
		c.Platform = "systrap"
	}
	if c.CgroupParent == "" {
		c.CgroupParent = "/airlock"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Driver runs sandboxes with runsc.
type Driver struct {
	cfg Config
	log *slog.Logger

	// cg is the host's cgroup layout (v1 or v2), cgErr why none was found.
	cg    cgroup.Hierarchy
	cgErr error

	mu      sync.Mutex
	handles map[string]*sandbox // live handles created by this process
	locks   map[string]*idLock  // per-id locks (see lock)
}

var (
	_ runtime.Driver      = (*Driver)(nil)
	_ runtime.Pauser      = (*Driver)(nil)
	_ runtime.Snapshotter = (*Driver)(nil)
	_ runtime.Describer   = (*Driver)(nil)
	_ runtime.Sandbox     = (*sandbox)(nil)
)

// New returns a driver. It creates StateDir and RunDir if needed.
func New(cfg Config) (*Driver, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if _, err := os.Stat(cfg.RunscPath); err != nil {
		return nil, fmt.Errorf("gvisor: runsc binary: %w", err)
	}
	for _, dir := range []string{cfg.StateDir, cfg.RunDir} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("gvisor: create %s: %w", dir, err)
		}
	}
	d := &Driver{cfg: cfg, log: cfg.Logger, handles: map[string]*sandbox{}, locks: map[string]*idLock{}}
	d.cg, d.cgErr = cgroup.Detect(cgroup.DefaultRoot)
	go d.capLogs()
	return d, nil
}

// Name returns "gvisor".
func (d *Driver) Name() string { return Name }

// Info is what the gvisor runtime declares: pause, suspend and wake,
// checkpoints that leave the sandbox running, restores under new ids; no
// network device (--network=none: loopback only).
var Info = runtime.Info{Name: Name, Caps: runtime.Caps{Pause: true, Snapshot: true, LeaveRunning: true, Fork: true, Build: true}}

// Describe returns Info.
func (d *Driver) Describe(context.Context) runtime.Info { return Info }

// maxSocketPath is the usable length of sockaddr_un.sun_path.
const maxSocketPath = 107

func (d *Driver) sandboxDir(id string) string { return filepath.Join(d.cfg.RunDir, id) }
func (d *Driver) chanDir(id string) string    { return filepath.Join(d.sandboxDir(id), "chan") }
func (d *Driver) socketPath(id string) string {
	return filepath.Join(d.chanDir(id), agentapi.ChannelSocket)
}

// validID rejects ids that could escape RunDir or confuse runsc.
func validID(id string) error {
	if id == "" || len(id) > 64 || strings.ContainsAny(id, "/\\ \t\n\x00") || id == "." || id == ".." {
		return fmt.Errorf("gvisor: invalid sandbox id %q: %w", id, model.ErrInvalid)
	}
	return nil
}

// Start creates and starts a sandbox. On failure nothing of it is left.
func (d *Driver) Start(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	return d.launch(ctx, "start", spec, func(bundle string) []string {
		return []string{"run", "--detach", "--bundle", bundle, spec.ID}
	})
}

// validSpec checks what Start and Restore need from a spec.
func (d *Driver) validSpec(verb string, spec runtime.Spec) error {
	if err := validID(spec.ID); err != nil {
		return err
	}
	if spec.VCPUs <= 0 || spec.MemoryMiB <= 0 {
		return fmt.Errorf("gvisor: %s %s: vcpus and memory must be positive: %w", verb, spec.ID, model.ErrInvalid)
	}
	if fi, err := os.Stat(filepath.Join(spec.RootFS, strings.TrimPrefix(agentPath, "/"))); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("gvisor: %s %s: root filesystem %q has no agent at %s: %w", verb, spec.ID, spec.RootFS, agentPath, model.ErrInvalid)
	}
	if !filepath.IsAbs(spec.RootFS) {
		return fmt.Errorf("gvisor: %s %s: root filesystem %q must be absolute: %w", verb, spec.ID, spec.RootFS, model.ErrInvalid)
	}
	// The sandbox's network is gVisor's netstack: with loopback only
	// (--network=none, in the fresh namespace runsc makes) for the zero
	// Network, or on the namespace it is handed (an egress network of
	// internal/network: --network=sandbox takes its interface, address and
	// route into the netstack; see sandboxArgs).
	if n := spec.Network; n.Namespace == "" && len(n.Interfaces) > 0 || n.Namespace != "" && !filepath.IsAbs(n.Namespace) {
		return fmt.Errorf("gvisor: %s %s: network %+v: a namespace path is needed with interfaces: %w", verb, spec.ID, n, model.ErrInvalid)
	}
	if len(d.socketPath(spec.ID)) > maxSocketPath {
		return fmt.Errorf("gvisor: %s %s: socket path %s is longer than %d bytes; use a shorter run dir: %w",
			verb, spec.ID, d.socketPath(spec.ID), maxSocketPath, model.ErrInvalid)
	}
	return nil
}

// launch lays out RunDir/<id> (bundle, channel listener, overlay dir, log)
// and runs runsc with the sandbox flags followed by command(bundle): "run"
// for Start, "restore" for Restore. On failure nothing of the sandbox is
// left.
func (d *Driver) launch(ctx context.Context, verb string, spec runtime.Spec, command func(bundle string) []string) (_ runtime.Sandbox, err error) {
	if err := d.validSpec(verb, spec); err != nil {
		return nil, err
	}
	dir := d.sandboxDir(spec.ID)
	// Mkdir (not MkdirAll) claims the id: a second Start of the same id fails
	// here without touching the first sandbox.
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("gvisor: %s %s: sandbox exists: %w", verb, spec.ID, model.ErrConflict)
		}
		return nil, fmt.Errorf("gvisor: %s %s: create run dir: %w", verb, spec.ID, err)
	}
	defer func() {
		if err != nil {
			// A fresh context: the caller's may be what failed the start.
			if cerr := d.cleanup(context.WithoutCancel(ctx), spec.ID); cerr != nil {
				err = errors.Join(err, fmt.Errorf("clean up after failed %s: %w", verb, cerr))
			}
		}
	}()

	for _, sub := range []string{"bundle", "chan", "overlay"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("gvisor: %s %s: create %s dir: %w", verb, spec.ID, sub, err)
		}
	}
	diskMiB := spec.DiskMiB
	if diskMiB <= 0 {
		diskMiB = DefaultDiskMiB
	}
	// Recorded, so that an in-place restore limits the overlay the same way.
	if err := os.WriteFile(filepath.Join(dir, diskFile), []byte(strconv.Itoa(diskMiB)), 0o600); err != nil {
		return nil, fmt.Errorf("gvisor: %s %s: %w", verb, spec.ID, err)
	}
	// The guest agent runs as root inside the sandbox, but the gofer may
	// not: let it traverse the channel dir.
	if err := os.Chmod(d.chanDir(spec.ID), 0o711); err != nil {
		return nil, fmt.Errorf("gvisor: %s %s: chmod channel dir: %w", verb, spec.ID, err)
	}
	sb, err := d.listen(spec.ID)
	if err != nil {
		return nil, fmt.Errorf("gvisor: %s %s: %w", verb, spec.ID, err)
	}
	defer func() {
		if err != nil {
			sb.Close()
		}
	}()

	ospec := buildSpec(spec, d.cfg.CgroupParent, d.chanDir(spec.ID))
	if err := d.writeNetwork(spec, &ospec); err != nil {
		return nil, fmt.Errorf("gvisor: %s %s: %w", verb, spec.ID, err)
	}
	if verb == "restore" {
		// Recorded first, so that Adopt applies it after a worker crash
		// right after the restore.
		q := strconv.FormatInt(int64(spec.VCPUs)*cpuPeriod, 10)
		if err := os.WriteFile(filepath.Join(dir, cpuQuotaFile), []byte(q), 0o600); err != nil {
			return nil, fmt.Errorf("gvisor: %s %s: %w", verb, spec.ID, err)
		}
		// A restore loads the guest's memory and kernel state inside the
		// sandbox's cgroup: with the sandbox's own CPU quota (often one
		// core) that work queues behind itself (a 256 MiB restore took
		// ~0.4 s instead of ~0.2 s). The restore gets every host core;
		// the sandbox's quota is applied as soon as it runs (limitCPU).
		ospec.Linux.Resources.CPU.Quota = int64(max(goruntime.NumCPU(), spec.VCPUs)) * cpuPeriod
	}
	cfg, err := json.MarshalIndent(ospec, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("gvisor: %s %s: encode spec: %w", verb, spec.ID, err)
	}
	bundle := filepath.Join(dir, "bundle")
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), cfg, 0o600); err != nil {
		return nil, fmt.Errorf("gvisor: %s %s: write spec: %w", verb, spec.ID, err)
	}

	// runsc and the sandbox it forks write their stdio here. O_APPEND: a
	// sandbox writing at its own offset would clobber earlier lines.
	logPath := filepath.Join(dir, "runsc.log")
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("gvisor: %s %s: open log: %w", verb, spec.ID, err)
	}
	defer logf.Close()

	args := append(d.globalArgs(), d.sandboxArgs(spec.ID, diskMiB, spec.Network.Namespace != "")...)
	if spec.WritableRoot {
		if verb != "start" {
			return nil, fmt.Errorf("gvisor: %s %s: a writable root is for booted sandboxes only: %w", verb, spec.ID, model.ErrInvalid)
		}
		// The guest's writes go through the gofer into RootFS (the
		// builder's bounded overlay mount), not into a filestore here.
		for i, a := range args {
			if strings.HasPrefix(a, "--overlay2=") {
				args[i] = "--overlay2=none"
			}
		}
	}
	args = append(args, command(bundle)...)
	cmd := exec.CommandContext(ctx, d.cfg.RunscPath, args...)
	// Files, not pipes: the detached sandbox inherits them, and a pipe would
	// keep Wait blocked for the sandbox's lifetime.
	cmd.Stdin = nil
	cmd.Stdout = logf
	cmd.Stderr = logf
	// Own session: the sandbox must outlive the worker and not receive the
	// worker's terminal signals.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("gvisor: %s %s: runsc %s: %w: %s", verb, spec.ID, command(bundle)[0], err, tail(logPath, 2048))
	}
	if verb == "restore" {
		if err := d.limitCPU(spec.ID, int64(spec.VCPUs)*cpuPeriod); err != nil {
			return nil, fmt.Errorf("gvisor: %s %s: %w", verb, spec.ID, err)
		}
	}
	d.log.Info("sandbox up", "via", verb, "id", spec.ID, "vcpus", spec.VCPUs, "memory_mib", spec.MemoryMiB)
	return sb, nil
}

// runsc.log is PID 1's stdio: the guest (root inside) can write to it
// without end, through /proc/1/fd/1 or as the agent. The driver cuts it at
// logcap.Max (its last logcap.Keep bytes go to runsc.log.1) whenever it
// looks at the sandbox and every logcap.Interval.
func (d *Driver) capLog(id string) {
	p := filepath.Join(d.sandboxDir(id), "runsc.log")
	if cut, err := logcap.Enforce(p, logcap.Max, logcap.Keep); err != nil {
		d.log.Warn("gvisor: cap runsc.log", "id", id, "err", err)
	} else if cut {
		d.log.Info("gvisor: runsc.log reached its cap; cut", "id", id, "cap_bytes", logcap.Max)
	}
}

// capLogs runs for the driver's lifetime (until its run dir is removed),
// capping every sandbox's runsc.log.
func (d *Driver) capLogs() {
	logcap.KeepCapped(context.Background(), func() ([]string, bool) {
		if _, err := os.Stat(d.cfg.RunDir); err != nil {
			return nil, false
		}
		files, _ := filepath.Glob(filepath.Join(d.cfg.RunDir, "*", "runsc.log"))
		return files, true
	}, func(p string, err error) { d.log.Warn("gvisor: cap runsc.log", "file", p, "err", err) })
}

// sandboxArgs are the runsc flags that define a sandbox; run and restore
// must pass the same ones.
func (d *Driver) sandboxArgs(id string, diskMiB int, joinsNetwork bool) []string {
	network := "--network=none"
	if joinsNetwork {
		network = "--network=sandbox"
	}
	return []string{
		"--host-uds=open",
		// Without a network: loopback only, gVisor's netstack with just
		// "lo", and no host network calls from the Sentry. (With no netns
		// path and --network=sandbox the guest would get no interface at
		// all.) With one (an egress network: the OCI spec names its
		// namespace), --network=sandbox: the netstack takes the namespace's
		// eth0 and sends the guest's frames on it; raw sockets stay off
		// (no --net-raw), so the guest cannot forge packets below TCP and
		// UDP.
		network,
		// The root overlay's upper layer is a tmpfs inside the sentry whose
		// pages live in a file in overlay/; size= caps that tmpfs, so a
		// guest that writes more gets ENOSPC and the host file stays within
		// diskMiB (plus the sentry's own bookkeeping).
		"--overlay2=root:dir=" + filepath.Join(d.sandboxDir(id), "overlay") + ",size=" + strconv.Itoa(diskMiB) + "m",
	}
}

// DefaultDiskMiB bounds a sandbox's overlay when its spec names no size.
const DefaultDiskMiB = 4096

// diskFile, in a sandbox's run dir, holds its overlay size limit in MiB.
const diskFile = "disk_mib"

// diskMiB returns the overlay size limit recorded for sandbox id.
func (d *Driver) diskMiB(id string) int {
	b, err := os.ReadFile(filepath.Join(d.sandboxDir(id), diskFile))
	if err != nil {
		return DefaultDiskMiB
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n <= 0 {
		return DefaultDiskMiB
	}
	return n
}

// Adopt reattaches to a sandbox started by an earlier worker process: it
// re-creates the channel listener; the agent redials by itself.
func (d *Driver) Adopt(ctx context.Context, id string) (runtime.Sandbox, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	st, err := d.Status(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("gvisor: adopt %s: %w", id, err)
	}
	if st != runtime.StatusRunning && st != runtime.StatusPaused {
		return nil, fmt.Errorf("gvisor: adopt %s: sandbox is %s: %w", id, st, runtime.ErrNotFound)
	}
	if fi, err := os.Stat(d.chanDir(id)); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("gvisor: adopt %s: no channel dir: %w", id, runtime.ErrNotFound)
	}
	if b, err := os.ReadFile(filepath.Join(d.sandboxDir(id), cpuQuotaFile)); err == nil {
		// A restored sandbox: its quota, in case the previous worker died
		// between the restore and applying it.
		if q, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
			if err := d.limitCPU(id, q); err != nil {
				return nil, fmt.Errorf("gvisor: adopt %s: %w", id, err)
			}
		}
	}
	d.closeHandle(id)
	// A stale socket file of the previous listener blocks bind(2).
	if err := os.Remove(d.socketPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("gvisor: adopt %s: remove stale socket: %w", id, err)
	}
	sb, err := d.listen(id)
	if err != nil {
		return nil, fmt.Errorf("gvisor: adopt %s: %w", id, err)
	}
	return sb, nil
}

// Delete stops the sandbox and releases everything it held. Idempotent.
func (d *Driver) Delete(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	if err := d.cleanup(ctx, id); err != nil {
		return fmt.Errorf("gvisor: delete %s: %w", id, err)
	}
	return nil
}

// runscState is the part of `runsc state` output the driver reads.
type runscState struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Pid    int    `json:"pid"`
}

// Status reports what runsc says about the sandbox. A run dir without runsc state (a half-created or half-deleted sandbox) is
// StatusStopped, so that reconciliation deletes it.
func (d *Driver) Status(ctx context.Context, id string) (runtime.Status, error) {
	if err := validID(id); err != nil {
		return "", err
	}
	defer d.lock(id)()
	return d.status(ctx, id)
}

// status is Status; the caller holds lock(id). It also caps the
// sandbox's runsc.log (logcap), as the driver does every logcap.Interval.
func (d *Driver) status(ctx context.Context, id string) (runtime.Status, error) {
	d.capLog(id)
	st, found, err := d.fastState(id) // faststate.go
	if errors.Is(err, errNoControl) {
		st, found, err = d.state(ctx, id)
	}
	if err != nil {
		return "", err
	}
	if !found {
		if _, err := os.Lstat(d.sandboxDir(id)); err == nil {
			return runtime.StatusStopped, nil
		}
		return runtime.StatusGone, nil
	}
	switch st.Status {
	case "running":
		return runtime.StatusRunning, nil
	case "paused":
		return runtime.StatusPaused, nil
	default: // "creating", "created", "stopped"
		return runtime.StatusStopped, nil
	}
}

// state runs `runsc state`; found is false when runsc has no such container.
func (d *Driver) state(ctx context.Context, id string) (st runscState, found bool, err error) {
	out, err := d.runsc(ctx, "state", id)
	if err != nil {
		if notExist(out) {
			return st, false, nil
		}
		return st, false, fmt.Errorf("gvisor: runsc state %s: %w: %s", id, err, strings.TrimSpace(string(out)))
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return st, false, fmt.Errorf("gvisor: runsc state %s: decode: %w", id, err)
	}
	// runsc resolves ids by prefix; only an exact match counts.
	if st.ID != id {
		return st, false, nil
	}
	return st, true, nil
}

// List returns every id runsc knows plus every run dir (half-created
// sandboxes included), sorted and unique.
func (d *Driver) List(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	// -quiet: ids only, read from the state dir (without it runsc asks
	// every running sentry for its state).
	out, err := d.runsc(ctx, "list", "-quiet")
	if err != nil {
		return nil, fmt.Errorf("gvisor: runsc list: %w: %s", err, strings.TrimSpace(string(out)))
	}
	for _, id := range strings.Fields(string(out)) {
		seen[id] = true
	}
	entries, err := os.ReadDir(d.cfg.RunDir)
	if err != nil {
		return nil, fmt.Errorf("gvisor: list run dir: %w", err)
	}
	for _, e := range entries {
		if e.IsDir() {
			seen[e.Name()] = true
		}
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// Pause stops the sandbox in memory as `runsc pause` does (the sentry stops
// its tasks; done in process, control.go, with the runsc CLI as the
// fallback). Pausing a paused sandbox succeeds.
func (d *Driver) Pause(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	defer d.lock(id)()
	return d.simple(ctx, "pause", id)
}

// Resume continues a paused sandbox (paused by Pause, by `runsc pause`, or
// left so by a failed Checkpoint). Resuming a running sandbox succeeds.
func (d *Driver) Resume(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	defer d.lock(id)()
	return d.simple(ctx, "resume", id)
}

// simple runs `runsc pause` or `runsc resume`; a sandbox already paused
// (resumed) is left alone. The status comes from runsc's state file where
// it can (saving a `runsc state`, ~10 ms). The caller holds lock(id).
func (d *Driver) simple(ctx context.Context, verb, id string) error {
	// In process first (control.go); the CLI when that does not apply.
	if err := d.controlPause(ctx, id, verb == "pause"); !errors.Is(err, errNoControl) {
		return err
	}
	st, found, err := d.runscStatus(ctx, id)
	if err != nil {
		return err
	} else if !found {
		return fmt.Errorf("gvisor: %s %s: %w", verb, id, runtime.ErrNotFound)
	}
	if (verb == "pause" && st == "paused") || (verb == "resume" && st == "running") {
		return nil
	}
	if out, err := d.runsc(ctx, verb, id); err != nil {
		return fmt.Errorf("gvisor: runsc %s %s: %w: %s", verb, id, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// cpuQuotaFile, in a restored sandbox's run dir, holds its CPU quota.
const cpuQuotaFile = "cpu_quota"

// limitCPU sets the CPU quota (µs per cpuPeriod) of sandbox id's cgroup,
// as runsc does from the spec. A sandbox must not run without its limit, so
// a cgroup that cannot be found or written is an error.
// On cgroup v1 that is cpu.cfs_quota_us in the cpu hierarchy, on v2
// cpu.max in the unified one.
func (d *Driver) limitCPU(id string, quota int64) error {
	if d.cgErr != nil {
		return fmt.Errorf("set the CPU quota: %w", d.cgErr)
	}
	if err := d.cg.SetCPU(d.cgroupPath(id), quota, cpuPeriod); err != nil {
		return fmt.Errorf("set the CPU quota (cgroup %v): %w", d.cg.Version, err)
	}
	return nil
}

// cgroupPath is sandbox id's cgroup relative to the hierarchy root, as
// runsc creates it from the spec's cgroupsPath.
func (d *Driver) cgroupPath(id string) string { return path.Join(d.cfg.CgroupParent, id) }

func (d *Driver) globalArgs() []string {
	args := []string{"--root", d.cfg.StateDir, "--platform=" + d.cfg.Platform}
	if dir := os.Getenv("AIRLOCK_RUNSC_DEBUG_LOG"); dir != "" {
		// For operators chasing a runsc problem: runsc's debug logs (with
		// its restore timeline) go to files in dir.
		args = append(args, "--debug", "--debug-log="+strings.TrimSuffix(dir, "/")+"/")
	}
	return args
}

// runsc runs a short runsc subcommand and returns its combined output.
func (d *Driver) runsc(ctx context.Context, args ...string) ([]byte, error) {
	return d.runscCmd(ctx, args...).CombinedOutput()
}

// runscCmd is the command for a runsc subcommand with the global flags.
func (d *Driver) runscCmd(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, d.cfg.RunscPath, append(d.globalArgs(), args...)...)
}

// notExist recognises runsc's "no such container" errors.
func notExist(out []byte) bool {
	s := string(out)
	return strings.Contains(s, "does not exist") || strings.Contains(s, "no such file or directory") ||
		strings.Contains(s, "not found")
}

// tail returns at most n trailing bytes of a file, for error messages.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		f.Seek(fi.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return strings.TrimSpace(string(b))
}

// listen creates the channel listener and the handle around it.
func (d *Driver) listen(id string) (*sandbox, error) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: d.socketPath(id), Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on agent channel: %w", err)
	}
	// A later Adopt may bind a new listener at the same path; closing this
	// one must not unlink that one's socket file.
	ln.SetUnlinkOnClose(false)
	sb := newSandbox(id, ln, d)
	d.mu.Lock()
	d.handles[id] = sb
	d.mu.Unlock()
	return sb, nil
}

func (d *Driver) closeHandle(id string) {
	d.mu.Lock()
	sb := d.handles[id]
	d.mu.Unlock()
	if sb != nil {
		sb.Close()
	}
}

func (d *Driver) forget(sb *sandbox) {
	d.mu.Lock()
	if d.handles[sb.id] == sb {
		delete(d.handles, sb.id)
	}
	d.mu.Unlock()
}
