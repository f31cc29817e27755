package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/network"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/workerapi"
)

// The worker owns each sandbox's network (internal/network), the drivers
// only join it: startRuntime and restoreRuntime make it and hand it over in
// spec.Network; deleteRuntime releases it after the driver's Delete. Every
// release of a sandbox's runtime goes through deleteRuntime, so a network
// is released wherever a runtime is (failed starts, orphans after a crash).

// caps are the declared powers of runtime name, as resolved by the driver
// ("" and "auto": the runtime a Multi would pick; the driver's own for one
// driver).
func (w *Worker) caps(ctx context.Context, name string) runtime.Caps {
	for _, info := range w.runtimeInfo(ctx) {
		if info.Name == name {
			return info.Caps
		}
	}
	return runtime.Describe(ctx, w.cfg.Driver).Caps
}

// withNetwork makes spec's network and runs call with it; a call that fails
// (other than for an id that exists, whose network is in use) releases it.
func (w *Worker) withNetwork(ctx context.Context, spec runtime.Spec, policy *model.SandboxNetwork, call func(runtime.Spec) (runtime.Sandbox, error)) (runtime.Sandbox, error) {
	// "auto" lands on one runtime; decide it once, so the network made is
	// the one that runtime takes.
	if r, ok := w.cfg.Driver.(interface{ Resolve(string) (string, error) }); ok {
		name, err := r.Resolve(spec.Runtime)
		if err != nil {
			return nil, err
		}
		spec.Runtime = name
	}
	cfg := w.cfg.Network
	if g, ok := w.cfg.Gateway.(ipv6Gateway); ok && cfg.Egress {
		// IPv6 on the link only when the policy at setup can use it: a
		// policy that later adds an IPv6 CIDR applies from the next start.
		cfg.IPv6 = g.AllowsIPv6(spec.ID, policy)
	}
	t0 := time.Now()
	n, err := network.Setup(ctx, spec.ID, w.caps(ctx, spec.Runtime), cfg)
	if err != nil {
		return nil, err
	}
	eg := w.egressOf(spec.ID)
	if n.Gateway.IsValid() && eg != nil && eg.CACert != "" {
		// The guest trusts its org's CA from the start: a policy may
		// intercept later.
		n.CACert = []byte(eg.CACert)
	}
	if err := w.attachGateway(spec.ID, policy); err != nil {
		return nil, errors.Join(err, network.Release(context.WithoutCancel(ctx), spec.ID))
	}
	spec.Network = n
	t1 := time.Now()
	h, err := call(spec)
	w.log.Debug("sandbox network and runtime", "sandbox", spec.ID, "network", t1.Sub(t0), "runtime", time.Since(t1))
	if err != nil && !errors.Is(err, model.ErrConflict) {
		w.detachGateway(spec.ID)
		err = errors.Join(err, network.Release(context.WithoutCancel(ctx), spec.ID))
	}
	return h, err
}

// ipv6Gateway is a Gateway that tells whether a sandbox's policy allows
// IPv6 destinations (an allow rule with an IPv6 CIDR): its network then
// gets IPv6 too (network.Config.IPv6).
type ipv6Gateway interface {
	AllowsIPv6(id string, policy *model.SandboxNetwork) bool
}

// attachGateway opens sandbox id's gateway listeners, if it has an egress
// network, and hands them to the gateway under policy.
func (w *Worker) attachGateway(id string, policy *model.SandboxNetwork) error {
	if w.cfg.Gateway == nil || !w.cfg.Network.Egress || !network.HasGateway(id) {
		return nil
	}
	ls, err := network.OpenGateway(id, w.cfg.Network)
	if err != nil {
		return err
	}
	if err := w.cfg.Gateway.Attach(id, ls, policy, w.egressOf(id)); err != nil {
		ls.Close()
		return err
	}
	return nil
}

// noEgress is the policy of runtimes the worker runs for itself.
var noEgress = &model.SandboxNetwork{Profile: "none", Policy: []byte(`{"version":1,"default":"deny"}`)}

// networkPolicy is the egress policy of sandbox id's assignment (nil: none
// known, the gateway's default).
func (w *Worker) networkPolicy(id string) *model.SandboxNetwork {
	w.mu.Lock()
	defer w.mu.Unlock()
	if sb := w.sandboxes[id]; sb != nil {
		return sb.spec.Network
	}
	return nil
}

// egressOf is the interception material of sandbox id's assignment
// (nil: none).
func (w *Worker) egressOf(id string) *workerapi.Egress {
	w.egressMu.Lock()
	defer w.egressMu.Unlock()
	if eg, ok := w.egress[id]; ok {
		return eg
	}
	return w.buildEgress[id]
}

// setBuildEgress records (eg non-nil) or forgets the interception
// material of a build step's sandbox id, which no assignment carries.
func (w *Worker) setBuildEgress(id string, eg *workerapi.Egress) {
	w.egressMu.Lock()
	defer w.egressMu.Unlock()
	if eg == nil {
		delete(w.buildEgress, id)
		return
	}
	if w.buildEgress == nil {
		w.buildEgress = map[string]*workerapi.Egress{}
	}
	w.buildEgress[id] = eg
}

// recordEgress keeps the assignments' interception material (in memory
// only) and hands changed material of recorded sandboxes to the gateway;
// w.mu is held.
func (w *Worker) recordEgress(as []workerapi.Assignment) {
	next := make(map[string]*workerapi.Egress, len(as))
	for _, a := range as {
		if a.Egress != nil {
			next[a.Sandbox.ID] = a.Egress
		}
	}
	w.egressMu.Lock()
	prev := w.egress
	w.egress = next
	w.egressMu.Unlock()
	if w.cfg.Gateway == nil || !w.cfg.Network.Egress {
		return
	}
	for id, eg := range next {
		sb := w.sandboxes[id]
		if sb == nil || eg.Equal(prev[id]) {
			continue
		}
		if err := w.cfg.Gateway.Update(id, sb.spec.Network, eg); err != nil && network.HasGateway(id) {
			w.log.Warn("egress material update", "sandbox", id, "err", err)
		}
	}
}

// updateGateway applies a changed policy of sandbox id; w.mu is held.
func (w *Worker) updateGateway(id string, old, now *model.SandboxNetwork) {
	if w.cfg.Gateway == nil || !w.cfg.Network.Egress || sameNetwork(old, now) {
		return
	}
	if err := w.cfg.Gateway.Update(id, now, w.egressOf(id)); err != nil && network.HasGateway(id) {
		w.log.Warn("egress policy update", "sandbox", id, "err", err)
	}
}

func sameNetwork(a, b *model.SandboxNetwork) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Profile == b.Profile && string(a.Policy) == string(b.Policy)
}

func (w *Worker) detachGateway(id string) {
	if w.cfg.Gateway != nil {
		w.cfg.Gateway.Detach(id)
	}
}

// startRuntime starts spec in a network of its own, under egress policy
// (nil: the gateway's default).
func (w *Worker) startRuntime(ctx context.Context, spec runtime.Spec, policy *model.SandboxNetwork) (_ runtime.Sandbox, err error) {
	ctx, end := w.stepSpan(ctx, spec.ID, "runtime.boot")
	defer func() { end(err) }()
	return w.withNetwork(ctx, spec, policy, func(spec runtime.Spec) (runtime.Sandbox, error) { return w.cfg.Driver.Start(ctx, spec) })
}

// restoreRuntime restores spec from dir in a network of its own.
func (w *Worker) restoreRuntime(ctx context.Context, snap runtime.Snapshotter, spec runtime.Spec, dir string, policy *model.SandboxNetwork) (_ runtime.Sandbox, err error) {
	ctx, end := w.stepSpan(ctx, spec.ID, "runtime.restore")
	defer func() { end(err) }()
	return w.withNetwork(ctx, spec, policy, func(spec runtime.Spec) (runtime.Sandbox, error) { return snap.Restore(ctx, spec, dir) })
}

// deleteRuntime releases sandbox id's runtime and then its network.
// Idempotent, and works from the id alone (after a crash).
func (w *Worker) deleteRuntime(ctx context.Context, id string) (err error) {
	ctx, end := w.stepSpan(ctx, id, "runtime.delete")
	defer func() { end(err) }()
	err = w.cfg.Driver.Delete(ctx, id)
	w.detachGateway(id)
	return errors.Join(err, network.Release(ctx, id))
}

// caEnv are the variables that point TLS clients at the guest's bundle
// (which holds the org CA: trustOrgCA), for runtimes and tools that do not
// read the system bundle on their own (Node above all).
var caEnv = []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"}

// withCAEnv is env plus caEnv naming runtime.GuestCABundle when sandbox
// id's guest trusts an org CA (the sandbox's own values win). env is not
// modified.
func (w *Worker) withCAEnv(id string, env map[string]string) map[string]string {
	if w.cfg.Gateway == nil || !w.cfg.Network.Egress {
		return env
	}
	if eg := w.egressOf(id); eg == nil || eg.CACert == "" {
		return env
	}
	out := make(map[string]string, len(env)+len(caEnv))
	for _, k := range caEnv {
		out[k] = runtime.GuestCABundle
	}
	for k, v := range env {
		out[k] = v
	}
	return out
}

// maxGuestBundle bounds the guest's CA bundle read by trustOrgCA.
const maxGuestBundle = 8 << 20

// trustOrgCA puts sandbox id's org CA into the guest's system bundle if it
// is not there: a driver that mounts it (gvisor) has; a VM's guest, or
// one restored from a template image booted for no org, gets it written
// through the agent (as root; the guest's own trust store, so nothing the
// guest could not do itself).
func (w *Worker) trustOrgCA(ctx context.Context, id string, ac *agentclient.Client) error {
	if w.cfg.Gateway == nil || !w.cfg.Network.Egress || !network.HasGateway(id) {
		return nil
	}
	eg := w.egressOf(id)
	if eg == nil || eg.CACert == "" {
		return nil
	}
	ca := []byte(eg.CACert)
	var bundle []byte
	if rc, _, err := ac.ReadFile(ctx, runtime.GuestCABundle); err == nil {
		bundle, err = io.ReadAll(io.LimitReader(rc, maxGuestBundle+1))
		rc.Close()
		if err != nil {
			return fmt.Errorf("read the guest's CA bundle: %w", err)
		}
		if len(bundle) > maxGuestBundle {
			return fmt.Errorf("the guest's CA bundle is over %d MiB", maxGuestBundle>>20)
		}
	}
	if bytes.Contains(bundle, bytes.TrimSpace(ca)) {
		return nil
	}
	bundle = runtime.AppendCA(bundle, ca)
	if _, err := ac.WriteFile(ctx, runtime.GuestCABundle, "0644", "root", bytes.NewReader(bundle)); err != nil {
		return fmt.Errorf("write the guest's CA bundle: %w", err)
	}
	return nil
}
