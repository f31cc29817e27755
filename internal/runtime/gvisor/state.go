package gvisor

import (
	"context"
	"encoding/json"
	"os"
	"sync"
)

// runscStatusFile reads the status runsc last recorded for the container
// from its state file ("running", "paused", ...) without running runsc,
// which takes 10-15 ms. ok is false when the file is missing, being
// rewritten or in a format this code does not know; the caller then asks
// `runsc state`. The file is runsc's own; the status field is what
// `runsc state` prints, before runsc's check that the sandbox is alive.
func (d *Driver) runscStatusFile(id string) (status string, ok bool) {
	b, err := os.ReadFile(d.statePath(id))
	if err != nil {
		return "", false
	}
	var st struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.ID != id {
		return "", false
	}
	switch st.Status {
	case "creating", "created", "running", "paused", "stopped":
		return st.Status, true
	}
	return "", false
}

// runscStatus is runsc's status of the container: from the state file when
// it can be read, else from `runsc state`. found is false when runsc has
// no such container.
func (d *Driver) runscStatus(ctx context.Context, id string) (status string, found bool, err error) {
	if s, ok := d.runscStatusFile(id); ok {
		return s, true, nil
	}
	st, found, err := d.state(ctx, id)
	return st.Status, found, err
}

// idLock serialises the operations on one sandbox id.
type idLock struct {
	mu   sync.Mutex
	refs int
}

// lock locks id against the other operations on it and returns the unlock.
func (d *Driver) lock(id string) (unlock func()) {
	d.mu.Lock()
	l := d.locks[id]
	if l == nil {
		l = &idLock{}
		d.locks[id] = l
	}
	l.refs++
	d.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		d.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(d.locks, id)
		}
		d.mu.Unlock()
	}
}
