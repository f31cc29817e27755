package network_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/network"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/testenv"
)

var vm = runtime.Caps{Network: true}

// links lists the links of the namespace at path, name → up, through a
// netlink handle in that namespace (the test's thread stays where it is).
func links(t *testing.T, path string) map[string]bool {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatalf("open namespace %s: %v", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", path, err)
	}
	defer h.Close()
	ls, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, l := range ls {
		out[l.Attrs().Name] = l.Attrs().Flags&(1<<0) != 0 // net.FlagUp
	}
	return out
}

// assertReleased checks nothing of id's network is left: no name, no mount.
func assertReleased(t *testing.T, id string) {
	t.Helper()
	if network.Exists(id) {
		t.Errorf("namespace %s remains", network.Path(id))
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.Contains(sc.Text(), id) {
			t.Errorf("mount of %s remains: %s", id, sc.Text())
		}
	}
}

func TestSetupRelease(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces and taps")
	ctx := context.Background()
	id := model.NewID("sb")
	t.Cleanup(func() { network.Release(ctx, id) })
	_, hostTap := netlink.LinkByName("tap0")
	n, err := network.Setup(ctx, id, vm, network.Config{})
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	if n.Namespace != "/run/netns/airlock-"+id || len(n.Interfaces) != 1 || n.Interfaces[0].Name != "tap0" || len(n.Interfaces[0].Addresses) != 0 {
		t.Fatalf("Setup = %+v; want namespace /run/netns/airlock-%s with tap0 and no addresses", n, id)
	}
	got := links(t, n.Namespace)
	if len(got) != 2 || !got["lo"] || !got["tap0"] {
		t.Errorf("links in the namespace = %v; want exactly lo and tap0, both up", got)
	}
	// The host's namespace (this test's) did not get the tap.
	if _, err := netlink.LinkByName("tap0"); err == nil && hostTap != nil {
		t.Errorf("tap0 appeared in the host namespace")
	}
	// Nothing routed: no route at all in the namespace.
	if out, err := exec.Command("nsenter", "--net="+n.Namespace, "ip", "-o", "route", "show", "table", "all").CombinedOutput(); err == nil {
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if l != "" && !strings.Contains(l, " dev lo ") {
				t.Errorf("route in the sandbox namespace: %s", l)
			}
		}
	}
	// A second Setup of the same id replaces the first (a failed Release).
	if _, err := network.Setup(ctx, id, vm, network.Config{}); err != nil {
		t.Fatalf("Setup again: %v", err)
	}
	if err := network.Release(ctx, id); err != nil {
		t.Fatalf("Release: %v", err)
	}
	assertReleased(t, id)
	if err := network.Release(ctx, id); err != nil {
		t.Errorf("second Release: %v", err)
	}
}

// TestReleaseWhileInUse: a process still in the namespace (a VM the driver
// has not killed yet) does not stop Release; the name and mount go at once.
func TestReleaseWhileInUse(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces and taps")
	ctx := context.Background()
	id := model.NewID("sb")
	t.Cleanup(func() { network.Release(ctx, id) })
	n, err := network.Setup(ctx, id, vm, network.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("nsenter", "--net="+n.Namespace, "sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if err := network.Release(ctx, id); err != nil {
		t.Fatalf("Release with a process inside: %v", err)
	}
	assertReleased(t, id)
}

// TestReleaseAfterCrash: what a worker killed mid-Setup leaves (the name
// created but not bound, or bound with no links yet) is released by id.
func TestReleaseAfterCrash(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces and taps")
	ctx := context.Background()
	id := model.NewID("sb")
	t.Cleanup(func() { network.Release(ctx, id) })
	if err := os.MkdirAll(network.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Killed between creating the file and binding the namespace on it.
	if err := os.WriteFile(network.Path(id), nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := network.Release(ctx, id); err != nil {
		t.Fatalf("Release of an unbound name: %v", err)
	}
	assertReleased(t, id)
	// Killed after binding, before the links: ip netns add makes just that.
	if out, err := exec.Command("ip", "netns", "add", network.Name(id)).CombinedOutput(); err != nil {
		t.Skipf("ip netns add: %v: %s", err, out)
	}
	if err := network.Release(ctx, id); err != nil {
		t.Fatalf("Release of a bare namespace: %v", err)
	}
	assertReleased(t, id)
	// And Setup over such a leftover works.
	exec.Command("ip", "netns", "add", network.Name(id)).Run()
	if _, err := network.Setup(ctx, id, vm, network.Config{}); err != nil {
		t.Fatalf("Setup over a leftover: %v", err)
	}
	if err := network.Release(ctx, id); err != nil {
		t.Fatal(err)
	}
	assertReleased(t, id)
}

// TestNoDevice: a runtime without a network device gets the zero Network
// and nothing is made (gvisor keeps --network=none); no root needed.
func TestNoDevice(t *testing.T) {
	id := model.NewID("sb")
	n, err := network.Setup(context.Background(), id, runtime.Caps{Pause: true, Snapshot: true}, network.Config{})
	if err != nil || n.Namespace != "" || len(n.Interfaces) != 0 {
		t.Fatalf("Setup without a network device = %+v, %v; want the zero Network", n, err)
	}
	if network.Exists(id) {
		t.Errorf("a namespace was made for a runtime without a network device")
	}
	if err := network.Release(context.Background(), id); err != nil {
		t.Errorf("Release of nothing: %v", err)
	}
}

func TestInvalidID(t *testing.T) {
	for _, id := range []string{"", "a/b", "..", strings.Repeat("x", 65)} {
		if _, err := network.Setup(context.Background(), id, vm, network.Config{}); err == nil {
			t.Errorf("Setup(%q) succeeded", id)
		}
		// Nothing can exist for it: nothing to release, nothing touched.
		if err := network.Release(context.Background(), id); err != nil {
			t.Errorf("Release(%q) = %v; want nil", id, err)
		}
	}
}
