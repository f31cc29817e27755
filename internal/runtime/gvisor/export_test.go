package gvisor

import (
	"context"
	"encoding/json"
	"os"
)

// RunscCommand is runsc and its global flags, for running runsc subcommands
// against d's sandboxes.
func RunscCommand(d *Driver) (string, []string) { return d.cfg.RunscPath, d.globalArgs() }

// FastStatus and RunscStatus are the two ways Status reads a sandbox's
// status (faststate.go and `runsc state`), for tests that compare them.
func FastStatus(d *Driver, id string) (string, bool, error) {
	st, found, err := d.fastState(id)
	return st.Status, found, err
}

func RunscStatus(d *Driver, id string) (string, bool, error) {
	st, found, err := d.state(context.Background(), id)
	return st.Status, found, err
}

// SandboxPid is the sandbox process of id, from runsc.
func SandboxPid(d *Driver, id string) (int, error) {
	raw, err := os.ReadFile(d.statePath(id))
	if err != nil {
		return 0, err
	}
	var f struct {
		Sandbox struct{ Pid int } `json:"sandbox"`
	}
	return f.Sandbox.Pid, json.Unmarshal(raw, &f)
}
