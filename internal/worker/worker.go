// Package worker is the airlock worker: it registers with the server, loops
// on the worker API's Sync (heartbeat and observed state up, assignments
// down), reconciles its runtime driver toward the assignments, and serves
// the data plane (command attach over WebSocket, file streaming) for the
// sandboxes it runs. It never touches the database: data-plane requests are
// authorized by tokens the server signs with the key handed over at
// registration.
//
// Reconciliation is level triggered and per-sandbox serialized: at most one
// action (start, delete, pause, resume, suspend or wake) runs for a sandbox
// at a time, each in its own goroutine, and every change of observed state
// triggers an immediate Sync. Desired states: running, deleted, paused when
// the driver implements runtime.Pauser, and suspended when it implements
// runtime.Snapshotter and the worker has a snapshot store (lifecycle.go).
// Each Sync's assignments are reconciled in three parts (reconcile.go): the
// local state is copied under the worker's lock, a pure plan (plan.go, its
// rules numbered and table-tested) turns it, the assignments and the time
// into steps, and the executor carries them out, starting the actions.
// Stopping the worker (cancelling Run's context) leaves sandboxes running; a
// new worker process on the same host adopts them, and finds suspended ones
// in the snapshot store.
package worker

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/blob"
	"github.com/airlock/airlock/internal/httperr"
	"github.com/airlock/airlock/internal/httplimit"
	"github.com/airlock/airlock/internal/image/build"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/network"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/snapshot"
	"github.com/airlock/airlock/internal/tracing"
	"github.com/airlock/airlock/internal/workerapi"

	"go.opentelemetry.io/otel/trace"
)

// Timing defaults.
const (
	// StartTimeout bounds Driver.Start plus the wait for the agent.
	StartTimeout = 60 * time.Second
	// AdoptTimeout bounds re-attaching to one sandbox after a restart.
	AdoptTimeout = 15 * time.Second
	// StatusInterval is how often running sandboxes are checked for a dead runtime.
	StatusInterval = 2 * time.Second
	// DeleteRetryDelay spaces out retries of a failing delete.
	DeleteRetryDelay = 5 * time.Second
	// SyncWait is the long-poll duration asked of the server.
	SyncWait = 25 * time.Second
)

// Config wires a worker.
type Config struct {
	ID        string
	ServerURL string // base URL of the server, e.g. http://127.0.0.1:8080, or several, comma-separated (replicas: it fails over)
	// WorkerToken is the join token the worker registers with; the server
	// answers a first registration with the worker's own secret, which the
	// worker sends from then on.
	WorkerToken string
	// SecretFile keeps that secret (mode 0600) across restarts; "": in
	// memory only (a restarted worker cannot re-register under its id).
	SecretFile string
	// DataPlaneListener, if set, is served; otherwise DataPlaneAddr is listened on.
	DataPlaneListener net.Listener
	DataPlaneAddr     string
	// DataPlaneURL is the base URL clients reach the data plane at (advertised
	// to the server). Defaults to http://<listener address>.
	DataPlaneURL string
	// Driver runs sandboxes; the daemon passes a *runtime.Multi, whose
	// Names() the worker reports as its runtimes.
	Driver runtime.Driver
	// Snapshots stores suspend snapshots; nil: the worker cannot suspend.
	Snapshots *snapshot.Store
	// Blobs is the shared blob store (nil: none): a suspend pushes its
	// snapshot there before it is reported, and a suspended sandbox
	// assigned here from another worker is pulled from it (blobs.go).
	Blobs blob.Store
	// Templates lists the templates present on this worker.
	Templates func() ([]model.Template, error)
	// RootFS maps a template digest to its root filesystem directory ("" if absent).
	RootFS func(digest string) string
	// RemoveTemplate removes the template digest from the catalog (and its
	// ext4 image) unless the copy there was made after notAfter, and says
	// whether it did; nil: deleted templates stay (templates.go).
	RemoveTemplate func(digest string, notAfter time.Time) (bool, error)
	// CapacityMiB and CapacityVCPUs are what the worker offers sandboxes'
	// limits, overcommit included (Capacity makes them).
	CapacityMiB   int
	CapacityVCPUs int
	// FreeMiB measures the memory the host has free for sandboxes, sent
	// with every registration and Sync (nil: not measured; HostFreeMiB is
	// the host's).
	FreeMiB func() (int, bool)
	// TemplateImages names the runtimes whose creates restore a template
	// image instead of booting (templates.go).
	TemplateImages map[string]bool
	Logger         *slog.Logger
	// HTTPClient calls the server; nil: a client without a global timeout.
	HTTPClient *http.Client
	// Network is how sandbox networks are made (internal/network; the zero
	// value: isolated, no egress).
	Network network.Config
	// Gateway serves the traffic of egress networks (Network.Egress): the
	// worker attaches each sandbox's gateway listeners to it when its
	// runtime starts or is adopted and detaches them when it goes. nil
	// with Egress: the listeners are not opened and the guest's
	// connections are refused.
	Gateway Gateway
	// Builder builds templates sent to the data plane's /v1/builds (nil:
	// the worker does not build; build.go).
	Builder *build.Builder
	// ImportTemplate imports an image archive (an OCI layout tar or a
	// docker save archive) into the catalog as name:tag (ref: which image
	// of several), for the data plane's /v1/imports (nil: none).
	ImportTemplate func(ctx context.Context, archive, name, tag, ref string) (model.Template, error)
	// NetLog receives the gateway's decisions (the daemon feeds it from
	// the gateway's events); the worker serves it on the data plane and
	// sends its denials up in each Sync (netlog.go). nil: an empty one.
	NetLog *NetLog
	// Observer receives the worker's measurements: snapshots written and
	// restored, data-plane bytes (the daemon's Prometheus metrics). nil:
	// none.
	Observer Observer
	// Tracer, when it records (internal/tracing), gives the worker's
	// actions spans in the traces of the operations they serve
	// (tracing.go); nil: off.
	Tracer trace.TracerProvider
}

// Observer receives a worker's measurements. Its methods are called inline
// and must not block.
type Observer interface {
	// Snapshot reports a snapshot written (kind "suspend", "checkpoint", …)
	// or restored (kind "restore"): its bytes (written ones) and duration;
	// err is nil when it succeeded.
	Snapshot(kind string, bytes int64, d time.Duration, err error)
	// DataPlane reports bytes moved by the data plane: direction "out" to
	// clients (command output, file reads) or "in" from them (stdin, file
	// writes), for kind "command" or "file".
	DataPlane(kind, direction string, bytes int64)
}

// noObserver is the Observer of a worker configured without one.
type noObserver struct{}

func (noObserver) Snapshot(string, int64, time.Duration, error) {}
func (noObserver) DataPlane(string, string, int64)              {}

func (w *Worker) observer() Observer {
	if w.cfg.Observer == nil {
		return noObserver{}
	}
	return w.cfg.Observer
}

// Gateway is the worker's egress gateway (internal/egress).
type Gateway interface {
	// Attach serves sandbox id's listeners under policy (nil: the
	// worker's default) with its interception material (nil: none) until
	// Detach (which closes them); attaching an attached sandbox replaces
	// its listeners.
	Attach(id string, ls network.Listeners, policy *model.SandboxNetwork, eg *workerapi.Egress) error
	// Update applies a new policy and material to an attached sandbox:
	// new connections follow it at once, open ones it denies are cut.
	Update(id string, policy *model.SandboxNetwork, eg *workerapi.Egress) error
	Detach(id string)
}

// Validate reports what is missing from c.
func (c *Config) Validate() error {
	var errs []error
	if c.ID == "" {
		errs = append(errs, errors.New("worker id is empty"))
	}
	if c.ServerURL == "" {
		errs = append(errs, errors.New("server url is empty"))
	}
	for _, u := range strings.Split(c.ServerURL, ",") {
		if pu, err := url.Parse(strings.TrimSpace(u)); c.ServerURL != "" && (err != nil || pu.Scheme != "http" && pu.Scheme != "https" || pu.Host == "") {
			errs = append(errs, fmt.Errorf("server url %q: want http(s)://host[:port]", u))
		}
	}
	if c.DataPlaneListener == nil && c.DataPlaneAddr == "" {
		errs = append(errs, errors.New("neither a data-plane listener nor an address"))
	}
	if c.Driver == nil {
		errs = append(errs, errors.New("no runtime driver"))
	}
	if c.RootFS == nil {
		errs = append(errs, errors.New("no rootfs resolver"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("worker config: %w", model.Errorf(model.ErrInvalid, "%v", err))
	}
	return nil
}

// sandbox is the worker's view of one local sandbox. Fields are guarded by
// Worker.mu; busy marks an action in flight.
type sandbox struct {
	id     string
	state  model.SandboxState // starting, running, paused, suspending, suspended, waking, failed, deleting, deleted
	reason string
	busy   bool
	// retryAt delays another delete (or pause) after one failed;
	// suspendRetryAt another suspend, wakeRetryAt another wake.
	retryAt        time.Time
	suspendRetryAt time.Time
	wakeRetryAt    time.Time
	env            map[string]string
	// spec is the sandbox as last assigned (runtime, template, resources).
	spec   workerapi.SandboxSpec
	handle runtime.Sandbox
	agent  *agentclient.Client
	// snapshotID/snapshotBytes name the committed suspend snapshot while
	// the sandbox is suspended.
	snapshotID    string
	snapshotBytes int64
	// snapshotShared: that snapshot is in Config.Blobs too.
	snapshotShared bool
	// lastActivity is the last data-plane use (see touch).
	lastActivity time.Time
	// wakeCall is the wake request in flight to the server, shared by every
	// data-plane request waiting for this sandbox.
	wakeCall *wakeCall
	// taskResult is the outcome of the assignment's task, reported until
	// the assignment drops it (snapshots.go).
	taskResult *workerapi.TaskResult
	// startedFrom: how start started it (model.Started*).
	startedFrom string
	// action is the typed outcome of the last failed suspend or wake,
	// reported while reason is still actionReason (any later change of
	// reason retires it).
	action       *workerapi.ActionResult
	actionReason string
}

// actionFailed records that sb's action kind failed with err: reason for
// people, a typed result for the server (workerapi.ActionResult).
func (sb *sandbox) actionFailed(kind model.OperationKind, reason string, err error) {
	_, code := httperr.Status(err)
	sb.reason, sb.actionReason = reason, reason
	sb.action = &workerapi.ActionResult{Kind: kind, ErrorCode: code, Message: workerapi.TruncateReason(err.Error())}
}

// Worker runs sandboxes for one server.
type Worker struct {
	cfg Config
	// tracer is nil when tracing is off; opRefs are the operations the
	// last assignments serve, by sandbox (tracing.go; under mu).
	tracer trace.Tracer
	opRefs map[string]*workerapi.OperationRef
	// reportedFree is the free memory (MiB) of the last Sync (capacity.go).
	reportedFree atomic.Int64
	// epoch and syncSeq order this process's Syncs for the server
	// (workerapi.SyncRequest.Epoch): a long poll cut short may arrive
	// after the Sync that replaced it.
	epoch   string
	syncSeq uint64
	log     *slog.Logger
	http    *http.Client
	ln      net.Listener

	key    atomic.Pointer[verifyKeys] // data-plane verification keys, set at registration and by Sync
	secret atomic.Pointer[string]     // the worker's own credential (see Config.SecretFile)
	api    *workerapi.Client          // the server's worker API

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	// unadopted holds, per sandbox id, why a runtime sandbox found at
	// start-up could not be adopted (its runtime is released). plan
	// decides with the sandbox's assignment: one still being created is
	// created again, any other is reported failed with this reason.
	unadopted map[string]string
	synced    bool // a Sync succeeded: assignments are authoritative
	// orphanCheckAt is when reconcile looks for orphan snapshots again
	// (plan's rule 6).
	orphanCheckAt time.Time
	// fence: see fence.go.
	fence fenceState
	// pullRetryAt delays another pull of a sandbox's snapshot from the
	// blob store after one failed for a reason that may pass (blobs.go).
	pullRetryAt map[string]time.Time
	// imageBuilds are the template images being built (templates.go).
	imageBuilds map[string]chan struct{} // closed when the build ends
	// removingTemplates are the deleted templates being removed; once one
	// is, templatesGone makes the next Sync report the catalog.
	removingTemplates map[string]bool
	removedTemplates  map[string]bool // removed, still asked: not again
	templatesGone     atomic.Bool
	tmplConfigs       templateConfigs // command defaults of templates (tmplconfig.go)
	workerID          string

	kick chan struct{} // observed state changed: sync now
	// egress is the assignments' interception material by sandbox id
	// (recordEgress), in memory only.
	egressMu    sync.Mutex
	egress      map[string]*workerapi.Egress
	buildEgress map[string]*workerapi.Egress // build steps' sandboxes (build.go)
	// stateCh is closed and replaced on every change of a sandbox's state
	// (guarded by stateMu), for data-plane requests waiting on one.
	stateMu  sync.Mutex
	stateCh  chan struct{}
	activity atomic.Bool // a sandbox's lastActivity moved since the last report
	resync   atomic.Bool // the next Sync asks for the assignments at once
	actions  sync.WaitGroup
	attaches sync.WaitGroup // hijacked WebSocket handlers, which Shutdown does not wait for

	cmds startedCommands // the commands started per sandbox (dataplane.go)
	net  *NetLog         // the sandboxes' network logs (netlog.go)
}

// New returns a worker for cfg; it listens on the data-plane address at once
// so the advertised URL is known.
func New(cfg Config) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	w := &Worker{
		epoch:       model.NewID("epoch"),
		cfg:         cfg,
		log:         cfg.Logger,
		http:        cfg.HTTPClient,
		sandboxes:   make(map[string]*sandbox),
		unadopted:   make(map[string]string),
		pullRetryAt: make(map[string]time.Time),
		kick:        make(chan struct{}, 1),
		stateCh:     make(chan struct{}),
		workerID:    cfg.ID,
		net:         cfg.NetLog,
	}
	if w.net == nil {
		w.net = NewNetLog()
	}
	if tracing.On(cfg.Tracer) {
		w.tracer = tracing.Tracer(cfg.Tracer)
	}
	if w.log == nil {
		w.log = slog.Default()
	}
	w.log = w.log.With("worker", cfg.ID)
	if w.http == nil {
		w.http = &http.Client{}
	}
	w.api = &workerapi.Client{URL: cfg.ServerURL, HTTP: w.http, JoinToken: cfg.WorkerToken, Secret: w.ownSecret}
	w.ln = cfg.DataPlaneListener
	if w.ln == nil {
		ln, err := net.Listen("tcp", cfg.DataPlaneAddr)
		if err != nil {
			return nil, fmt.Errorf("listen on data plane %s: %w", cfg.DataPlaneAddr, err)
		}
		w.ln = ln
	}
	if w.cfg.DataPlaneURL == "" {
		w.cfg.DataPlaneURL = "http://" + advertisedAddr(w.ln.Addr())
	}
	return w, nil
}

// advertisedAddr turns a listen address into one clients can dial: an
// unspecified host (0.0.0.0, ::) becomes loopback; set Config.DataPlaneURL
// when clients are on other hosts.
func advertisedAddr(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return a.String()
	}
	if ta.IP == nil || ta.IP.IsUnspecified() {
		return net.JoinHostPort("127.0.0.1", strconv.Itoa(ta.Port))
	}
	return ta.String()
}

// DataPlaneURL is the advertised data-plane base URL.
func (w *Worker) DataPlaneURL() string { return w.cfg.DataPlaneURL }

// Run serves the data plane, adopts sandboxes left by an earlier worker
// process, registers and syncs until ctx ends. Sandboxes keep running after
// it returns.
func (w *Worker) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	srv := httplimit.DataPlane.Server(w.Handler()) // header, idle and body-stall timeouts; 1 MiB headers
	srv.BaseContext = func(net.Listener) context.Context { return ctx }
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(w.ln) }()

	var bg sync.WaitGroup
	w.adopt(ctx)
	bg.Add(1)
	go func() { defer bg.Done(); w.watchStatus(ctx) }()
	bg.Add(1)
	go func() { defer bg.Done(); w.reportActivity(ctx) }()
	bg.Add(1)
	go func() { defer bg.Done(); w.fenceLoop(ctx) }()

	err := w.syncLoop(ctx)

	cancel()
	shutCtx, shutCancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer shutCancel()
	_ = srv.Shutdown(shutCtx)
	if e := <-serveErr; e != nil && !errors.Is(e, http.ErrServerClosed) {
		err = errors.Join(err, fmt.Errorf("serve data plane: %w", e))
	}
	bg.Wait()
	w.actions.Wait()
	w.attaches.Wait()
	w.mu.Lock()
	for _, sb := range w.sandboxes {
		closeSandbox(sb)
	}
	w.mu.Unlock()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func closeSandbox(sb *sandbox) {
	if sb.agent != nil {
		sb.agent.Close()
		sb.agent = nil
	}
	if sb.handle != nil {
		sb.handle.Close()
		sb.handle = nil
	}
}

// changed wakes the sync loop and everything waiting on a sandbox's state.
func (w *Worker) changed() {
	w.kickSync()
	w.stateMu.Lock()
	close(w.stateCh)
	w.stateCh = make(chan struct{})
	w.stateMu.Unlock()
}

// retryAfter reconciles again after d (a delayed retry is due), without
// waiting for the long poll to end.
func (w *Worker) retryAfter(d time.Duration) {
	time.AfterFunc(d, func() {
		w.resync.Store(true)
		w.kickSync()
	})
}

// kickSync wakes the sync loop.
func (w *Worker) kickSync() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// stateChanged returns a channel closed at the next change; take it before
// reading the state it guards against missing.
func (w *Worker) stateChanged() <-chan struct{} {
	w.stateMu.Lock()
	defer w.stateMu.Unlock()
	return w.stateCh
}

// adopt reattaches to every sandbox the driver still has; what cannot be
// adopted is deleted and reported failed.
func (w *Worker) adopt(ctx context.Context) {
	ids, err := w.cfg.Driver.List(ctx)
	if err != nil {
		w.log.Error("list runtime sandboxes", "err", err)
		return
	}
	// Rollbacks a crash interrupted are finished instead (finishRestore),
	// whether or not the runtime still has something of the sandbox.
	var restoring map[string]snapshot.Restoring
	if w.cfg.Snapshots != nil {
		if restoring, err = w.cfg.Snapshots.Restorings(); err != nil {
			w.log.Warn("list interrupted rollbacks", "err", err)
		}
	}
	// Adopt in parallel (bounded): one stuck sandbox must not hold up the rest.
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for _, id := range ids {
		if _, ok := restoring[id]; ok {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			w.adoptOrDelete(ctx, id)
		}()
	}
	for id, r := range restoring {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			w.finishRestore(ctx, id, r)
		}()
	}
	wg.Wait()
}

// adoptOrDelete adopts one runtime sandbox. One with a committed suspend
// snapshot is suspended, whatever its runtime says (a suspend committed,
// then the worker died before releasing the runtime; runsc may still call
// the stopped guest running for a while): the runtime is released. One
// that is not running or paused and has no snapshot is released and
// failed.
func (w *Worker) adoptOrDelete(ctx context.Context, id string) {
	sb := &sandbox{id: id}
	if m, ok := w.latestSuspend(id); ok {
		w.log.Info("sandbox is suspended (committed snapshot found); releasing its runtime", "sandbox", id, "snapshot", m.ID)
		if err := w.deleteRuntime(context.WithoutCancel(ctx), id); err != nil {
			w.log.Error("release the runtime of a suspended sandbox", "sandbox", id, "err", err)
			sb.reason = "runtime not fully released: " + err.Error()
		}
		sb.state, sb.snapshotID, sb.snapshotBytes = model.StateSuspended, m.ID, m.Bytes
	} else {
		actx, cancel := context.WithTimeout(ctx, AdoptTimeout)
		h, ac, paused, err := w.adoptOne(actx, id)
		cancel()
		if err != nil {
			w.log.Warn("cannot adopt sandbox; deleting it", "sandbox", id, "err", err)
			if derr := w.deleteRuntime(context.WithoutCancel(ctx), id); derr != nil {
				w.log.Error("delete unadoptable sandbox", "sandbox", id, "err", derr)
			}
			w.mu.Lock()
			w.unadopted[id] = "sandbox could not be adopted after a worker restart (" + err.Error() + ") and has no committed snapshot"
			w.mu.Unlock()
			return
		} else {
			w.log.Info("adopted sandbox", "sandbox", id, "paused", paused)
			sb.state, sb.handle, sb.agent = model.StateRunning, h, ac
			if paused {
				sb.state = model.StatePaused
			}
		}
	}
	w.mu.Lock()
	w.sandboxes[id] = sb
	w.mu.Unlock()
	w.changed()
}

func (w *Worker) adoptOne(ctx context.Context, id string) (_ runtime.Sandbox, _ *agentclient.Client, paused bool, _ error) {
	st, err := w.cfg.Driver.Status(ctx, id)
	if err != nil {
		return nil, nil, false, fmt.Errorf("runtime status: %w", err)
	}
	if st != runtime.StatusRunning && st != runtime.StatusPaused {
		return nil, nil, false, fmt.Errorf("runtime status is %s", st)
	}
	h, err := w.cfg.Driver.Adopt(ctx, id)
	if err != nil {
		return nil, nil, false, fmt.Errorf("adopt runtime sandbox: %w", err)
	}
	// The gateway's listeners went with the previous worker process.
	if err := w.attachGateway(id, w.networkPolicy(id)); err != nil {
		w.log.Warn("egress gateway of an adopted sandbox", "sandbox", id, "err", err)
	}
	ac := w.newAgentClient(h)
	if st == runtime.StatusPaused {
		return h, ac, true, nil // the agent is frozen; it answers after resume
	}
	if err := ac.WaitReady(ctx); err != nil {
		ac.Close()
		h.Close()
		return nil, nil, false, err
	}
	return h, ac, false, nil
}

// watchStatus marks running sandboxes whose runtime died as failed.
func (w *Worker) watchStatus(ctx context.Context) {
	// Checking can be costly (gVisor: one runsc exec per sandbox), so the
	// pause after a round grows with the round's duration.
	pause := StatusInterval
	for {
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		roundStart := time.Now()
		w.checkStatus(ctx)
		w.checkFree()
		pause = max(StatusInterval, 4*time.Since(roundStart))
	}
}

// checkStatus checks every running sandbox once.
func (w *Worker) checkStatus(ctx context.Context) {
	w.mu.Lock()
	var ids []string
	for id, sb := range w.sandboxes {
		if sb.state == model.StateRunning && !sb.busy {
			ids = append(ids, id)
		}
	}
	w.mu.Unlock()
	for _, id := range ids {
		st, err := w.cfg.Driver.Status(ctx, id)
		if ctx.Err() != nil {
			return
		}
		if err != nil && !errors.Is(err, runtime.ErrNotFound) {
			w.log.Warn("runtime status", "sandbox", id, "err", err)
			continue
		}
		if err == nil && st != runtime.StatusGone && st != runtime.StatusStopped {
			continue
		}
		w.mu.Lock()
		if sb := w.sandboxes[id]; sb != nil && sb.state == model.StateRunning && !sb.busy {
			reason := "sandbox runtime exited"
			if sr, ok := w.cfg.Driver.(runtime.StopReasoner); ok {
				if r := sr.StopReason(id); r != "" {
					reason += ": " + r
				}
			}
			reason = workerapi.TruncateReason(reason) // a driver's reason may quote the guest
			w.log.Warn("sandbox runtime exited", "sandbox", id, "status", st, "reason", reason)
			sb.state, sb.reason = model.StateFailed, reason
			closeSandbox(sb)
			w.changed()
		}
		w.mu.Unlock()
	}
}

// syncLoop registers, then syncs until ctx ends.
func (w *Worker) syncLoop(ctx context.Context) error {
	if err := w.register(ctx); err != nil {
		return err
	}
	var version int64
	backoff := newBackoff()
	var lastTemplates time.Time
	var templates []model.Template
	for ctx.Err() == nil {
		req, reported := w.observed()
		w.syncSeq++ // only this loop syncs
		req.Epoch, req.Seq = w.epoch, w.syncSeq
		req.NetDenied = w.net.Take(workerapi.MaxNetDenials)
		if time.Since(lastTemplates) > 10*time.Second || w.templatesGone.Swap(false) {
			templates = w.templates()
			lastTemplates = time.Now()
			req.Templates = templates
		}
		// An observed change arriving during the long poll cuts it short.
		pollCtx, cancel := context.WithCancel(ctx)
		stop := make(chan struct{})
		go w.cutShort(len(req.NetDenied) > 0, cancel, stop)
		v := version
		if w.resync.Swap(false) {
			v = -1 // a different version: the server answers at once
		}
		t0 := time.Now()
		resp, err := w.sync(pollCtx, req, v)
		close(stop)
		cancel()
		if err != nil {
			w.net.Requeue(req.NetDenied)
			if req.Templates != nil {
				lastTemplates = time.Time{} // the server may not have them: send them again
			}
		}
		if w.log.Enabled(ctx, slog.LevelDebug) {
			w.log.Debug("sync", "took", time.Since(t0), "observed", len(req.Observed), "err", err, "version", resp.Version)
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pollCtx.Err() != nil { // cut short by a change: sync again now
				continue
			}
			if errors.Is(err, model.ErrNotFound) { // the server forgot us
				w.log.Warn("server does not know this worker; registering again", "err", err)
				if err := w.register(ctx); err != nil {
					return err
				}
				continue
			}
			w.log.Warn("sync", "err", err)
			if !backoff.wait(ctx) {
				return ctx.Err()
			}
			lastTemplates = time.Time{}
			continue
		}
		backoff.reset()
		w.fence.synced()
		w.ackDeleted(reported)
		version = resp.Version
		w.reconcile(ctx, resp.Assignments)
		w.removeTemplates(ctx, resp.RemoveTemplates)
	}
	return ctx.Err()
}

func (w *Worker) templates() []model.Template {
	if w.cfg.Templates == nil {
		return nil
	}
	ts, err := w.cfg.Templates()
	if err != nil {
		w.log.Warn("list templates", "err", err)
	}
	return ts
}

// observed snapshots what to report; reported lists the deleted ids in it.
func (w *Worker) observed() (workerapi.SyncRequest, []string) {
	free := w.freeMiB() // outside w.mu: it reads /proc
	if free != nil {
		w.reportedFree.Store(int64(*free))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	req := workerapi.SyncRequest{Observed: []workerapi.Observed{}, FreeMiB: free}
	var reported []string
	for id, sb := range w.sandboxes {
		st := sb.state
		if st == model.StateDeleting {
			continue // not gone yet; the server already knows it is deleting
		}
		// Reasons may carry guest-controlled text (a QEMU guest's panic
		// line): bounded, so that no sandbox can make the Sync too large.
		o := workerapi.Observed{SandboxID: id, State: st, Reason: workerapi.TruncateReason(sb.reason), LastActivity: sb.lastActivity}
		if st == model.StateSuspended {
			o.SnapshotID, o.SnapshotBytes, o.SnapshotShared = sb.snapshotID, sb.snapshotBytes, sb.snapshotShared
		}
		o.Task, o.StartedFrom = sb.taskResult, sb.startedFrom
		if sb.action != nil && sb.reason == sb.actionReason {
			o.Action = sb.action
		}
		if o.Task != nil && len(o.Task.Error) > workerapi.MaxReason {
			t := *o.Task
			t.Error = workerapi.TruncateReason(t.Error)
			o.Task = &t
		}
		req.Observed = append(req.Observed, o)
		if st == model.StateDeleted {
			reported = append(reported, id)
		}
	}
	w.net.Retain(func(id string) bool { return w.sandboxes[id] != nil })
	return req, reported
}

// ackDeleted forgets deleted sandboxes the server has been told about.
func (w *Worker) ackDeleted(ids []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range ids {
		if sb := w.sandboxes[id]; sb != nil && sb.state == model.StateDeleted && !sb.busy {
			delete(w.sandboxes, id)
			w.net.Drop(id)
		}
	}
}

// startDelete begins deleting sb; w.mu is held.
func (w *Worker) startDelete(ctx context.Context, sb *sandbox) {
	sb.busy = true
	sb.state = model.StateDeleting
	closeSandbox(sb)
	w.changed()
	w.actions.Add(1)
	ctx, span := w.actionSpan(ctx, sb.id, "delete")
	go func() {
		defer w.actions.Done()
		// Deletion finishes even when the worker is stopping. Its snapshots
		// go with it.
		err := w.deleteRuntime(context.WithoutCancel(ctx), sb.id)
		defer func() { tracing.End(span, err) }()
		if w.cfg.Snapshots != nil {
			if serr := w.cfg.Snapshots.DeleteSandbox(sb.id); serr != nil {
				err = errors.Join(err, fmt.Errorf("delete snapshots: %w", serr))
			}
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		sb.busy = false
		if err != nil {
			w.log.ErrorContext(ctx, "delete sandbox", "sandbox", sb.id, "err", err)
			sb.state, sb.reason = model.StateFailed, "delete failed: "+err.Error()
			sb.retryAt = time.Now().Add(DeleteRetryDelay)
			w.retryAfter(DeleteRetryDelay)
		} else {
			w.log.InfoContext(ctx, "deleted sandbox", "sandbox", sb.id)
			sb.state, sb.reason = model.StateDeleted, ""
		}
		w.changed()
	}()
}

// startPause freezes (pause) or thaws (!pause) sb; w.mu is held. A driver
// without runtime.Pauser cannot: the sandbox stays as it is and a retry is
// delayed.
func (w *Worker) startPause(ctx context.Context, sb *sandbox, pause bool) {
	p, ok := w.cfg.Driver.(runtime.Pauser)
	if !ok {
		w.cannotPause(sb)
		return
	}
	sb.busy = true
	w.actions.Add(1)
	verb := "resume"
	if pause {
		verb = "pause"
	}
	ctx, span := w.actionSpan(ctx, sb.id, verb)
	go func() {
		defer w.actions.Done()
		t0 := time.Now()
		defer func() {
			w.log.DebugContext(ctx, "pause or resume done", "sandbox", sb.id, "pause", pause, "took", time.Since(t0))
		}()
		var err error
		defer func() { tracing.End(span, err) }()
		sctx, end := w.stepSpan(ctx, sb.id, "runtime."+verb)
		if pause {
			err = p.Pause(sctx, sb.id)
		} else {
			err = p.Resume(sctx, sb.id)
		}
		end(err)
		w.mu.Lock()
		defer w.mu.Unlock()
		sb.busy = false
		switch {
		case err != nil:
			w.log.WarnContext(ctx, "pause or resume failed", "sandbox", sb.id, "pause", pause, "err", err)
			sb.retryAt = time.Now().Add(DeleteRetryDelay)
			w.retryAfter(DeleteRetryDelay)
			sb.reason = verb + " failed: " + err.Error()
		case pause:
			sb.state, sb.reason = model.StatePaused, ""
		default:
			sb.state, sb.reason = model.StateRunning, ""
		}
		w.changed()
	}()
}

// cannotPause delays another pause or resume of sb, which the driver
// cannot do: the sandbox stays as it is; w.mu is held.
func (w *Worker) cannotPause(sb *sandbox) {
	w.log.Warn("runtime cannot pause sandboxes", "sandbox", sb.id, "runtime", w.cfg.Driver.Name())
	sb.retryAt = time.Now().Add(time.Minute)
}

// start creates one sandbox and waits for its agent; the error is the
// start's failure, for its span (the outcome is recorded on sb).
func (w *Worker) start(ctx context.Context, sb *sandbox, s workerapi.SandboxSpec) error {
	t0 := time.Now()
	h, ac, from, err := w.startOne(ctx, s)
	if err == nil {
		if terr := w.trustOrgCA(ctx, s.ID, ac); terr != nil {
			// The sandbox works; only intercepted TLS would fail to verify.
			w.log.Warn("org CA not in the guest's trust store", "sandbox", s.ID, "err", terr)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	sb.busy = false
	if err != nil {
		if ctx.Err() != nil {
			// Stopping: forget it; the next worker starts it again.
			delete(w.sandboxes, sb.id)
			return err
		}
		w.log.WarnContext(ctx, "start sandbox failed", "sandbox", sb.id, "err", err)
		sb.state, sb.reason = model.StateFailed, err.Error()
	} else {
		w.log.InfoContext(ctx, "sandbox running", "sandbox", sb.id, "from", from, "took", time.Since(t0).Round(time.Millisecond))
		sb.state, sb.handle, sb.agent, sb.startedFrom = model.StateRunning, h, ac, from
	}
	w.changed()
	return err
}

func (w *Worker) startOne(ctx context.Context, s workerapi.SandboxSpec) (_ runtime.Sandbox, _ *agentclient.Client, from string, err error) {
	rootfs := w.cfg.RootFS(s.TemplateDigest)
	if rootfs == "" {
		return nil, nil, "", fmt.Errorf("template %s (%s) is not present on worker %s", s.Template, s.TemplateDigest, w.cfg.ID)
	}
	if s.Source != nil {
		h, ac, err := w.startFromSource(ctx, s)
		return h, ac, model.StartedSnapshot, err
	}
	if m, dir, ok := w.templateImage(ctx, s); ok {
		if h, ac, err := w.startFromImage(ctx, s, m, dir); err == nil {
			if err := w.writeSandboxEnv(ctx, ac, s); err != nil {
				w.log.Warn("the sandbox's env file", "sandbox", s.ID, "err", err)
			}
			return h, ac, model.StartedTemplateImage, nil
		}
	}
	sctx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	spec := runtime.Spec{
		ID:        s.ID,
		Runtime:   s.Runtime,
		RootFS:    rootfs,
		VCPUs:     s.Resources.VCPUs,
		MemoryMiB: s.Resources.MemoryMiB,
		DiskMiB:   s.Resources.DiskMiB,
		Hostname:  s.ID,
	}
	defer func() {
		if err != nil { // never leave a half-created sandbox behind
			if derr := w.deleteRuntime(context.WithoutCancel(ctx), s.ID); derr != nil {
				err = errors.Join(err, fmt.Errorf("clean up: %w", derr))
			}
		}
	}()
	h, err := w.startRuntime(sctx, spec, s.Network)
	if err != nil {
		return nil, nil, "", fmt.Errorf("start runtime: %w", err)
	}
	ac := w.newAgentClient(h)
	if err := w.waitAgent(sctx, s.ID, ac); err != nil {
		ac.Close()
		h.Close()
		return nil, nil, "", err
	}
	if err := w.writeSandboxEnv(ctx, ac, s); err != nil {
		w.log.Warn("the sandbox's env file", "sandbox", s.ID, "err", err)
	}
	if err := w.runStartCommand(ctx, ac, s.TemplateDigest, w.withCAEnv(s.ID, s.Env)); err != nil {
		ac.Close()
		h.Close()
		return nil, nil, "", err
	}
	return h, ac, model.StartedBoot, nil
}

// AgentDialTimeout bounds waiting for a connection from an agent, so that
// requests to a dead sandbox fail (503) instead of hanging.
const AgentDialTimeout = 10 * time.Second

func newAgentClient(h runtime.Sandbox) *agentclient.Client {
	return agentclient.New(func(ctx context.Context) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, AgentDialTimeout)
		defer cancel()
		return h.AgentConn(ctx)
	})
}

// agentFor returns the agent client of a running sandbox.
func (w *Worker) agentFor(id string) (*agentclient.Client, map[string]string, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	sb := w.sandboxes[id]
	if sb == nil || sb.state == model.StateDeleted || sb.state == model.StateDeleting {
		return nil, nil, model.Errorf(model.ErrNotFound, "sandbox %s is not on this worker", id)
	}
	if sb.state != model.StateRunning || sb.agent == nil {
		return nil, nil, model.Errorf(model.ErrUnavailable, "sandbox %s is %s", id, sb.state)
	}
	return sb.agent, sb.env, nil
}

// ---- worker API client ----

func (w *Worker) register(ctx context.Context) error {
	b := newBackoff()
	for {
		req := workerapi.RegisterRequest{
			ID:            w.cfg.ID,
			DataPlaneURL:  w.cfg.DataPlaneURL,
			Runtimes:      w.runtimes(),
			CapacityMiB:   w.cfg.CapacityMiB,
			CapacityVCPUs: w.cfg.CapacityVCPUs,
			FreeMiB:       w.freeMiB(),
			Templates:     w.templates(),
			Secret:        w.loadSecret(),
			RuntimeInfo:   w.runtimeInfo(ctx),
		}
		if w.cfg.Blobs != nil {
			req.BlobStore = w.cfg.Blobs.String()
		}
		resp, err := w.api.Register(ctx, req)
		if err == nil && resp.WorkerSecret != "" {
			err = w.storeSecret(resp.WorkerSecret)
		}
		if err == nil {
			kerr := w.setKeys(resp.SigningKey, resp.SigningKeys)
			if kerr == nil {
				if resp.WorkerID != "" {
					w.mu.Lock()
					w.workerID = resp.WorkerID
					w.mu.Unlock()
				}
				w.fence.registered(time.Duration(resp.WorkerLossGraceS) * time.Second)
				w.log.Info("registered with server", "server", w.api.Current())
				return nil
			}
			err = kerr
		}
		w.log.Warn("register with server", "err", err)
		if !b.wait(ctx) {
			return ctx.Err()
		}
	}
}

// runtimes names the runtimes this worker offers: every driver of a
// runtime.Multi, or the one driver.
func (w *Worker) runtimes() []string {
	if m, ok := w.cfg.Driver.(interface{ Offered() []string }); ok {
		return m.Offered()
	}
	return []string{w.cfg.Driver.Name()}
}

// runtimeInfo is what each of runtimes() can do, as the drivers declare it.
func (w *Worker) runtimeInfo(ctx context.Context) []model.RuntimeInfo {
	if m, ok := w.cfg.Driver.(interface {
		Infos(context.Context) []runtime.Info
	}); ok {
		return m.Infos(ctx)
	}
	return []model.RuntimeInfo{runtime.Describe(ctx, w.cfg.Driver)}
}

func decodeKey(s string) ([]byte, error) {
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if k, err := enc.DecodeString(s); err == nil && len(k) > 0 {
			return k, nil
		}
	}
	return nil, errors.New("decode signing key: not base64")
}

// ownSecret is the credential Sync and Wake present: the worker's own
// secret once it has one (the join token before; see workerapi.Client).
func (w *Worker) ownSecret() string {
	if sp := w.secret.Load(); sp != nil {
		return *sp
	}
	return ""
}

func (w *Worker) sync(ctx context.Context, req workerapi.SyncRequest, version int64) (workerapi.SyncResponse, error) {
	w.mu.Lock()
	id := w.workerID
	w.mu.Unlock()
	resp, err := w.api.Sync(ctx, id, req, w.fence.pollWait(), version)
	if err == nil && len(resp.SigningKeys) > 0 {
		if kerr := w.setKeys("", resp.SigningKeys); kerr != nil {
			w.log.Warn("signing keys from sync", "err", kerr)
		}
	}
	return resp, err
}

// backoff is a capped exponential delay.
type backoff struct{ d time.Duration }

func newBackoff() *backoff { return &backoff{d: 100 * time.Millisecond} }

func (b *backoff) reset() { b.d = 100 * time.Millisecond }

// wait sleeps for the current delay and doubles it; false if ctx ended.
func (b *backoff) wait(ctx context.Context) bool {
	t := time.NewTimer(b.d)
	defer t.Stop()
	b.d = min(b.d*2, 5*time.Second)
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
