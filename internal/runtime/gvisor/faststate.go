package gvisor

// Status without starting runsc.
//
// The worker checks every running sandbox for a dead runtime every few
// seconds (worker.StatusInterval). `runsc state` costs a process start
// (~10-20 ms of CPU on these machines), so with hundreds of idle
// sandboxes the checks alone would keep a core busy. fastState does what
// `runsc state` does for a single-container sandbox, in process: read the
// state file and, when it says running or paused, see whether the sandbox
// process is still alive (runsc's own check is signal 0 on it). A live
// process must also still be this sandbox's runsc (its last argument is the
// id), so a recycled PID does not keep a dead sandbox running. Like
// controlPause, it reads runsc internals of the pinned version: anything
// unexpected (no pid, another id, a file it cannot parse) returns
// errNoControl and the caller asks runsc.

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// maxStateFile bounds the read of a state file (a few KiB with its spec).
const maxStateFile = 4 << 20

// fastState returns what `runsc state id` would, or errNoControl.
func (d *Driver) fastState(id string) (st runscState, found bool, err error) {
	f, err := os.Open(d.statePath(id))
	if errors.Is(err, fs.ErrNotExist) {
		return st, false, nil // runsc: "does not exist"
	}
	if err != nil {
		return st, false, errNoControl
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxStateFile+1))
	if err != nil || len(raw) > maxStateFile {
		return st, false, errNoControl
	}
	var file struct {
		ID      string `json:"id"`
		Status  string `json:"status"`
		Sandbox struct {
			Pid int `json:"pid"`
		} `json:"sandbox"`
	}
	if json.Unmarshal(raw, &file) != nil || file.ID != id || file.Status == "" {
		return st, false, errNoControl
	}
	st = runscState{ID: id, Status: file.Status, Pid: file.Sandbox.Pid}
	switch file.Status {
	case "running", "paused":
		if file.Sandbox.Pid <= 0 {
			return st, false, errNoControl
		}
		if !sandboxAlive(file.Sandbox.Pid, id) {
			st.Status = "stopped"
		}
	}
	return st, true, nil
}

// sandboxAlive reports whether pid is a live process whose last argument is
// id (runsc's sandbox and gofer processes end their command lines with the
// container id). A zombie has an empty command line: dead.
func sandboxAlive(pid int, id string) bool {
	if err := unix.Kill(pid, 0); err != nil && !errors.Is(err, unix.EPERM) {
		return false
	}
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return false
	}
	args := bytes.Split(bytes.TrimRight(b, "\x00"), []byte{0})
	return len(b) > 0 && string(args[len(args)-1]) == id
}
