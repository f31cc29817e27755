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
// go to whichever driver has the id. A call for a power the sandbox's
// runtime does not declare (see Describe) fails with ErrUnsupported; Infos
// reports every runtime's powers.
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
	_ Describer   = (*Multi)(nil)
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

// Offered lists the runtime names a worker offers: every driver not known
// to be unavailable, plus "auto" when there is a choice.
func (m *Multi) Offered() []string {
	var names []string
	for _, n := range m.Names() {
		if unavailable(m.Drivers[n]) == nil {
			names = append(names, n)
		}
	}
	if len(names) > 1 {
		names = append(names, Auto)
	}
	return names
}

// Infos describes each runtime of Offered, under its name in Drivers;
// "auto" has the powers every offered runtime has (it may land on any).
func (m *Multi) Infos(ctx context.Context) []Info {
	var out []Info
	var auto *Caps
	for _, n := range m.Offered() {
		if n == Auto {
			out = append(out, Info{Name: Auto, Caps: *auto})
			continue
		}
		info := m.info(ctx, n)
		out = append(out, info)
		if auto == nil {
			auto = &info.Caps
		} else {
			c := auto.And(info.Caps)
			auto = &c
		}
	}
	return out
}

// Describe is the default runtime's Info.
func (m *Multi) Describe(ctx context.Context) Info { return m.info(ctx, m.Default) }

// info is runtime name's Info, named as in Drivers.
func (m *Multi) info(ctx context.Context, name string) Info {
	d, ok := m.Drivers[name]
	if !ok {
		return Info{Name: name}
	}
	info := Describe(ctx, d)
	info.Name = name
	return info
}

// Unavailable maps each runtime known to be unavailable to its reason.
func (m *Multi) Unavailable() map[string]error {
	out := map[string]error{}
	for _, n := range m.Names() {
		if err := unavailable(m.Drivers[n]); err != nil {
			out[n] = err
		}
	}
	return out
}

// unavailable is d's reason for being unusable, nil if it is (still) usable.
func unavailable(d Driver) error {
	if a, ok := d.(Availability); ok {
		return a.Unavailable()
	}
	return nil
}

// skippable reports whether err from driver d says only that d is
// unavailable: List and lookups then go on with the other drivers.
func skippable(d Driver, err error) bool {
	return errors.Is(err, ErrUnavailable) || unavailable(d) != nil
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
	if err := unavailable(d); err != nil {
		return "", nil, err // fail fast with the reason, never wait for it
	}
	return name, d, nil
}

// Resolve names the runtime a Start or Restore for runtime name lands on
// ("" and "auto" resolved as they would be), so that a caller can prepare
// for that runtime (its network) and pass that name on.
func (m *Multi) Resolve(name string) (string, error) {
	n, _, err := m.pick(name)
	return n, err
}

// owner finds the driver that has id, and its name: the one remembered,
// else the first whose List has it.
func (m *Multi) owner(ctx context.Context, id string) (string, Driver, error) {
	m.mu.Lock()
	name, ok := m.owners[id]
	m.mu.Unlock()
	if ok {
		if d, ok := m.Drivers[name]; ok {
			return name, d, nil
		}
	}
	for _, name := range m.Names() {
		d := m.Drivers[name]
		ids, err := d.List(ctx)
		if err != nil {
			if skippable(d, err) {
				continue
			}
			return "", nil, err
		}
		if slices.Contains(ids, id) {
			m.remember(id, name)
			return name, d, nil
		}
	}
	return "", nil, ErrNotFound
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
	_, d, err := m.owner(ctx, id)
	if err != nil {
		return nil, err
	}
	return d.Adopt(ctx, id)
}

// Delete goes to the driver remembered for id (Start remembers even a
// half-started sandbox), so deleting one runtime's sandbox never depends on
// another runtime. An id nobody remembers (a previous worker process made
// it) is deleted by every driver: Delete is idempotent, and a half-created
// sandbox may not be listed yet. An unavailable driver deletes what it has
// no trace of without error (see Availability).
func (m *Multi) Delete(ctx context.Context, id string) error {
	m.mu.Lock()
	name, ok := m.owners[id]
	m.mu.Unlock()
	names := m.Names()
	if _, known := m.Drivers[name]; ok && known {
		names = []string{name}
	}
	var errs []error
	for _, name := range names {
		errs = append(errs, m.Drivers[name].Delete(ctx, id))
	}
	err := errors.Join(errs...)
	if err == nil {
		m.forget(id)
	}
	return err
}

// List aggregates every driver's sandboxes. A driver that fails because it
// is unavailable is left out (its sandboxes cannot be reached anyway, and
// calls by their ids return its reason); any other failure is the List's.
func (m *Multi) List(ctx context.Context) ([]string, error) {
	var all []string
	for _, name := range m.Names() {
		d := m.Drivers[name]
		ids, err := d.List(ctx)
		if err != nil {
			if skippable(d, err) {
				continue
			}
			return nil, err
		}
		all = append(all, ids...)
	}
	return all, nil
}

func (m *Multi) Status(ctx context.Context, id string) (Status, error) {
	_, d, err := m.owner(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return StatusGone, nil
	}
	if err != nil {
		return "", err
	}
	return d.Status(ctx, id)
}

// pauser is the Pauser of sandbox id's runtime, if it declares Pause.
func (m *Multi) pauser(ctx context.Context, id, what string) (Pauser, error) {
	name, d, err := m.owner(ctx, id)
	if err != nil {
		return nil, err
	}
	p, ok := d.(Pauser)
	if !ok || !m.info(ctx, name).Caps.Pause {
		return nil, Unsupported(name, "pause", what)
	}
	return p, nil
}

func (m *Multi) Pause(ctx context.Context, id string) error {
	p, err := m.pauser(ctx, id, "pause sandboxes")
	if err != nil {
		return err
	}
	return p.Pause(ctx, id)
}

func (m *Multi) Resume(ctx context.Context, id string) error {
	p, err := m.pauser(ctx, id, "resume sandboxes")
	if err != nil {
		return err
	}
	return p.Resume(ctx, id)
}

// Checkpoint needs Snapshot of the sandbox's runtime, and LeaveRunning too
// when it is to keep the sandbox running.
func (m *Multi) Checkpoint(ctx context.Context, id, dir string, leaveRunning bool) error {
	name, d, err := m.owner(ctx, id)
	if err != nil {
		return err
	}
	s, ok := d.(Snapshotter)
	caps := m.info(ctx, name).Caps
	switch {
	case !ok || !caps.Snapshot:
		return Unsupported(name, "snapshot", "snapshot sandboxes")
	case leaveRunning && !caps.LeaveRunning:
		return Unsupported(name, "leave_running", "checkpoint a sandbox and leave it running")
	}
	return s.Checkpoint(ctx, id, dir, leaveRunning)
}

func (m *Multi) Restore(ctx context.Context, spec Spec, dir string) (Sandbox, error) {
	name, d, err := m.pick(spec.Runtime)
	if err != nil {
		return nil, err
	}
	s, ok := d.(Snapshotter)
	if !ok || !m.info(ctx, name).Caps.Snapshot {
		return nil, Unsupported(name, "snapshot", "restore sandboxes")
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
