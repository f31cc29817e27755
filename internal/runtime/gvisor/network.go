package gvisor

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/airlock/airlock/internal/network"
	"github.com/airlock/airlock/internal/runtime"
)

// A sandbox handed a network (an egress network, internal/network) joins
// its namespace with --network=sandbox. The network is recorded in the
// sandbox's directory (networkFile): runsc moves the guest's address and
// route from eth0 into its netstack whenever it starts or restores, so an
// in-place restore (resumeInPlace) puts them back first. The guest's
// resolvers are its /etc/resolv.conf, a read-only bind mount of a file in
// that directory.

const (
	networkFile = "network.json"
	resolvFile  = "resolv.conf"
	bundleFile  = "ca-certificates.crt"
	// maxRootBundle bounds the template's own CA bundle read.
	maxRootBundle = 8 << 20
)

// writeNetwork records spec's network and, with resolvers, mounts a
// resolv.conf naming them over the guest's.
func (d *Driver) writeNetwork(spec runtime.Spec, o *ociSpec) error {
	dir := d.sandboxDir(spec.ID)
	if spec.Network.Namespace == "" {
		os.Remove(filepath.Join(dir, networkFile))
		return nil
	}
	b, err := json.Marshal(spec.Network)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, networkFile), b, 0o600); err != nil {
		return err
	}
	switch {
	case spec.Network.Gateway.IsValid() && spec.WritableRoot:
		// A build step writes the tree's own bundle (apt's
		// update-ca-certificates): the org's CA, if any, goes beside it,
		// where the worker points the step's TLS variables.
		if len(spec.Network.CACert) > 0 {
			if err := d.writeBundleAt(spec, dir, o, runtime.BuildCABundle); err != nil {
				return err
			}
		}
	case spec.Network.Gateway.IsValid():
		// Every egress network mounts the bundle, with or without a CA
		// (runsc restores only into the mounts it checkpointed with, and
		// a sandbox's material may reach a restarted worker after it
		// restores).
		if err := d.writeBundle(spec, dir, o); err != nil {
			return err
		}
	}
	if len(spec.Network.Nameservers) == 0 {
		return nil
	}
	var conf strings.Builder
	for _, ns := range spec.Network.Nameservers {
		fmt.Fprintf(&conf, "nameserver %s\n", ns)
	}
	conf.WriteString("options edns0\n")
	p := filepath.Join(dir, resolvFile)
	if err := os.WriteFile(p, []byte(conf.String()), 0o644); err != nil {
		return err
	}
	o.Mounts = append(o.Mounts, ociMount{Destination: "/etc/resolv.conf", Type: "bind", Source: p, Options: []string{"rbind", "ro"}})
	return nil
}

// writeBundle mounts the template's CA bundle plus the network's CA over
// the guest's (runtime.GuestCABundle), read-only. The template's bundle
// is read inside its root (os.Root: a symlink in an image cannot make
// the worker read a host file) and bounded.
func (d *Driver) writeBundle(spec runtime.Spec, dir string, o *ociSpec) error {
	return d.writeBundleAt(spec, dir, o, runtime.GuestCABundle)
}

// writeBundleAt is writeBundle mounting at dest.
func (d *Driver) writeBundleAt(spec runtime.Spec, dir string, o *ociSpec, dest string) error {
	var bundle []byte
	if root, err := os.OpenRoot(spec.RootFS); err == nil {
		if f, err := root.Open(strings.TrimPrefix(runtime.GuestCABundle, "/")); err == nil {
			bundle, _ = io.ReadAll(io.LimitReader(f, maxRootBundle))
			f.Close()
		}
		root.Close()
	}
	bundle = runtime.AppendCA(bundle, spec.Network.CACert)
	p := filepath.Join(dir, bundleFile)
	if err := os.WriteFile(p, bundle, 0o644); err != nil {
		return err
	}
	o.Mounts = append(o.Mounts, ociMount{Destination: dest, Type: "bind", Source: p, Options: []string{"rbind", "ro"}})
	return nil
}

// recordedNetwork is the network sandbox id was started with (zero: none).
func (d *Driver) recordedNetwork(id string) runtime.Network {
	var n runtime.Network
	b, err := os.ReadFile(filepath.Join(d.sandboxDir(id), networkFile))
	if err == nil {
		json.Unmarshal(b, &n)
	}
	return n
}

// networkNamespace is the namespace sandbox id joined ("": none).
func (d *Driver) networkNamespace(id string) string { return d.recordedNetwork(id).Namespace }

// restoreGuestLink puts the guest's addresses and route back on its
// interface before an in-place restore.
func (d *Driver) restoreGuestLink(id string) error {
	n := d.recordedNetwork(id)
	if err := network.PrepareAt(n); err != nil {
		return fmt.Errorf("gvisor: restore %s: %w", id, err)
	}
	return nil
}
