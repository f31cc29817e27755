package agentclient_test

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/agentclient"
)

// The harness agent runs on this host, so the tests can look at the
// command's processes in /proc directly.

// hostProc is one process as /proc/N/stat shows it.
type hostProc struct {
	pid, ppid, pgrp, sid int
	state                byte
	comm                 string
}

func readHostProc(pid int) (hostProc, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return hostProc{}, false
	}
	i, j := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if i < 0 || j < i {
		return hostProc{}, false
	}
	f := strings.Fields(string(b[j+1:]))
	if len(f) < 4 {
		return hostProc{}, false
	}
	p := hostProc{pid: pid, state: f[0][0], comm: string(b[i+1 : j])}
	p.ppid, _ = strconv.Atoi(f[1])
	p.pgrp, _ = strconv.Atoi(f[2])
	p.sid, _ = strconv.Atoi(f[3])
	return p, true
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	p, ok := readHostProc(pid)
	return ok && p.state != 'Z' && p.state != 'X'
}

// hostProcs lists every live process on the host.
func hostProcs() []hostProc {
	ents, _ := os.ReadDir("/proc")
	var out []hostProc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := readHostProc(pid); ok && p.state != 'Z' && p.state != 'X' {
			out = append(out, p)
		}
	}
	return out
}

// descendants returns the live processes below pid (by parent links).
func descendants(pid int) []hostProc {
	ps := hostProcs()
	in := map[int]bool{pid: true}
	var out []hostProc
	for changed := true; changed; {
		changed = false
		for _, p := range ps {
			if in[p.ppid] && !in[p.pid] {
				in[p.pid] = true
				out = append(out, p)
				changed = true
			}
		}
	}
	return out
}

// waitForChild waits (without a time limit other than ctx) until a live
// process named comm runs below pid, and returns it.
func waitForChild(ctx context.Context, t *testing.T, pid int, comm string) hostProc {
	t.Helper()
	for {
		for _, p := range descendants(pid) {
			if p.comm == comm {
				return p
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no %s below process %d: %v", comm, pid, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// startStarted starts `sh -c script` as root (with the given timeout in
// seconds, 0 for none) as process id, and returns its info and output
// stream once its first frame, "started\n" on stdout, has come.
func startStarted(ctx context.Context, t *testing.T, c *agentclient.Client, id, script string, timeoutS int) (agentapi.ProcessInfo, *agentclient.OutputStream) {
	t.Helper()
	pi, err := c.StartProcess(ctx, agentapi.ProcessSpec{ID: id, User: "root", TimeoutS: timeoutS, Argv: []string{"sh", "-c", script}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Output(ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	kind, payload, err := s.Next()
	if err != nil || kind != agentapi.FrameStdout || string(payload) != "started\n" {
		t.Fatalf("first frame %d %q %v", kind, payload, err)
	}
	return pi, s
}

// signalSleeping waits until a sleep runs below pid, sends sig to command
// id, and returns the sleep's pid.
func signalSleeping(ctx context.Context, t *testing.T, c *agentclient.Client, id string, pid int, sig string) int {
	t.Helper()
	sleep := waitForChild(ctx, t, pid, "sleep").pid
	if err := c.Signal(ctx, id, sig); err != nil {
		t.Fatal(err)
	}
	return sleep
}

// leftOf lists the processes of a finished command that are still alive:
// members of its session (sid = the leader's pid) and the given pids.
func leftOf(sid int, pids ...int) []hostProc {
	var out []hostProc
	seen := map[int]bool{}
	for _, p := range hostProcs() {
		if p.sid == sid || p.pgrp == sid {
			out = append(out, p)
			seen[p.pid] = true
		}
	}
	for _, pid := range pids {
		if p, ok := readHostProc(pid); ok && !seen[pid] && p.state != 'Z' && p.state != 'X' {
			out = append(out, p)
		}
	}
	return out
}

// TestSignalEndsWholeCommand attacks the signal path with commands whose
// children dodge a process-group signal: one ignores TERM, one moves to its
// own session (setsid) and keeps the output open. The command must end
// (its output stream closes with the leader's exit) and none of its
// processes may be left. On the old agent (kill(-pgid) only) each case
// hangs until the test's deadline and leaves the sleeps behind.
func TestSignalEndsWholeCommand(t *testing.T) {
	h := startAgent(t)
	ctx := testCtx(t)
	tests := []struct {
		name    string
		script  string
		signal  string
		timeout int
		want    agentapi.Exit
	}{
		{name: "TERM/child ignores TERM", signal: "TERM", want: agentapi.Exit{ExitCode: -1, Signal: "TERM"},
			script: `(trap "" TERM; sleep 1000) & echo started; wait`},
		{name: "INT/child ignores INT", signal: "INT", want: agentapi.Exit{ExitCode: -1, Signal: "INT"},
			// sh -c catches INT itself; it dies of it only after its foreground
			// job, so the leader here is a sleep that does not catch it.
			script: `(trap "" INT; sleep 1000) & echo started; exec sleep 1000`},
		{name: "KILL/child left the session", signal: "KILL", want: agentapi.Exit{ExitCode: -1, Signal: "KILL"},
			script: `setsid sleep 1000 & echo started; wait`},
		{name: "TERM/child left the session", signal: "TERM", want: agentapi.Exit{ExitCode: -1, Signal: "TERM"},
			script: `setsid sh -c 'trap "" TERM; sleep 1000' & echo started; wait`},
		{name: "timeout/grandchild left the session and ignores everything", timeout: 2,
			want:   agentapi.Exit{ExitCode: -1, Signal: "KILL", TimedOut: true},
			script: `setsid sh -c 'trap "" TERM INT HUP; exec sleep 1000' & echo started; wait`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := newID()
			pi, s := startStarted(ctx, t, h.client, id, tt.script, tt.timeout)
			var sleeps []int
			if tt.signal != "" {
				// The dodging child is running before the signal is sent.
				sleeps = append(sleeps, signalSleeping(ctx, t, h.client, id, pi.PID, tt.signal))
			} else {
				for _, p := range descendants(pi.PID) {
					sleeps = append(sleeps, p.pid)
				}
			}
			r := collect(t, s)
			if r.exit != tt.want {
				t.Fatalf("exit %+v, want %+v", r.exit, tt.want)
			}
			if left := leftOf(pi.PID, sleeps...); len(left) > 0 {
				t.Fatalf("processes of the command left alive: %+v", left)
			}
		})
	}
}
