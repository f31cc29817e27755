package runtime

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
)

// Multi is a Driver over several drivers, one per runtime name: Start and
// Restore pick the driver by Spec.Runtime ("" means Default); calls by id
// go to whichever driver has the id.
type Multi struct {
	Drivers map[string]Driver
	Default string

	// owners remembers which driver has an id (learned from Start,
	// Restore and lookups), so that calls by id do not list every driver
	// (a runsc process per call: ~7 ms, more than a pause itself).
	mu     sync.Mutex
	owners map[string]string
}

func (m *Multi) remember(id, name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.owners == nil {
		m.owners = map[string]string{}
	}
	m.owners[id] = name
}

func (m *Multi) forget(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.owners, id)
}

var (
	_ Driver      = (*Multi)(nil)
	_ Pauser      = (*Multi)(nil)
	_ Snapshotter = (*Multi)(nil)
)

// Name lists the runtimes, default first.
func (m *Multi) Name() string { return m.Default }

// Names returns the runtime names, default first.
func (m *Multi) Names() []string {
	names := []string{m.Default}
	for n := range m.Drivers {
		if n != m.Default {
			names = append(names, n)
		}
	}
	slices.Sort(names[1:])
	return names
}

// Auto is the runtime name that lets the worker choose: the first driver
// that says it is preferred (qemu where hardware KVM works), else Default.
const Auto = "auto"

// AutoPreferrer is implemented by drivers that want "auto" sandboxes when
// they run at full speed on this host.
type AutoPreferrer interface {
	PreferredForAuto(ctx context.Context) bool
}

// Offered lists the runtime names a worker offers: every driver, plus
// "auto" when there is a choice.
func (m *Multi) Offered() []string {
	names := m.Names()
	if len(names) > 1 {
		names = append(names, Auto)
	}
	return names
}

// pick resolves a runtime name ("" and "auto" included) to a driver and
// its name in Drivers.
func (m *Multi) pick(name string) (string, Driver, error) {
	if name == "" {
		name = m.Default
	}
	if name == Auto {
		for _, n := range m.Names() {
			if p, ok := m.Drivers[n].(AutoPreferrer); ok && p.PreferredForAuto(context.Background()) {
				return n, m.Drivers[n], nil
			}
		}
		name = m.Default
	}
	d, ok := m.Drivers[name]
	if !ok {
		return "", nil, fmt.Errorf("runtime %q is not available on this worker (have %v)", name, m.Names())
	}
	return name, d, nil
}

// owner finds the driver that has id: the one remembered, else the first
// whose List has it.
func (m *Multi) owner(ctx context.Context, id string) (Driver, error) {
	m.mu.Lock()
	name, ok := m.owners[id]
	m.mu.Unlock()
	if ok {
		if d, ok := m.Drivers[name]; ok {
			return d, nil
		}
	}
	for _, name := range m.Names() {
		d := m.Drivers[name]
		ids, err := d.List(ctx)
		if err != nil {
			return nil, err
		}
		if slices.Contains(ids, id) {
			m.remember(id, name)
			return d, nil
		}
	}
	return nil, ErrNotFound
}

func (m *Multi) Start(ctx context.Context, spec Spec) (Sandbox, error) {
	name, d, err := m.pick(spec.Runtime)
	if err != nil {
		return nil, err
	}
	m.remember(spec.ID, name) // also a half-started one: Delete forgets it
	return d.Start(ctx, spec)
}

func (m *Multi) Adopt(ctx context.Context, id string) (Sandbox, error) {
	d, err := m.owner(ctx, id)
	if err != nil {
		return nil, err
	}
	return d.Adopt(ctx, id)
}

// Delete asks every driver: Delete is idempotent, and a half-created
// sandbox may not be listed yet.
func (m *Multi) Delete(ctx context.Context, id string) error {
	var errs []error
	for _, name := range m.Names() {
		errs = append(errs, m.Drivers[name].Delete(ctx, id))
	}
	err := errors.Join(errs...)
	if err == nil {
		m.forget(id)
	}
	return err
}

func (m *Multi) List(ctx context.Context) ([]string, error) {
	var all []string
	for _, name := range m.Names() {
		ids, err := m.Drivers[name].List(ctx)
		if err != nil {
			return nil, err
		}
		all = append(all, ids...)
	}
	return all, nil
}

func (m *Multi) Status(ctx context.Context, id string) (Status, error) {
	d, err := m.owner(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return StatusGone, nil
	}
	if err != nil {
		return "", err
	}
	return d.Status(ctx, id)
}

func (m *Multi) Pause(ctx context.Context, id string) error {
	d, err := m.owner(ctx, id)
	if err != nil {
		return err
	}
	p, ok := d.(Pauser)
	if !ok {
		return fmt.Errorf("runtime %s cannot pause sandboxes", d.Name())
	}
	return p.Pause(ctx, id)
}

func (m *Multi) Resume(ctx context.Context, id string) error {
	d, err := m.owner(ctx, id)
	if err != nil {
		return err
	}
	p, ok := d.(Pauser)
	if !ok {
		return fmt.Errorf("runtime %s cannot resume sandboxes", d.Name())
	}
	return p.Resume(ctx, id)
}

func (m *Multi) Checkpoint(ctx context.Context, id, dir string, leaveRunning bool) error {
	d, err := m.owner(ctx, id)
	if err != nil {
		return err
	}
	s, ok := d.(Snapshotter)
	if !ok {
		return fmt.Errorf("runtime %s cannot snapshot sandboxes", d.Name())
	}
	return s.Checkpoint(ctx, id, dir, leaveRunning)
}

func (m *Multi) Restore(ctx context.Context, spec Spec, dir string) (Sandbox, error) {
	name, d, err := m.pick(spec.Runtime)
	if err != nil {
		return nil, err
	}
	s, ok := d.(Snapshotter)
	if !ok {
		return nil, fmt.Errorf("runtime %s cannot restore sandboxes", d.Name())
	}
	m.remember(spec.ID, name)
	return s.Restore(ctx, spec, dir)
}

// StopReason asks every driver that can tell why sandbox id stopped.
func (m *Multi) StopReason(id string) string {
	for _, name := range m.Names() {
		if sr, ok := m.Drivers[name].(StopReasoner); ok {
			if r := sr.StopReason(id); r != "" {
				return r
			}
		}
	}
	return ""
}
