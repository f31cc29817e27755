// Package network makes and releases sandbox networks on a worker. The
// worker calls Setup before a driver starts (or restores) a sandbox and
// hands the driver the runtime.Network it returns (runtime.Spec.Network);
// it calls Release after the driver's Delete. Drivers create no network of
// their own: they join what they are handed.
//
// What a sandbox gets depends on its runtime's declared powers
// (runtime.Caps.Network, "the guest has a network device"):
//
//   - A runtime with a network device (qemu): its own network namespace,
//     bound at /run/netns/airlock-<id> (what `ip netns` shows), with lo up
//     and one tap, "tap0", up, that the VM's virtio-net NIC attaches to.
//     Nothing is routed beyond the namespace: no addresses, no routes, no
//     link to the host. The guest's eth0 reaches nothing. (With
//     Config.Egress the tap is bridged to the egress gateway instead:
//     vm.go.)
//   - Any other runtime (gvisor): the zero Network. gVisor keeps
//     --network=none: runsc gives the sandbox a fresh empty namespace and
//     the Sentry's netstack with loopback only, and the Sentry makes no
//     host network calls at all. Running it with --network=sandbox in a
//     namespace of ours that holds only lo would look the same from inside
//     but route the guest's packets through host sockets in that namespace
//     (a wider attack surface for no gain while nothing is routed); it is
//     the mode an egress gateway would switch gvisor to, together with a
//     link in the namespace.
//
// This is the seam an egress gateway plugs into: it would add, in Setup, a
// veth (or the tap's peer) from the namespace to the gateway, the guest's
// addresses (runtime.Interface.Addresses) and the namespace's routes and
// filters, and remove them in Release; the drivers stay unchanged.
//
// Release is idempotent and works from the sandbox id alone, so it also
// cleans up after a crash of the worker (a namespace whose sandbox is
// gone): it unmounts and removes the namespace's bind mount; the kernel
// frees the namespace, and the tap in it, when the last process in it (the
// VM) has exited. Setup replaces a namespace a failed Release left behind.
//
// The namespace and links are made with the netlink library
// (github.com/vishvananda/netlink, with github.com/vishvananda/netns)
// rather than by running ip(8): no dependency on iproute2 being installed,
// errors as values (errno) instead of parsed output, no process per step,
// and the same library an egress gateway would use for veths, addresses
// and routes. The work happens on a locked OS thread that unshares into the
// new namespace and is then thrown away (never unlocked), so no other
// goroutine ever runs in a sandbox's namespace.
package network

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime"
)

// Dir is where named network namespaces are bound (as with `ip netns`).
const Dir = "/run/netns"

// TapName is the tap in a VM sandbox's namespace. It is the same in every
// sandbox (each has its own namespace), so snapshots restore under any id.
const TapName = "tap0"

// Name is the name of sandbox id's network namespace.
func Name(id string) string { return "airlock-" + id }

// Path is the path of sandbox id's network namespace.
func Path(id string) string { return filepath.Join(Dir, Name(id)) }

func validID(id string) error {
	if id == "" || len(id) > 64 || strings.ContainsAny(id, "/ \t\n\x00") || id == "." || id == ".." {
		return fmt.Errorf("network: sandbox id %q: %w", id, model.ErrInvalid)
	}
	return nil
}

// Setup makes sandbox id's network for a runtime with powers caps and
// returns it for runtime.Spec.Network. With cfg.Egress it is an egress
// network (egress.go; for a runtime with a network device the VM's, vm.go;
// with cfg.IPv6 a runtime without one gets IPv6 on the link too);
// without, for a runtime without a network device it makes nothing and
// returns the zero Network. On error nothing is left behind.
func Setup(ctx context.Context, id string, caps runtime.Caps, cfg Config) (runtime.Network, error) {
	if err := validID(id); err != nil {
		return runtime.Network{}, err
	}
	if !caps.Network && !cfg.Egress {
		return runtime.Network{}, nil
	}
	// Left by a Release that failed half-way (nothing runs in it: its
	// sandbox's driver state is gone, or the driver refuses the id anyway).
	if err := Release(ctx, id); err != nil {
		return runtime.Network{}, err
	}
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		return runtime.Network{}, fmt.Errorf("network setup %s: %w", id, err)
	}
	if cfg.Egress {
		var v6 *Link6
		if _, err := os.Stat("/proc/sys/net/ipv6"); err == nil && cfg.IPv6 {
			v6 = &DefaultLink6 // (a kernel without IPv6: the link stays IPv4)
		}
		setup := func(id string, l Link) (runtime.Network, error) { return setupEgress(id, l, v6) }
		if caps.Network {
			setup = setupVMEgress // IPv4 only
		}
		n, err := setup(id, cfg.link())
		if err != nil {
			return runtime.Network{}, errors.Join(fmt.Errorf("network setup %s: %w", id, err), Release(context.WithoutCancel(ctx), id))
		}
		return n, nil
	}
	done := make(chan error, 1)
	go func() {
		// This thread enters the new namespace and is never unlocked: it
		// ends with the goroutine, and the namespace never leaks into
		// another goroutine.
		goruntime.LockOSThread()
		done <- makeNamespace(id)
	}()
	if err := <-done; err != nil {
		return runtime.Network{}, errors.Join(fmt.Errorf("network setup %s: %w", id, err), Release(context.WithoutCancel(ctx), id))
	}
	return runtime.Network{Namespace: Path(id), Interfaces: []runtime.Interface{{Name: TapName}}}, nil
}

// makeNamespace runs on a locked thread: it unshares a new network
// namespace, binds it at Path(id) and brings up lo and the tap in it.
func makeNamespace(id string) error {
	ns, err := netns.NewNamed(Name(id))
	if err != nil {
		return fmt.Errorf("create namespace %s: %w", Name(id), err)
	}
	defer ns.Close()
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	// Persistent (QEMU opens it later by name), one queue, no packet
	// information header: what `ip tuntap add mode tap` makes.
	tap := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: TapName}, Mode: netlink.TUNTAP_MODE_TAP, Flags: netlink.TUNTAP_NO_PI}
	err = netlink.LinkAdd(tap)
	for _, f := range tap.Fds {
		f.Close()
	}
	if err != nil {
		return fmt.Errorf("add tap %s: %w", TapName, err)
	}
	if err := netlink.LinkSetUp(tap); err != nil {
		return fmt.Errorf("set %s up: %w", TapName, err)
	}
	return nil
}

// Release removes sandbox id's network: it unbinds and removes its
// namespace (the kernel frees the namespace and its links once no process
// is left in it). Releasing what does not exist is not an error, nor is
// releasing an id Setup refuses (nothing can exist for it; nothing outside
// Dir is touched).
func Release(ctx context.Context, id string) error {
	if validID(id) != nil {
		return nil
	}
	return errors.Join(unbind(id, Path(id)), unbind(id, GatewayPath(id)))
}

// unbind unmounts and removes the namespace bound at p.
func unbind(id, p string) error {
	if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	// Detach: a process that holds the namespace open keeps it, the name
	// goes at once. EINVAL: not a mount point (a Setup that died between
	// creating the file and binding it).
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("network release %s: unmount %s: %w", id, p, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("network release %s: %w", id, err)
	}
	return nil
}

// Exists reports whether sandbox id has a network namespace.
func Exists(id string) bool {
	_, err := os.Lstat(Path(id))
	if err != nil {
		_, err = os.Lstat(GatewayPath(id))
	}
	return err == nil
}
