package qemu

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/airlock/airlock/internal/cgroup"
	"github.com/airlock/airlock/internal/logcap"
)

// Confinement of every QEMU process: an escape through device emulation
// (virtio-blk, -net, -serial, -rng) or TCG must not give host root.
//
//   - seccomp (-sandbox): no obsolete system calls, no fork/exec
//     (spawn=deny), no scheduler or NUMA changes (resourcecontrol=deny).
//     elevateprivileges=deny is not set: QEMU 7.2 (Debian 12) applies it
//     before -runas, the set*id calls then fail and QEMU silently keeps
//     running as root. After -runas all of QEMU's uids are unprivileged and
//     NoNewPrivs is set, so it cannot regain root either way.
//   - -runas Config.User (default airlock-qemu, created if missing): QEMU
//     opens its disks, RAM file, sockets, console and /dev/kvm as root,
//     then drops to that user before the guest runs.
//   - a cgroup of its own, CgroupParent/qemu-<id>, with cpu = vCPUs cores,
//     memory = guest RAM + qemuOverheadMiB and pids = qemuPids, joined
//     before QEMU is exec'ed (cgroup v1 or v2, see internal/cgroup).
const (
	DefaultUser         = "airlock-qemu"
	DefaultCgroupParent = "/airlock"
	// qemuOverheadMiB is QEMU's own memory beside the guest's RAM (TCG's
	// 32 MiB translation cache, device state, its heap).
	qemuOverheadMiB = 256
	// qemuPids bounds QEMU's threads (vCPUs, I/O workers, RCU).
	qemuPids = 512
	// seccompPolicy is QEMU's -sandbox argument.
	seccompPolicy = "on,obsolete=deny,spawn=deny,resourcecontrol=deny"
)

func (d *Driver) cgroupPath(id string) string { return path.Join(d.cfg.CgroupParent, "qemu-"+id) }

func (d *Driver) limits(st state) cgroup.Limits {
	return cgroup.Limits{
		CPUQuota:    int64(st.VCPUs) * 100000,
		CPUPeriod:   100000,
		MemoryBytes: int64(st.MemoryMiB+guestOverheadMiB+qemuOverheadMiB) << 20,
		Pids:        qemuPids,
	}
}

// confineArgs are the QEMU flags that confine it.
func (d *Driver) confineArgs() []string {
	return []string{"-sandbox", seccompPolicy, "-runas", d.cfg.User}
}

// launch starts QEMU (args after the binary) in sandbox st's netns and
// cgroup, in its own session so that it outlives the worker, and waits
// until its monitor answers. QEMU is not daemonized (-daemonize forks after
// the seccomp filter forbids it): the worker reaps it while it runs, init
// after a worker restart.
func (d *Driver) launch(ctx context.Context, st state, dir string, args []string) error {
	if d.cgErr != nil {
		return fmt.Errorf("qemu needs a cgroup for its limits: %w", d.cgErr)
	}
	rel := d.cgroupPath(st.ID)
	l := d.limits(st)
	if err := d.cg.Create(rel, l); err != nil {
		return err
	}
	procs, err := d.cg.ProcsFiles(rel, l)
	if err != nil {
		return err
	}
	// The shell joins the cgroup, then becomes nsenter, which joins the
	// sandbox's network namespace and becomes QEMU:
	// QEMU and every thread it starts are limited from their first
	// instruction.
	script := `n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n-1)); done; exec "$@"`
	argv := append([]string{"-c", script, "airlock-qemu-launch", strconv.Itoa(len(procs))}, procs...)
	argv = append(argv, "nsenter", "--net="+st.Network.Namespace, "--", d.cfg.Assets.QEMU)
	argv = append(argv, args...)
	logPath := filepath.Join(dir, "qemu.log")
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	// Not CommandContext: QEMU must outlive this call.
	cmd := exec.Command("/bin/sh", argv...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run qemu: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("qemu exited at start (%v): %s", err, bytes.TrimSpace(logcap.Tail(logPath, 4096)))
		default:
		}
		if _, ok := d.pid(st.ID); ok {
			qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := d.queryStatus(qctx, st.ID)
			cancel()
			if err == nil {
				return nil
			}
		}
		select {
		case err := <-exited:
			return fmt.Errorf("qemu exited at start (%v): %s", err, bytes.TrimSpace(logcap.Tail(logPath, 4096)))
		case <-ctx.Done():
			return fmt.Errorf("qemu start: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// The guest writes its console (serial.log) without end, and QEMU's own
// warnings (qemu.log) can be provoked by a guest. Both are opened O_APPEND
// by QEMU and cut at logcap.Max (tail kept in <file>.1) every
// logcap.Interval and before StopReason reads them.
var cappedLogs = []string{"serial.log", "qemu.log"}

func (d *Driver) capLogsOf(id string) {
	for _, name := range cappedLogs {
		if _, err := logcap.Enforce(filepath.Join(d.dir(id), name), logcap.Max, logcap.Keep); err != nil {
			d.log.Warn("qemu: cap "+name, "id", id, "err", err)
		}
	}
}

// capLogs runs for the driver's lifetime (until its run dir is removed).
func (d *Driver) capLogs() {
	logcap.KeepCapped(context.Background(), func() ([]string, bool) {
		if _, err := os.Stat(d.cfg.RunDir); err != nil {
			return nil, false
		}
		var files []string
		for _, name := range cappedLogs {
			m, _ := filepath.Glob(filepath.Join(d.cfg.RunDir, "*", name))
			files = append(files, m...)
		}
		return files, true
	}, func(p string, err error) { d.log.Warn("qemu: cap log", "file", p, "err", err) })
}

// removeCgroup removes sandbox id's cgroup once its processes are gone.
func (d *Driver) removeCgroup(id string) error {
	if d.cgErr != nil {
		return nil
	}
	return d.cg.Remove(d.cgroupPath(id))
}

// cgroupPids lists the processes in sandbox id's cgroup.
func (d *Driver) cgroupPids(id string) []int {
	if d.cgErr != nil {
		return nil
	}
	return d.cg.Pids(d.cgroupPath(id))
}

// Reasons quote the guest: a line of its console is cut to maxReasonLine
// bytes, and only the last reasonScan bytes of a log are searched.
const (
	maxReasonLine = 512
	reasonScan    = 64 << 10
)

// cutLine returns the line of b starting at i, trimmed and at most
// maxReasonLine bytes long (at a UTF-8 boundary).
func cutLine(b []byte, i int) string {
	line := b[i:]
	if j := bytes.IndexByte(line, '\n'); j >= 0 {
		line = line[:j]
	}
	s := strings.TrimSpace(strings.ToValidUTF8(string(line), "?"))
	if len(s) <= maxReasonLine {
		return s
	}
	n := maxReasonLine
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + fmt.Sprintf(" …[%d bytes cut]", len(s)-n)
}
