// Package runtimetest is the conformance suite every runtime driver runs
// (gvisor, qemu, and runtime/fake): Run starts sandboxes with a template and
// talks to their agent through internal/agentclient — for gvisor and qemu
// real sandboxes and the real in-guest agent; for a driver whose guest is
// simulated (Options.Simulated) the checks that need a Linux guest skip,
// saying so, and the driver contract (lifecycle, adoption, pause, suspend
// and wake, forks, restore failures, delete leaves nothing) is checked all
// the same.
package runtimetest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime"
)

// Options describe the environment of the driver under test.
type Options struct {
	// RootFS is a template root filesystem with the agent at
	// /usr/local/bin/airlock-agent and the base template's tools (sh, cat,
	// python3).
	RootFS string
	// RunDir is the driver's per-sandbox directory parent; when set, the
	// suite checks RunDir/<id> is gone after Delete.
	RunDir string
	// CgroupParent is the parent of sandbox cgroups (default "/airlock");
	// the suite checks /sys/fs/cgroup/*/CgroupParent/<id> is gone after Delete.
	CgroupParent string
	// NewID returns a fresh fixed-length sandbox id (default "sb-" + 26
	// random base32 characters).
	NewID func() string
	// MemoryMiB and VCPUs of every sandbox (defaults 256 and 1).
	MemoryMiB int
	VCPUs     int
	// BootTimeout bounds the wait for the agent (default 60 s).
	BootTimeout time.Duration
	// Concurrent is how many sandboxes the Concurrent test boots at once
	// (default 3; slow emulated runtimes may use 2).
	Concurrent int
	// Interfaces are the guest's network interfaces, in if_nameindex order
	// (default: just "lo"); a microVM adds its virtio-net "eth0".
	Interfaces []string
	// SuspendWakeCycles is how many suspend/wake cycles SuspendWake runs
	// (default 3).
	SuspendWakeCycles int
	// MemoryFiles are the base names of files in RunDir/<id> that back the
	// guest's memory, not its disk (QEMU's "mem.ram"); DiskLimit leaves
	// them out of the sandbox's disk use on the host.
	MemoryFiles []string
	// Simulated says the guest is not a Linux system but a simulation
	// (runtime/fake: built-in programs, a shell without loops, no python3,
	// no /proc beyond meminfo, no dd). The checks that need a real guest
	// skip loudly (network interfaces, the host's processes, the disk
	// limit); pause is checked by the agent holding its answers, suspend and
	// forks by files only (no guest process survives them).
	Simulated bool
}

func (o *Options) defaults() {
	if o.CgroupParent == "" {
		o.CgroupParent = "/airlock"
	}
	if o.NewID == nil {
		o.NewID = NewID
	}
	if o.MemoryMiB == 0 {
		o.MemoryMiB = 256
	}
	if o.VCPUs == 0 {
		o.VCPUs = 1
	}
	if o.BootTimeout == 0 {
		o.BootTimeout = 60 * time.Second
	}
	if o.SuspendWakeCycles == 0 {
		o.SuspendWakeCycles = 3
	}
	if o.Concurrent == 0 {
		o.Concurrent = 3
	}
}

// NewID returns "sb-" followed by 26 random lowercase base32 characters.
func NewID() string { return model.NewID("sb") }

// Run runs the conformance suite against d.
func Run(t *testing.T, d runtime.Driver, opts Options) {
	opts.defaults()
	if opts.RootFS == "" {
		t.Fatal("runtimetest: Options.RootFS is required")
	}
	s := &suite{d: d, opts: opts}
	t.Run("BootAndHealth", s.testBoot)
	t.Run("Exec", s.testExec)
	t.Run("Files", s.testFiles)
	t.Run("Limits", s.testLimits)
	t.Run("NetworkLoopbackOnly", s.testNetwork)
	t.Run("HostInvisible", s.testHostInvisible)
	t.Run("Adopt", s.testAdopt)
	t.Run("PauseResume", s.testPause)
	t.Run("DeleteLeavesNothing", s.testDelete)
	t.Run("Concurrent", s.testConcurrent)
	t.Run("DeleteUnknown", s.testDeleteUnknown)
	t.Run("BadRootFS", s.testBadRootFS)
	t.Run("SuspendWake", s.testSuspendWake)
	t.Run("Fork", s.testFork)
	t.Run("RestoreFailure", s.testRestoreFailure)
	t.Run("DiskLimit", s.testDisk)
}

// needLinux skips a check that needs a real Linux guest when the driver's
// guest is simulated.
func (s *suite) needLinux(t *testing.T, what string) {
	t.Helper()
	if s.opts.Simulated {
		t.Skipf("SKIP: %s needs a Linux guest; driver %s simulates its guest (Options.Simulated)", what, s.d.Name())
	}
}

type suite struct {
	d    runtime.Driver
	opts Options
	seq  atomic.Int64
}

// box is one started sandbox and a client of its agent.
type box struct {
	id string
	sb runtime.Sandbox
	c  *agentclient.Client
}

func (s *suite) spec(id string) runtime.Spec {
	return runtime.Spec{ID: id, RootFS: s.opts.RootFS, VCPUs: s.opts.VCPUs, MemoryMiB: s.opts.MemoryMiB, Hostname: "conformance"}
}

// start starts a sandbox, waits for its agent, and deletes it at the end of
// the test.
func (s *suite) start(t *testing.T) *box {
	t.Helper()
	return s.startSpec(t, s.spec(s.opts.NewID()))
}

// startSpec is start with a spec of the caller's.
func (s *suite) startSpec(t *testing.T, spec runtime.Spec) *box {
	t.Helper()
	id := spec.ID
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.BootTimeout)
	defer cancel()
	sb, err := s.d.Start(ctx, spec)
	if err != nil {
		t.Fatalf("Start %s: %v", id, err)
	}
	b := &box{id: id, sb: sb}
	b.c = agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
	t.Cleanup(func() {
		b.c.Close()
		b.sb.Close()
		if err := s.d.Delete(context.Background(), id); err != nil {
			t.Errorf("Delete %s: %v", id, err)
		}
	})
	if err := b.c.WaitReady(ctx); err != nil {
		t.Fatalf("agent of %s not ready: %v", id, err)
	}
	return b
}

// exec runs argv in the sandbox and returns its combined output and exit code.
func (s *suite) exec(t *testing.T, b *box, argv ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return RunRoot(ctx, t, b.c, fmt.Sprintf("rt-%d", s.seq.Add(1)), argv...)
}

// RunRoot runs argv as root in the sandbox behind c as process pid, waits
// for it within ctx, and returns its combined output and exit code. It
// fails t when the process cannot be started or run, or its output breaks
// off.
func RunRoot(ctx context.Context, t testing.TB, c *agentclient.Client, pid string, argv ...string) (string, int) {
	t.Helper()
	if _, err := c.StartProcess(ctx, agentapi.ProcessSpec{ID: pid, Argv: argv, User: "root"}); err != nil {
		t.Fatalf("start %v: %v", argv, err)
	}
	out, err := c.Output(ctx, pid, 0)
	if err != nil {
		t.Fatalf("output of %v: %v", argv, err)
	}
	defer out.Close()
	var sb strings.Builder
	for {
		kind, payload, err := out.Next()
		if err != nil {
			t.Fatalf("output of %v: %v (so far %q)", argv, err, sb.String())
		}
		switch kind {
		case agentapi.FrameStdout, agentapi.FrameStderr:
			sb.Write(payload)
		case agentapi.FrameExit:
			var e agentapi.Exit
			if err := json.Unmarshal(payload, &e); err != nil {
				t.Fatalf("exit frame of %v: %v", argv, err)
			}
			if e.Error != "" {
				t.Fatalf("%v could not run: %s", argv, e.Error)
			}
			return sb.String(), e.ExitCode
		case agentapi.FrameError:
			t.Fatalf("output of %v: error frame %s", argv, payload)
		}
	}
}

// sh runs a shell snippet and fails the test unless it exits 0.
func (s *suite) sh(t *testing.T, b *box, script string) string {
	t.Helper()
	out, code := s.exec(t, b, "sh", "-c", script)
	if code != 0 {
		t.Fatalf("sh -c %q: exit %d: %s", script, code, out)
	}
	return out
}

// ctx bounds one check's calls to the driver and the agent: a sandbox that
// dies mid-check (its agent never answers again) fails the check instead of
// hanging the test binary until go test's timeout.
func (s *suite) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func (s *suite) testBoot(t *testing.T) {
	b := s.start(t)
	ctx := s.ctx(t)
	h, err := b.c.Health(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h.Version != agentapi.Version || h.PID != 1 {
		t.Errorf("health = %+v, want version %s and PID 1", h, agentapi.Version)
	}
	if st, err := s.d.Status(ctx, b.id); err != nil || st != runtime.StatusRunning {
		t.Errorf("Status = %q, %v; want running", st, err)
	}
	ids, err := s.d.List(ctx)
	if err != nil || !slices.Contains(ids, b.id) {
		t.Errorf("List = %v, %v; want it to contain %s", ids, err, b.id)
	}
	if b.sb.ID() != b.id {
		t.Errorf("Sandbox.ID = %q, want %q", b.sb.ID(), b.id)
	}
	if out := strings.TrimSpace(s.sh(t, b, "hostname")); out != "conformance" {
		t.Errorf("hostname = %q", out)
	}
}

func (s *suite) testExec(t *testing.T) {
	b := s.start(t)
	tests := []struct {
		argv []string
		out  string
		code int
	}{
		{[]string{"echo", "hi"}, "hi\n", 0},
		{[]string{"sh", "-c", "exit 3"}, "", 3},
		// stdout and stderr are separate pipes: their relative order in the
		// combined output is not defined, so lines are compared sorted.
		{[]string{"sh", "-c", "echo out; echo err >&2"}, "err\nout\n", 0},
		{[]string{"id", "-u"}, "0\n", 0},
	}
	sortLines := func(s string) string {
		lines := strings.SplitAfter(s, "\n")
		slices.Sort(lines)
		return strings.Join(lines, "")
	}
	for _, tt := range tests {
		out, code := s.exec(t, b, tt.argv...)
		if sortLines(out) != tt.out || code != tt.code {
			t.Errorf("%v = %q exit %d, want %q exit %d", tt.argv, out, code, tt.out, tt.code)
		}
	}
}

func (s *suite) testFiles(t *testing.T) {
	b := s.start(t)
	ctx := s.ctx(t)
	content := "hello from the host " + b.id + "\n"
	for _, p := range []string{"/home/user/notes/a.txt", "/etc/airlock-conformance"} {
		if _, err := b.c.WriteFile(ctx, p, "0640", "", strings.NewReader(content)); err != nil {
			t.Fatalf("WriteFile %s: %v", p, err)
		}
		rc, _, err := b.c.ReadFile(ctx, p)
		if err != nil {
			t.Fatalf("ReadFile %s: %v", p, err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || string(got) != content {
			t.Errorf("ReadFile %s = %q, %v; want %q", p, got, err, content)
		}
		if out := s.sh(t, b, "cat "+p); out != content {
			t.Errorf("guest cat %s = %q", p, out)
		}
	}
	// Guest writes must never reach the shared template.
	if _, err := os.Stat(filepath.Join(s.opts.RootFS, "etc/airlock-conformance")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a guest write reached the template: stat = %v", err)
	}
	s.sh(t, b, "rm -f /bin/true")
	if _, err := os.Stat(filepath.Join(s.opts.RootFS, "bin/true")); err != nil {
		t.Errorf("a guest delete reached the template: %v", err)
	}
}

func (s *suite) testLimits(t *testing.T) {
	b := s.start(t)
	out := s.sh(t, b, "grep MemTotal /proc/meminfo")
	f := strings.Fields(out)
	if len(f) < 2 {
		t.Fatalf("meminfo: %q", out)
	}
	kb, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatalf("meminfo: %q", out)
	}
	want := s.opts.MemoryMiB * 1024
	if kb < want*9/10 || kb > want*11/10 {
		t.Errorf("guest MemTotal = %d kB, want about %d kB", kb, want)
	}
}

func (s *suite) testNetwork(t *testing.T) {
	s.needLinux(t, "the network check (/proc/net/dev, python3 sockets)")
	b := s.start(t)
	out := s.sh(t, b, "cat /proc/net/dev")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := s.opts.Interfaces
	if len(want) == 0 {
		want = []string{"lo"}
	}
	for _, l := range lines[min(2, len(lines)):] {
		name, _, _ := strings.Cut(strings.TrimSpace(l), ":")
		if !slices.Contains(want, name) {
			t.Errorf("guest has network interface %q (only %v allowed):\n%s", name, want, out)
		}
	}
	out = s.sh(t, b, `python3 -c 'import socket; print(" ".join(n for _, n in socket.if_nameindex()))'`)
	if strings.TrimSpace(out) != strings.Join(want, " ") {
		t.Errorf("guest network interfaces %q, want exactly %v", out, want)
	}
	// Loopback works: a server and a client inside the guest.
	out, code := s.exec(t, b, "python3", "-c", `
import socket
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen()
c = socket.create_connection(srv.getsockname(), timeout=5); a, _ = srv.accept()
c.sendall(b"ping"); print(a.recv(4).decode())`)
	if code != 0 || strings.TrimSpace(out) != "ping" {
		t.Errorf("loopback inside the guest: exit %d, %q", code, out)
	}
	// No route out: connecting to a TEST-NET-1 address fails at once.
	out, code = s.exec(t, b, "python3", "-c",
		"import socket; s = socket.socket(); s.settimeout(3); s.connect(('192.0.2.1', 80))")
	if code == 0 {
		t.Errorf("guest connected to 192.0.2.1:80: %s", out)
	}
	if strings.Contains(out, "timed out") {
		t.Errorf("connect to 192.0.2.1 timed out (packets left the sandbox?): %s", out)
	}
}

func (s *suite) testHostInvisible(t *testing.T) {
	b := s.start(t)
	if s.opts.Simulated {
		t.Logf("SKIP (in part): counting the guest's processes needs a Linux guest; driver %s simulates its guest; the host-file check runs", s.d.Name())
	} else {
		s.guestProcesses(t, b)
	}
	secret := filepath.Join(os.TempDir(), "airlock-conformance-"+b.id)
	if err := os.WriteFile(secret, []byte("host secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(secret)
	if out, code := s.exec(t, b, "cat", secret); code == 0 || strings.Contains(out, "host secret") {
		t.Errorf("guest read a host file %s: exit %d %q", secret, code, out)
	}
}

// guestProcesses checks the guest sees a handful of processes, not the
// host's.
func (s *suite) guestProcesses(t *testing.T, b *box) {
	// Processes with a command line: a VM's own kernel threads (empty
	// cmdline) are not host processes.
	out := s.sh(t, b, `for p in /proc/[0-9]*; do [ -n "$(tr -d '\0' < $p/cmdline 2>/dev/null)" ] && echo ${p#/proc/}; done; true`)
	pids := 0
	for _, f := range strings.Fields(out) {
		if _, err := strconv.Atoi(f); err == nil {
			pids++
		}
	}
	if pids == 0 || pids > 20 {
		t.Errorf("guest sees %d processes in /proc, want a handful:\n%s", pids, out)
	}
}

func (s *suite) testAdopt(t *testing.T) {
	b := s.start(t)
	s.sh(t, b, "echo before > /tmp/adopt")
	// The handle goes away as with a worker restart; the sandbox stays.
	b.c.Close()
	if err := b.sb.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.BootTimeout)
	defer cancel()
	sb, err := s.d.Adopt(ctx, b.id)
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	b.sb = sb
	b.c = agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
	if err := b.c.WaitReady(ctx); err != nil {
		t.Fatalf("agent after Adopt: %v", err)
	}
	if out := s.sh(t, b, "cat /tmp/adopt"); out != "before\n" {
		t.Errorf("after Adopt /tmp/adopt = %q", out)
	}
	if _, err := s.d.Adopt(ctx, NewID()); err == nil {
		t.Error("Adopt of an unknown id succeeded")
	}
}

func (s *suite) testPause(t *testing.T) {
	p, ok := s.d.(runtime.Pauser)
	if !ok {
		t.Skipf("driver %s does not implement runtime.Pauser", s.d.Name())
	}
	b := s.start(t)
	ctx := s.ctx(t)
	if s.opts.Simulated {
		s.pauseHolds(t, p, b)
		return
	}
	// A loop appends the guest's wall clock (seconds.micros) about every
	// 20 ms. While paused it must not run: its ticks show one gap about as
	// long as the pause, where a running loop's gaps stay far shorter.
	if _, err := b.c.StartProcess(ctx, agentapi.ProcessSpec{ID: "ticker", Argv: []string{"bash", "-c",
		`while :; do echo $EPOCHREALTIME >> /tmp/ticks; sleep 0.02; done`}}); err != nil {
		t.Fatal(err)
	}
	var lastErr error
	ticks := func() []float64 {
		// Bounded: a sandbox that died (its agent never redials) must fail
		// the test, not hang it.
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		rc, _, err := b.c.ReadFile(rctx, "/tmp/ticks")
		if err != nil {
			lastErr = err // not written yet
			return nil
		}
		defer rc.Close()
		data, _ := io.ReadAll(rc)
		var out []float64
		for _, l := range strings.Split(string(data), "\n") {
			if f, err := strconv.ParseFloat(strings.TrimSpace(l), 64); err == nil {
				out = append(out, f)
			}
		}
		return out
	}
	waitTicks := func(n int) []float64 {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			if tk := ticks(); len(tk) >= n {
				return tk
			}
			if time.Now().After(deadline) {
				t.Fatalf("the guest loop does not tick (want %d ticks; last error %v)", n, lastErr)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	const pause = 1500 * time.Millisecond
	// The guest's own clock is no judge (a VM's clock stands still while it
	// is paused and is stepped later), so count ticks against host time: a
	// loop that kept running through the pause would have added about
	// elapsed/interval ticks; a frozen one lost about pause/interval of them.
	na := len(waitTicks(10))
	ta := time.Now()
	time.Sleep(time.Second)
	before := len(ticks())
	if before <= na {
		t.Fatalf("the guest loop does not tick before the pause (%d then %d ticks)", na, before)
	}
	interval := time.Since(ta).Seconds() / float64(before-na)
	t0 := time.Now()
	if err := p.Pause(ctx, b.id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if st, err := s.d.Status(ctx, b.id); err != nil || st != runtime.StatusPaused {
		t.Errorf("Status while paused = %q, %v", st, err)
	}
	time.Sleep(pause)
	if err := p.Resume(ctx, b.id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if st, err := s.d.Status(ctx, b.id); err != nil || st != runtime.StatusRunning {
		t.Errorf("Status after resume = %q, %v", st, err)
	}
	after := len(ticks())
	elapsed := time.Since(t0).Seconds()
	ifRunning := elapsed / interval
	lost := ifRunning - float64(after-before)
	t.Logf("interval %.3fs; %d ticks in %.2fs across a %v pause (about %.0f if it had kept running; %.0f lost)",
		interval, after-before, elapsed, pause, ifRunning, lost)
	if lost < 0.5*pause.Seconds()/interval {
		t.Errorf("the guest loop did not stop for the pause: %d ticks in %.2fs (about %.0f if running)", after-before, elapsed, ifRunning)
	}
	waitTicks(after + 5) // and it runs again after Resume
}

// pauseHolds is the pause check of a simulated guest, which has no clock
// loop to stop: a request sent while the sandbox is paused is answered
// only after Resume.
func (s *suite) pauseHolds(t *testing.T, p runtime.Pauser, b *box) {
	ctx := s.ctx(t)
	if err := p.Pause(ctx, b.id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if st, err := s.d.Status(ctx, b.id); err != nil || st != runtime.StatusPaused {
		t.Errorf("Status while paused = %q, %v", st, err)
	}
	answered := make(chan error, 1)
	go func() {
		_, err := b.c.Health(ctx)
		answered <- err
	}()
	select {
	case err := <-answered:
		t.Fatalf("a paused sandbox's agent answered (%v)", err)
	case <-time.After(500 * time.Millisecond):
	}
	if err := p.Resume(ctx, b.id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if err := <-answered; err != nil {
		t.Errorf("the request held across the pause failed after Resume: %v", err)
	}
	if st, err := s.d.Status(ctx, b.id); err != nil || st != runtime.StatusRunning {
		t.Errorf("Status after resume = %q, %v", st, err)
	}
}

func (s *suite) testDelete(t *testing.T) {
	b := s.start(t)
	ctx := s.ctx(t)
	s.sh(t, b, "echo x > /tmp/x")
	b.c.Close()
	if err := s.d.Delete(ctx, b.id); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	s.assertGone(t, b.id)
	if err := s.d.Delete(ctx, b.id); err != nil {
		t.Errorf("second Delete: %v", err)
	}
	if _, err := b.sb.AgentConn(ctx); err == nil {
		t.Error("AgentConn after Delete returned a connection")
	}
}

// assertGone checks nothing of id is left on the host.
func (s *suite) assertGone(t *testing.T, id string) {
	t.Helper()
	ctx := s.ctx(t)
	if st, err := s.d.Status(ctx, id); err != nil || st != runtime.StatusGone {
		t.Errorf("Status after Delete = %q, %v; want gone", st, err)
	}
	if ids, err := s.d.List(ctx); err != nil || slices.Contains(ids, id) {
		t.Errorf("List after Delete = %v, %v", ids, err)
	}
	if pids := pidsMentioning(id); len(pids) > 0 {
		t.Errorf("processes mentioning %s remain: %v", id, pids)
	}
	if mounts := mountsMentioning(id, s.opts.RunDir); len(mounts) > 0 {
		t.Errorf("mounts of %s remain: %v", id, mounts)
	}
	// Named network namespaces (internal/network's, or ip netns's; the tap
	// of a VM lives in one and goes with it).
	if nss, _ := filepath.Glob("/run/netns/*" + id + "*"); len(nss) > 0 {
		t.Errorf("network namespaces of %s remain: %v", id, nss)
	}
	cgs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", s.opts.CgroupParent, id))
	if len(cgs) > 0 {
		t.Errorf("cgroups of %s remain: %v", id, cgs)
	}
	if s.opts.RunDir != "" {
		if _, err := os.Lstat(filepath.Join(s.opts.RunDir, id)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("run dir of %s remains (%v)", id, err)
		}
	}
}

func pidsMentioning(id string) []string {
	var pids []string
	self := strconv.Itoa(os.Getpid())
	paths, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		pid := filepath.Base(filepath.Dir(p))
		if err != nil || pid == self || !strings.Contains(string(b), id) {
			continue
		}
		if st, err := os.ReadFile(filepath.Join("/proc", pid, "stat")); err == nil {
			if i := strings.LastIndexByte(string(st), ')'); i > 0 && i+2 < len(st) && st[i+2] == 'Z' {
				continue // a zombie awaiting its parent's wait; holds nothing
			}
		}
		pids = append(pids, pid+": "+strings.ReplaceAll(string(b), "\x00", " "))
	}
	return pids
}

func mountsMentioning(id, runDir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return []string{"cannot read mountinfo: " + err.Error()}
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		if strings.Contains(l, id) {
			out = append(out, l)
		}
	}
	return out
}

func (s *suite) testConcurrent(t *testing.T) {
	n := s.opts.Concurrent
	boxes := make([]*box, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := s.opts.NewID()
			ctx, cancel := context.WithTimeout(context.Background(), s.opts.BootTimeout)
			defer cancel()
			sb, err := s.d.Start(ctx, s.spec(id))
			if err != nil {
				errs[i] = fmt.Errorf("Start %s: %w", id, err)
				return
			}
			b := &box{id: id, sb: sb}
			b.c = agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
			boxes[i] = b
			errs[i] = b.c.WaitReady(ctx)
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, b := range boxes {
			if b == nil {
				continue
			}
			b.c.Close()
			b.sb.Close()
			if err := s.d.Delete(context.Background(), b.id); err != nil {
				t.Errorf("Delete %s: %v", b.id, err)
			}
			s.assertGone(t, b.id)
		}
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for i, b := range boxes {
		path := "/tmp/who"
		if _, err := b.c.WriteFile(context.Background(), path, "", "", strings.NewReader(b.id)); err != nil {
			t.Fatalf("sandbox %d: %v", i, err)
		}
	}
	// Each sandbox sees its own file, not a neighbour's.
	for _, b := range boxes {
		if out := s.sh(t, b, "cat /tmp/who"); out != b.id {
			t.Errorf("sandbox %s reads %q", b.id, out)
		}
	}
}

func (s *suite) testDeleteUnknown(t *testing.T) {
	id := s.opts.NewID()
	if err := s.d.Delete(context.Background(), id); err != nil {
		t.Errorf("Delete of unknown id: %v", err)
	}
	if st, err := s.d.Status(context.Background(), id); err != nil || st != runtime.StatusGone {
		t.Errorf("Status of unknown id = %q, %v; want gone", st, err)
	}
}

func (s *suite) testBadRootFS(t *testing.T) {
	tests := []struct {
		name   string
		rootfs string
	}{
		{"missing", filepath.Join(t.TempDir(), "does-not-exist")},
		{"empty dir", t.TempDir()},
		{"agent not executable", notExecutableRoot(t)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := s.opts.NewID()
			spec := s.spec(id)
			spec.RootFS = tt.rootfs
			ctx, cancel := context.WithTimeout(context.Background(), s.opts.BootTimeout)
			defer cancel()
			sb, err := s.d.Start(ctx, spec)
			if err == nil {
				// Some drivers only notice when the guest cannot run the
				// agent; then the agent must never connect.
				c := agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
				wctx, wcancel := context.WithTimeout(ctx, 3*time.Second)
				werr := c.WaitReady(wctx)
				wcancel()
				c.Close()
				sb.Close()
				s.d.Delete(context.Background(), id)
				if werr == nil {
					t.Fatalf("a sandbox on root %s answered", tt.rootfs)
				}
				t.Logf("Start accepted root %s; the agent never came up", tt.rootfs)
			}
			s.assertGone(t, id)
		})
	}
}

// notExecutableRoot is a root filesystem whose agent is a text file.
func notExecutableRoot(t *testing.T) string {
	root := t.TempDir()
	p := filepath.Join(root, "usr/local/bin/airlock-agent")
	os.MkdirAll(filepath.Dir(p), 0o755)
	os.WriteFile(p, []byte("not a program\n"), 0o755)
	return root
}
