package agent

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
	"time"
)

// A command's processes. Every command runs in its own session (its leader
// is a session and process-group leader with pgid = sid = the leader's pid).
// The processes of the command are then:
//
//   - the members of that session (whatever process group they moved to),
//   - and any process holding one of the command's output pipes, which
//     catches a process that left the session (setsid) but still writes to
//     the command's output and so keeps it from finishing.
//
// They are found by walking /proc (pid, state, pgrp and session from
// /proc/N/stat, pipe inodes from /proc/N/fd); zombies count as gone. A
// process that both left the session and closed the output is no longer
// part of the command.

// treeScan lists the live processes of the command whose leader is sid,
// besides the agent itself. pipes are the inodes of the command's output
// pipes (none for a terminal). The value is whether the pid is in the
// leader's process group (which one kill(-sid) reaches).
//
// With members false only pipe holders are listed: once the session is
// empty its id may be reused, and its "members" would be strangers.
func treeScan(sid int, pipes []uint64, members bool) map[int]bool {
	out := map[int]bool{}
	d, err := os.Open("/proc")
	if err != nil {
		return out
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	self := os.Getpid()
	var pipeLinks [][]byte
	for _, ino := range pipes {
		pipeLinks = append(pipeLinks, []byte("pipe:["+strconv.FormatUint(ino, 10)+"]"))
	}
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || pid == self || pid <= 1 {
			continue
		}
		state, pgrp, sess, ok := procStat(pid)
		if !ok || state == 'Z' || state == 'X' || state == 'x' {
			continue
		}
		if members && (sess == sid || pgrp == sid) {
			out[pid] = pgrp == sid
			continue
		}
		if len(pipeLinks) > 0 && holdsPipe(pid, pipeLinks) {
			out[pid] = false
		}
	}
	return out
}

// procStat reads state, process group and session of pid.
func procStat(pid int) (state byte, pgrp, sess int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, 0, false
	}
	// "pid (comm) state ppid pgrp session ..."; comm may hold spaces and ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, 0, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 4 || len(f[0]) == 0 {
		return 0, 0, 0, false
	}
	pg, err1 := strconv.Atoi(string(f[2]))
	s, err2 := strconv.Atoi(string(f[3]))
	if err1 != nil || err2 != nil {
		return 0, 0, 0, false
	}
	return f[0][0], pg, s, true
}

func holdsPipe(pid int, links [][]byte) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	d, err := os.Open(dir)
	if err != nil {
		return false
	}
	fds, _ := d.Readdirnames(-1)
	d.Close()
	buf := make([]byte, 64)
	for _, fd := range fds {
		n, err := syscall.Readlink(dir+"/"+fd, buf)
		if err != nil || n <= 0 {
			continue
		}
		for _, l := range links {
			if bytes.Equal(buf[:n], l) {
				return true
			}
		}
	}
	return false
}

// pipeInode is the inode number of a pipe end (0 if unknown).
func pipeInode(f *os.File) uint64 {
	fi, err := f.Stat()
	if err != nil {
		return 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}

// signalTree delivers sig to every process of the command: the leader's
// process group with one kill(-sid) (the kernel also hands a signal to a
// child being forked meanwhile), then each other member found by treeScan
// (in another group of the session, or holding the output) once, rescanning
// until a scan finds none that has not had it.
//
// pipes returns the output pipes to look for, nil once they are closed
// (looking for their holders reads every process's fds, so it is skipped
// when it cannot matter).
func signalTree(sid int, pipes func() []uint64, sig syscall.Signal, leaderGone bool) error {
	var err error
	// With the leader gone and its session empty, sid may already name
	// another process's group.
	members := !leaderGone || len(treeScan(sid, nil, true)) > 0
	if members {
		if err = syscall.Kill(-sid, sig); err == syscall.ESRCH {
			err = nil
		}
	}
	sent := map[int]bool{}
	for {
		fresh := 0
		for pid, inGroup := range treeScan(sid, pipes(), members) {
			if inGroup || sent[pid] {
				continue
			}
			sent[pid] = true
			fresh++
			_ = syscall.Kill(pid, sig)
		}
		if fresh == 0 {
			return err
		}
	}
}

// killTreeLimit bounds how long killTree keeps at it (a process in
// uninterruptible sleep can take a while to die).
const killTreeLimit = time.Minute

// killTree SIGKILLs every process of the command until none is left alive
// (a process with a pending SIGKILL cannot fork, so this ends). It reports
// whether the command is gone.
func killTree(sid int, pipes func() []uint64) bool {
	deadline := time.Now().Add(killTreeLimit)
	pause := 100 * time.Microsecond
	sessionGone := false
	for {
		var left map[int]bool
		if !sessionGone {
			_ = syscall.Kill(-sid, syscall.SIGKILL)
			left = treeScan(sid, nil, true)
			// Once the session is empty its id may be reused by a new
			// process (even a new command): never kill(-sid) again.
			sessionGone = len(left) == 0
		}
		if sessionGone {
			left = treeScan(sid, pipes(), false) // anyone else holding the output?
		}
		if len(left) == 0 {
			return true
		}
		for pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause) // let the killed ones exit before looking again
		pause = min(2*pause, 20*time.Millisecond)
	}
}
