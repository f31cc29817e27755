// Package scheduler decides which worker a sandbox runs on. It is pure: the
// caller passes the workers, their current load and the request, and gets a
// worker ID or an error that says why no worker fits. It does no I/O, so the
// controller can call it inside a reconcile and tests can table it.
//
// Placement is a seam: the controller (and the service's import, through
// the same instance) places through a Placer held in controller.Config;
// Default (Pick over the workers with a fresh heartbeat) is the built-in
// one. Another placer (a Kubernetes one, say, in a package of its own)
// implements Placer and is set there. DefaultHeartbeatTTL is the one
// heartbeat window of the server: placement, readiness (Ready) and the
// worker API all count a worker live by it unless configured otherwise.
package scheduler

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/model"
)

// DefaultHeartbeatTTL is how old a worker's last heartbeat may be for it to
// count as live: to take sandboxes and to make the server ready
// (controller.Config.HeartbeatTTL defaults to it; the worker API refreshes
// a long-polling worker's heartbeat every third of it).
const DefaultHeartbeatTTL = 15 * time.Second

// DefaultWorkerLossGrace is how long a worker may go without a heartbeat
// before the server counts it lost, with its sandboxes (controller
// Config.WorkerLossGrace, service Config.WorkerLossGrace): long enough for
// a worker's host to reboot (its sandboxes' snapshots are on its disk),
// short enough that users learn of a dead host within minutes.
const DefaultWorkerLossGrace = 5 * time.Minute

// Lost reports whether w has gone without a heartbeat for longer than grace.
func Lost(w model.Worker, now time.Time, grace time.Duration) bool {
	return !w.LastHeartbeat.IsZero() && now.Sub(w.LastHeartbeat) > grace
}

// Cluster is what a placement sees: the candidate workers, what their
// sandboxes already reserve (LoadOf) and the time.
type Cluster struct {
	Workers []model.Worker
	Load    map[string]Load
	Now     time.Time
}

// Placer decides which worker runs a sandbox. Place returns the ID of one
// of c.Workers, or an error wrapping model.ErrUnavailable that says why
// none fits (it becomes the pending sandbox's reason). It must not block:
// the controller calls it while it decides a reconcile step, so a placer
// that consults another system (a Kubernetes scheduler's view of its nodes)
// decides from a cache it keeps current on its own. The caller has already
// narrowed c.Workers to where the sandbox may go (a fork or an import: the
// worker holding its snapshot).
type Placer interface {
	Place(c Cluster, req Request) (workerID string, err error)
}

// Default is the built-in placement: Pick among the workers whose last
// heartbeat is within HeartbeatTTL (0: DefaultHeartbeatTTL), by Policy.
type Default struct {
	HeartbeatTTL time.Duration
	Policy       Policy
}

// Policy is how Pick chooses among the workers that fit.
type Policy string

// Placement policies (airlock server --placement).
const (
	// Spread (the default): the worker with the most free capacity, so
	// load evens out and a lost worker takes the fewest sandboxes with it.
	Spread Policy = "spread"
	// Pack: the worker with the least free capacity that fits, so whole
	// workers stay free (to be drained, scaled down or given to big
	// sandboxes).
	Pack Policy = "pack"
)

// ParsePolicy returns the policy name names ("": Spread), or an error
// wrapping model.ErrInvalid.
func ParsePolicy(name string) (Policy, error) {
	switch Policy(name) {
	case "", Spread:
		return Spread, nil
	case Pack:
		return Pack, nil
	}
	return "", model.Errorf(model.ErrInvalid, "placement policy %q: want spread or pack", name)
}

var _ Placer = Default{}

// Place implements Placer with Pick.
func (d Default) Place(c Cluster, req Request) (string, error) {
	ttl := d.HeartbeatTTL
	if ttl <= 0 {
		ttl = DefaultHeartbeatTTL
	}
	return PickBy(d.Policy, c.Workers, c.Load, req, c.Now, ttl)
}

// Ready returns nil when at least one of workers has sent a heartbeat
// within ttl of now and has a template, so a sandbox can be placed;
// otherwise an error wrapping model.ErrUnavailable that says what is
// missing. Both the controller's readiness and the service's default use it.
func Ready(workers []model.Worker, now time.Time, ttl time.Duration) error {
	live := 0
	for _, w := range workers {
		if !Fresh(w, now, ttl) {
			continue
		}
		live++
		if len(w.Templates) > 0 {
			return nil
		}
	}
	if live == 0 {
		if len(workers) == 0 {
			return model.Errorf(model.ErrUnavailable, "no worker has registered")
		}
		return model.Errorf(model.ErrUnavailable, "no worker has sent a heartbeat in the last %s (%d registered)", ttl, len(workers))
	}
	return model.Errorf(model.ErrUnavailable, "no live worker has a template yet (%d live)", live)
}

// Load is what a worker's sandboxes already reserve.
type Load struct {
	// MemoryMiB is the memory limits of the sandboxes that hold capacity
	// (Reserves), VCPUs the vCPU limits of those that can run (HoldsCPU:
	// a paused sandbox cannot).
	MemoryMiB int
	VCPUs     int
	// StartingMiB is the start footprint (StartFootprint) of the worker's
	// sandboxes that are starting or waking: memory they are about to take
	// that the worker's last reported free memory (model.Worker.FreeMiB)
	// may not show yet.
	StartingMiB int
}

// StartFootprintMiB is the memory a starting sandbox is taken to need at
// once from its worker's free memory: an idle gVisor sandbox holds about
// 15 MiB, a booting QEMU guest touches more as it runs, which the next
// report shows. It is checked against measured free memory, never against
// the reservations that overcommit governs.
const StartFootprintMiB = 64

// StartFootprint is the measured free memory a sandbox of res needs to be
// placed: StartFootprintMiB, or its whole limit when that is smaller.
func StartFootprint(res model.Resources) int { return min(res.MemoryMiB, StartFootprintMiB) }

// Add counts sb, in state s on its worker, into l.
func (l *Load) Add(res model.Resources, s model.SandboxState) {
	if !Reserves(s) {
		return
	}
	l.MemoryMiB += res.MemoryMiB
	if HoldsCPU(s) {
		l.VCPUs += res.VCPUs
	}
	if s == model.StateStarting || s == model.StateWaking {
		l.StartingMiB += StartFootprint(res)
	}
}

// Request is what a sandbox needs from a worker.
type Request struct {
	Runtime string
	// Needs are the powers the worker's Runtime must have declared.
	Needs model.RuntimeCaps
	// TemplateDigest must be on the worker ("": any worker).
	TemplateDigest string
	Resources      model.Resources
}

// RequestFor returns the placement request of sb. A sandbox that starts
// from a snapshot (a fork, an import) needs a runtime that restores
// snapshots under new ids.
func RequestFor(sb model.Sandbox) Request {
	req := Request{Runtime: sb.Runtime, TemplateDigest: sb.TemplateDigest, Resources: sb.Resources}
	if sb.Source != nil {
		req.Needs = model.RuntimeCaps{Snapshot: true, Fork: true}
	}
	return req
}

// Reserves reports whether a sandbox in state s holds resources on its
// worker: every state that is not terminal, not yet placed and not
// suspended (a suspended sandbox's runtime is released; waking takes its
// resources back on the same worker, where its snapshot is).
func Reserves(s model.SandboxState) bool {
	return !s.Terminal() && s != model.StatePending && s != model.StateSuspended
}

// HoldsCPU reports whether a sandbox in state s counts its vCPUs against
// its worker's: one that Reserves and is not paused (a paused sandbox's
// vCPUs are stopped; resuming it may overcommit the worker's CPU, which
// slows sandboxes down but never fails them, unlike memory).
func HoldsCPU(s model.SandboxState) bool { return Reserves(s) && s != model.StatePaused }

// LoadOf sums the resources reserved on each worker by sandboxes.
func LoadOf(sandboxes []model.Sandbox) map[string]Load {
	load := make(map[string]Load)
	for _, sb := range sandboxes {
		if sb.WorkerID == "" || !Reserves(sb.State) {
			continue
		}
		l := load[sb.WorkerID]
		l.Add(sb.Resources, sb.State)
		load[sb.WorkerID] = l
	}
	return load
}

// Fresh reports whether w has sent a heartbeat within ttl of now.
func Fresh(w model.Worker, now time.Time, ttl time.Duration) bool {
	return !w.LastHeartbeat.IsZero() && now.Sub(w.LastHeartbeat) <= ttl
}

// Pick returns the worker that should run req: among uncordoned workers with a fresh
// heartbeat, the runtime, the powers req needs of it (as the worker
// declared them: model.RuntimeCaps), the template digest, enough capacity
// (capacity minus load: memory and vCPUs, both already multiplied by the
// worker's overcommit) and enough measured free memory for the sandbox's
// start (model.Worker.FreeMiB, less what its starting sandboxes are about
// to take, at least StartFootprint), the one with the most free capacity
// memory (then most free vCPUs, then lowest ID). When none fits the error
// wraps model.ErrUnavailable and names the first filter that left no
// candidate.
func Pick(workers []model.Worker, load map[string]Load, req Request, now time.Time, heartbeatTTL time.Duration) (string, error) {
	return PickBy(Spread, workers, load, req, now, heartbeatTTL)
}

// PickBy is Pick choosing among the workers that fit by policy: Spread
// (Pick's order) or Pack (the least free memory first, then the fewest
// free vCPUs, then the lowest ID).
func PickBy(policy Policy, workers []model.Worker, load map[string]Load, req Request, now time.Time, heartbeatTTL time.Duration) (string, error) {
	type candidate struct {
		id               string
		freeMiB, freeCPU int
		measuredMiB      int // model.Worker.FreeMiB less starting sandboxes' footprints (-1: not reported)
	}
	var live, open, withRuntime, capable, withTemplate, withCapacity int
	var short *candidate // most measured free memory among those with capacity, for the message
	var fits []candidate
	var best *candidate // most free memory among those with the template, for the message
	for _, w := range workers {
		if !Fresh(w, now, heartbeatTTL) {
			continue
		}
		live++
		if w.Cordoned {
			continue // an operator's mark: no new sandboxes
		}
		open++
		rt, ok := w.Runtime(req.Runtime)
		if !ok {
			continue
		}
		withRuntime++
		if !rt.Caps.Has(req.Needs) {
			continue
		}
		capable++
		if req.TemplateDigest != "" && !slices.Contains(w.Templates, req.TemplateDigest) {
			continue // ("": any worker, e.g. for an import)
		}
		withTemplate++
		l := load[w.ID]
		c := candidate{id: w.ID, freeMiB: w.CapacityMiB - l.MemoryMiB, freeCPU: w.CapacityVCPUs - l.VCPUs, measuredMiB: -1}
		if w.FreeMiB != nil {
			c.measuredMiB = max(*w.FreeMiB-l.StartingMiB, 0)
		}
		if best == nil || c.freeMiB > best.freeMiB {
			best = &c
		}
		if c.freeMiB < req.Resources.MemoryMiB || c.freeCPU < req.Resources.VCPUs {
			continue
		}
		withCapacity++
		if short == nil || c.measuredMiB > short.measuredMiB {
			short = &c
		}
		if c.measuredMiB >= 0 && c.measuredMiB < StartFootprint(req.Resources) {
			continue // its host would really run out
		}
		fits = append(fits, c)
	}
	switch {
	case live == 0:
		return "", model.Errorf(model.ErrUnavailable, "no live worker: none has sent a heartbeat in the last %s", heartbeatTTL)
	case open == 0:
		return "", model.Errorf(model.ErrUnavailable, "no live worker takes new sandboxes: all %d are cordoned (`airlock worker uncordon <id>`)", live)
	case withRuntime == 0:
		return "", model.Errorf(model.ErrUnavailable, "no live worker supports runtime %q", req.Runtime)
	case capable == 0:
		return "", model.Errorf(model.ErrUnavailable, "no live worker's runtime %q can %s", req.Runtime, describeNeeds(req.Needs))
	case withTemplate == 0:
		return "", model.Errorf(model.ErrUnavailable, "no live worker with runtime %q has template %s", req.Runtime, req.TemplateDigest)
	case withCapacity > 0 && len(fits) == 0:
		return "", model.Errorf(model.ErrUnavailable,
			"no worker has the memory free to start a sandbox (%d MiB needed at start; most free: %d MiB on worker %s, after the sandboxes starting there)",
			StartFootprint(req.Resources), short.measuredMiB, short.id)
	case len(fits) == 0:
		return "", model.Errorf(model.ErrUnavailable,
			"no worker has capacity for %d MiB and %d vCPUs (most free: %d MiB, %d vCPUs on worker %s)",
			req.Resources.MemoryMiB, req.Resources.VCPUs, best.freeMiB, best.freeCPU, best.id)
	}
	dir := -1 // Spread: most free first
	if policy == Pack {
		dir = 1
	}
	slices.SortFunc(fits, func(a, b candidate) int {
		if c := dir * cmp.Compare(a.freeMiB, b.freeMiB); c != 0 {
			return c
		}
		if c := dir * cmp.Compare(a.freeCPU, b.freeCPU); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	return fits[0].id, nil
}

// describeNeeds words the powers of need for an error.
func describeNeeds(need model.RuntimeCaps) string {
	var words []string
	for _, c := range []struct {
		on   bool
		what string
	}{
		{need.Pause, "pause sandboxes"},
		{need.Snapshot, "snapshot sandboxes"},
		{need.LeaveRunning, "checkpoint running sandboxes"},
		{need.Fork, "start sandboxes from a snapshot"},
		{need.Network, "give sandboxes a network device"},
	} {
		if c.on {
			words = append(words, c.what)
		}
	}
	return strings.Join(words, " and ")
}

// String renders l for logs.
func (l Load) String() string {
	return fmt.Sprintf("%d MiB, %d vCPUs, %d MiB starting", l.MemoryMiB, l.VCPUs, l.StartingMiB)
}
