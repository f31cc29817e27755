// Package runtime defines the driver interface every isolation backend
// implements (gvisor, qemu, and the in-process fake for tests) and the
// optional capability interfaces found by type assertion. A driver declares
// what it can do in its Info (Describer): its worker registers that with
// the control plane, which places and gates on it; a power a driver does not
// declare is refused with ErrUnsupported. internal/runtime/runtimetest is
// the conformance suite that every driver runs.
//
// A driver owns everything it creates for a sandbox (processes, mounts,
// cgroups, namespaces, temp dirs) and must release all of it in Delete, even
// after a crash of the worker: Delete of an id the driver half-created, or
// that a previous worker process created, must still clean up. The
// sandbox's network is not the driver's: the worker's internal/network
// makes it, hands it over in Spec.Network and releases it after Delete.
package runtime

import (
	"context"
	"errors"
	"net"
	"net/netip"

	"github.com/airlock/airlock/internal/model"
)

// ErrNotFound is returned for a sandbox id the driver does not know.
var ErrNotFound = errors.New("runtime: sandbox not found")

// ErrUnavailable marks the failure of a runtime that cannot run sandboxes
// on this worker at all (its set-up failed), as opposed to a failure of one
// sandbox. Multi keeps such a runtime's failures to its own sandboxes.
var ErrUnavailable = errors.New("runtime unavailable")

// UnavailableError says why runtime Runtime cannot run sandboxes here; it
// matches ErrUnavailable.
type UnavailableError struct {
	Runtime string
	Err     error
}

func (e *UnavailableError) Error() string {
	return "runtime " + e.Runtime + " is unavailable on this worker: " + e.Err.Error()
}
func (e *UnavailableError) Unwrap() error        { return e.Err }
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// Availability is implemented by drivers that can turn out unusable after
// they are constructed (a set-up in the background): Unavailable returns nil
// while the driver works or may still work, and the reason (an error
// matching ErrUnavailable) once it is known not to.
type Availability interface {
	Unavailable() error
}

// ErrUnsupported marks a call for a power the sandbox's runtime does not
// have (does not declare in its Info): pausing on a runtime without Pause,
// a checkpoint that leaves the sandbox running without LeaveRunning. The
// error that wraps it names the runtime and the power.
var ErrUnsupported = errors.New("not supported by the runtime")

// Info is what a runtime is and can do: its name and its powers
// (model.RuntimeCaps). It is the same record a worker registers.
type Info = model.RuntimeInfo

// Caps are a runtime's optional powers.
type Caps = model.RuntimeCaps

// Describer is implemented by drivers that declare their Info. Every driver
// of this module does; see Describe for one that does not.
type Describer interface {
	Describe(ctx context.Context) Info
}

// Describe returns d's Info: what d declares, or, for a driver that does
// not implement Describer, its name and the powers its interfaces imply
// (Pauser: Pause; Snapshotter: Snapshot, LeaveRunning and Fork).
func Describe(ctx context.Context, d Driver) Info {
	if ds, ok := d.(Describer); ok {
		return ds.Describe(ctx)
	}
	info := Info{Name: d.Name()}
	_, info.Caps.Pause = d.(Pauser)
	if _, ok := d.(Snapshotter); ok {
		info.Caps.Snapshot, info.Caps.LeaveRunning, info.Caps.Fork = true, true, true
	}
	return info
}

// Unsupported is the error for a call that needs power capability (a
// model.RuntimeCaps JSON name: "pause", "snapshot", "leave_running",
// "fork", "network") of runtime name, which it lacks; what words the call
// ("pause sandboxes"). It matches ErrUnsupported.
func Unsupported(name, capability, what string) error {
	return &unsupportedError{name, capability, what}
}

type unsupportedError struct{ runtime, capability, what string }

func (e *unsupportedError) Error() string {
	return "runtime " + e.runtime + " cannot " + e.what + " (it does not declare " + e.capability + "): " + ErrUnsupported.Error()
}
func (e *unsupportedError) Unwrap() error { return ErrUnsupported }

// Spec describes one sandbox to start.
type Spec struct {
	ID        string // unique, fixed length (runsc matches ids by prefix)
	Runtime   string // driver name ("gvisor", "qemu"); Multi dispatches on it
	RootFS    string // template root filesystem directory (read-only, shared)
	VCPUs     int
	MemoryMiB int
	// DiskMiB bounds the guest's writable filesystem (0: the driver's default).
	DiskMiB  int
	Hostname string
	// AgentArgs are extra arguments for the in-guest agent (PID 1).
	AgentArgs []string
	// Network is the sandbox's network as the worker's internal/network
	// made it; the driver joins it and creates no network of its own.
	Network Network
	// WritableRoot makes the guest write straight into RootFS instead of
	// an overlay of the driver's own: a template builder's RUN step, whose
	// RootFS is an overlay mount the builder made (and bounds) so that it
	// can take the step's changes from its upper layer. Only drivers whose
	// Info declares Caps.Build take it; others refuse it.
	WritableRoot bool
}

// Network is a sandbox's network, made (and released) by internal/network
// before the driver starts the sandbox: the network namespace its runtime
// processes join and the links in it that the guest's devices attach to.
// The zero Network is loopback only, in a namespace the driver's isolation
// makes anyway (gvisor's --network=none); a driver that needs more (a VM's
// NIC) refuses it.
type Network struct {
	// Namespace is the path of a network namespace (/run/netns/airlock-<id>).
	Namespace string `json:"namespace,omitempty"`
	// Interfaces are the links in Namespace, one per guest device.
	Interfaces []Interface `json:"interfaces,omitempty"`
	// Gateway is the guest's default route and Nameservers its resolvers
	// (an egress network, internal/network; zero: none).
	Gateway     netip.Addr   `json:"gateway,omitzero"`
	Nameservers []netip.Addr `json:"nameservers,omitempty"`
	// Gateway6 is the guest's IPv6 default route, when an IPv6 address is
	// among its interface's Addresses (zero: no IPv6).
	Gateway6 netip.Addr `json:"gateway6,omitzero"`
	// CACert is a CA certificate (PEM) the guest trusts besides its own
	// roots: its org's Airlock CA, which the egress gateway intercepts
	// TLS with. The driver puts its roots plus CACert at GuestCABundle.
	CACert []byte `json:"ca_cert,omitempty"`
}

// GuestCABundle is the guest's system CA bundle (Debian's path; also
// what SSL_CERT_FILE, REQUESTS_CA_BUNDLE and NODE_EXTRA_CA_CERTS name
// when a Network has a CACert).
const GuestCABundle = "/etc/ssl/certs/ca-certificates.crt"

// BuildCABundle is where a sandbox with a WritableRoot finds the same
// bundle (its tree's own at GuestCABundle stays the tree's, for a build
// step to change): under /dev, a tmpfs of the sandbox's own, so the mount
// point is not written into the tree.
const BuildCABundle = "/dev/airlock/ca-certificates.crt"

// AppendCA is a CA bundle with ca (PEM) appended after a comment saying
// whose it is; bundle itself when ca is empty. Drivers that build the
// guest's bundle and the worker that fixes one up share it.
func AppendCA(bundle, ca []byte) []byte {
	if len(ca) == 0 {
		return bundle
	}
	if len(bundle) > 0 && bundle[len(bundle)-1] != '\n' {
		bundle = append(bundle, '\n')
	}
	bundle = append(bundle, "# Airlock: the org's CA, which the egress gateway intercepts TLS with\n"...)
	return append(bundle, ca...)
}

// Interface is one link of a Network.
type Interface struct {
	// Name is the link's name in the namespace (a tap, "tap0", for a VM's NIC).
	Name string `json:"name"`
	// Addresses are the guest's addresses on it; none while nothing is
	// routed beyond the namespace (an egress gateway assigns them).
	Addresses []netip.Prefix `json:"addresses,omitempty"`
	// MAC is the hardware address the guest's device must have ("": the
	// driver's own): an egress network's filter admits only its frames.
	MAC string `json:"mac,omitempty"`
}

// Status is what the driver observes.
type Status string

const (
	StatusRunning Status = "running"
	StatusPaused  Status = "paused"
	StatusStopped Status = "stopped" // the runtime process exists but the guest is not running
	StatusGone    Status = "gone"    // nothing left for this id
)

// Driver is the minimal runtime.
type Driver interface {
	Name() string
	// Start creates and starts the sandbox; when it returns nil the guest is
	// booting and the agent will connect to the channel.
	Start(ctx context.Context, spec Spec) (Sandbox, error)
	// Adopt reattaches to a sandbox started by an earlier worker process.
	Adopt(ctx context.Context, id string) (Sandbox, error)
	// Delete stops the sandbox and releases everything it held. Idempotent.
	Delete(ctx context.Context, id string) error
	// List returns the ids of every sandbox the driver has state for.
	List(ctx context.Context) ([]string, error)
	Status(ctx context.Context, id string) (Status, error)
}

// Sandbox is a handle on a running sandbox.
type Sandbox interface {
	ID() string
	// AgentConn returns the next connection from the in-guest agent, waiting
	// until one arrives or ctx ends. The agent serves HTTP/2 (h2c) on it.
	AgentConn(ctx context.Context) (net.Conn, error)
	// Close releases the handle (not the sandbox).
	Close() error
}

// Pauser is implemented by drivers that can freeze a sandbox in memory.
type Pauser interface {
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
}

// Snapshotter is implemented by drivers that can write a sandbox's memory,
// runtime state and filesystem changes to a directory and start a sandbox
// from such a directory again (suspend/wake, checkpoints, forks).
type Snapshotter interface {
	// Checkpoint writes the state of sandbox id into dir, which exists and is
	// empty. With leaveRunning the sandbox keeps running (a checkpoint);
	// without it the guest is stopped afterwards and the caller releases the
	// runtime with Delete (suspend). A failed Checkpoint must leave a sandbox
	// that was running still running (or report it lost); what it wrote to
	// dir is garbage the caller removes. The agent channel may be
	// re-established across a Checkpoint (the agent redials, as after a
	// Restore): requests in flight fail and the caller waits for the agent.
	Checkpoint(ctx context.Context, id, dir string, leaveRunning bool) error
	// Restore starts sandbox spec.ID from the state in dir (read only; the
	// same dir may be restored several times, e.g. for forks). spec.ID must
	// not exist in the driver.
	Restore(ctx context.Context, spec Spec, dir string) (Sandbox, error)
}

// StopReasoner is implemented by drivers that can say why a sandbox stopped
// on its own (e.g. "guest kernel panic: …", "qemu exited: …"); "" if unknown.
type StopReasoner interface {
	StopReason(id string) string
}
