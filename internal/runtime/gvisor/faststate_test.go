package gvisor

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestFastState reads state files as runsc writes them, against a real
// process standing in for the sandbox (its last argument is the id): alive
// is running (or paused), killed is stopped, a recycled PID whose command
// line names another id is stopped, and a file it cannot vouch for falls
// back to runsc (errNoControl).
func TestFastState(t *testing.T) {
	const id = "sb-faststate"
	proc := exec.Command("sh", "-c", "sleep 60", id)
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proc.Process.Kill(); proc.Wait() })
	other := exec.Command("sh", "-c", "sleep 60", "sb-other")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Process.Kill(); other.Wait() })
	// Start returns once the child is forked; until it has exec'd, its
	// command line is this test's, which names no id.
	for _, c := range []*exec.Cmd{proc, other} {
		for deadline := time.Now().Add(5 * time.Second); ; {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", c.Process.Pid))
			if strings.Contains(string(b), "sleep 60") || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}

	d := &Driver{cfg: Config{StateDir: t.TempDir()}}
	write := func(body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(d.cfg.StateDir, id+"_sandbox:"+id+".state"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	state := func(status string, pid int) string {
		return fmt.Sprintf(`{"id":%q,"status":%q,"goferPid":1,"sandbox":{"id":%q,"pid":%d,"controlSocketPath":"/x"}}`, id, status, id, pid)
	}

	if _, found, err := d.fastState(id); found || err != nil {
		t.Fatalf("no state file: found %v, err %v; want not found", found, err)
	}
	for _, c := range []struct {
		name, body, want string
	}{
		{"running", state("running", proc.Process.Pid), "running"},
		{"paused", state("paused", proc.Process.Pid), "paused"},
		{"created", state("created", 0), "created"},
		{"recycled pid", state("running", other.Process.Pid), "stopped"},
		{"no such pid", state("running", 1<<22+12345), "stopped"},
	} {
		write(c.body)
		st, found, err := d.fastState(id)
		if err != nil || !found || st.Status != c.want {
			t.Errorf("%s: %+v found %v err %v; want %s", c.name, st, found, err, c.want)
		}
	}
	for name, body := range map[string]string{
		"not json":   "{",
		"another id": `{"id":"sb-x","status":"running","sandbox":{"pid":1}}`,
		"no pid":     state("running", 0),
		"no status":  `{"id":"` + id + `"}`,
	} {
		write(body)
		if _, _, err := d.fastState(id); !errors.Is(err, errNoControl) {
			t.Errorf("%s: err %v, want errNoControl (ask runsc)", name, err)
		}
	}

	// Killed, not yet reaped (a zombie), then reaped: stopped both times.
	write(state("running", proc.Process.Pid))
	proc.Process.Kill()
	for range 100 {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", proc.Process.Pid)); len(b) == 0 {
			break
		}
		exec.Command("sleep", "0.01").Run()
	}
	if st, _, err := d.fastState(id); err != nil || st.Status != "stopped" {
		t.Errorf("zombie: %+v %v, want stopped", st, err)
	}
	proc.Wait()
	if st, _, err := d.fastState(id); err != nil || st.Status != "stopped" {
		t.Errorf("reaped: %+v %v, want stopped", st, err)
	}
}
