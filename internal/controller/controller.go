// Package controller runs the control plane's reconcilers and serves the
// server side of the worker API (internal/workerapi).
//
// The reconcilers are level-triggered: on every event-log wake-up, every
// Kick and every resync tick, the controller lists the sandboxes that are not
// deleted and the operations that are not done, and reconciles each sandbox
// by its ID: re-read, decide one transition, compare-and-set write, repeat
// until nothing changes. A lost race (model.ErrConflict) is left for the
// next round. Decisions: placement (through Config.Placer, by default
// internal/scheduler's Pick), deletion of unplaced sandboxes, operation
// completion and operation deadlines, expiry (past ExpiresAt: delete, or
// suspend for model.ExpirySuspend, by a new operation), lifecycle
// (suspending, waking) and idle auto-suspend (lifecycle requests
// themselves are written by service.StartLifecycle).
//
// As the worker API's workerapi.Server (served by workerapi.NewHandler,
// which owns HTTP, auth and decoding), the controller applies what workers
// observe (running, paused, suspended, deleted, failed, data-plane
// activity) with the same transitions, long-polls assignments for them and
// takes their wake requests.
package controller

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock/airlock/internal/blob"
	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/scheduler"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/store"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/tracing"
	"github.com/airlock/airlock/internal/workerapi"

	"go.opentelemetry.io/otel/trace"
)

// Defaults for Config.
const (
	DefaultHeartbeatTTL = scheduler.DefaultHeartbeatTTL
	DefaultResync       = 2 * time.Second
	// MaxSyncWait caps the wait parameter of a Sync long poll.
	MaxSyncWait = 60 * time.Second
	// staleFactor × HeartbeatTTL without a heartbeat earns a sandbox a note.
	staleFactor = 4
	// wakeMoveFactor × HeartbeatTTL without a heartbeat from the worker
	// waking a sandbox whose snapshot is in the blob store moves the wake
	// to another worker (reconcile rule 7b).
	wakeMoveFactor = 2
)

// Config wires a Controller.
type Config struct {
	Store  store.Store
	Events *events.Log
	Logger *slog.Logger // nil: discard
	// WorkerToken authenticates workers (Authorization: Bearer). Empty
	// refuses every worker API call.
	WorkerToken string
	// HeartbeatTTL is how old a worker's last heartbeat may be for it to
	// take new sandboxes (0: DefaultHeartbeatTTL).
	HeartbeatTTL time.Duration
	// WorkerLossGrace is how long a worker may go without a heartbeat
	// before it is lost, and its sandboxes with it (0:
	// DefaultWorkerLossGrace; reconcile rule 8).
	WorkerLossGrace time.Duration
	// OnWorkerLoss is what becomes of a lost worker's sandboxes that have
	// a snapshot in the blob store: OnLossMark (""), lost like the rest;
	// OnLossRestore, restored from that snapshot on another worker.
	OnWorkerLoss string
	// Placer places pending sandboxes (nil: scheduler.Default with
	// HeartbeatTTL). The service's imports place through the same one
	// (Controller.Placer).
	Placer scheduler.Placer
	// Blobs is the shared blob store whose suspend snapshots the leader
	// garbage-collects (blobgc.go; nil: none).
	Blobs blob.Store
	// Resync is the period of the full reconcile (0: DefaultResync).
	Resync time.Duration
	// OperationDeadline is the deadline callers give new operations
	// (0: model.DefaultOperationDeadline). The controller enforces each
	// operation's own Deadline.
	OperationDeadline time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	// Tracer, when it records (internal/tracing), gives every transition
	// that serves an operation a span in that operation's trace (the
	// traceparent the operation keeps), and hands the trace to the
	// worker with the sandbox's assignment (workerapi.OperationRef).
	Tracer trace.TracerProvider
	// Instance names this controller among the server replicas on one
	// store ("": a random id). Only the holder of the store's controller
	// lease (LeaseName) runs reconcile rounds and template GC; the others
	// serve workers (register, sync, wake) and wait to take over.
	Instance string
	// LeaseTTL is how long a lease lasts unless renewed (0:
	// DefaultLeaseTTL): a replica that dies stalls reconciliation at most
	// this long. The holder renews it every third of it.
	LeaseTTL time.Duration
}

// LeaseName is the store lease of the controller that reconciles.
const LeaseName = "controller"

// followerRetry is the least time between a follower's looks at the lease.
const followerRetry = 200 * time.Millisecond

// DefaultLeaseTTL is Config.LeaseTTL's default.
const DefaultLeaseTTL = 15 * time.Second

// Controller reconciles sandboxes and operations and serves workers.
type Controller struct {
	cfg  Config
	st   store.Store
	ev   *events.Log
	log  *slog.Logger
	kick chan struct{}
	cas  service.OrgCAs
	// stopping is closed when Run returns, so parked long polls answer at
	// once and an HTTP server shutdown does not wait for them.
	stopping     chan struct{}
	stoppingOnce sync.Once
	// waiting counts Sync long polls blocked on a change (for tests).
	waiting atomic.Int32
	net     netLimiter // network.denied events (netdenied.go)
	// order drops Syncs that arrive after their successors.
	order workerapi.SyncOrder
	// onRound receives every full round Run makes (ObserveRounds; nil:
	// none).
	onRound atomic.Pointer[func(RoundStats)]
	tracer  trace.Tracer // nil: tracing off
	// lease is the controller lease as this replica last saw it, and
	// renewAt when it renews it next (Run's goroutine only).
	lease   store.Lease
	renewAt time.Time
	leading atomic.Bool
}

// RoundStats describes one full reconcile round.
type RoundStats struct {
	Duration  time.Duration
	Sandboxes int                        // the sandboxes the round listed (every one not deleted)
	ByState   map[model.SandboxState]int // those, by state
	// OpenOperations is the number of operations not yet done; OldestOpen
	// the age of the oldest (0: none), how far reconciling lags behind
	// what clients asked for.
	OpenOperations int
	OldestOpen     time.Duration
}

// ObserveRounds has f called after every full reconcile round of Run (the
// daemon's Prometheus metrics). It replaces any earlier f.
func (c *Controller) ObserveRounds(f func(RoundStats)) { c.onRound.Store(&f) }

// New returns a controller; call Run to start reconciling and Handler to
// serve workers.
func New(cfg Config) *Controller {
	if cfg.HeartbeatTTL <= 0 {
		cfg.HeartbeatTTL = DefaultHeartbeatTTL
	}
	if cfg.WorkerLossGrace <= 0 {
		cfg.WorkerLossGrace = DefaultWorkerLossGrace
	}
	if cfg.OnWorkerLoss == "" {
		cfg.OnWorkerLoss = OnLossMark
	}
	if cfg.Resync <= 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.Placer == nil {
		cfg.Placer = scheduler.Default{HeartbeatTTL: cfg.HeartbeatTTL}
	}
	if cfg.OperationDeadline <= 0 {
		cfg.OperationDeadline = model.DefaultOperationDeadline
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Events == nil {
		cfg.Events = events.New(cfg.Store)
	}
	if cfg.Instance == "" {
		cfg.Instance = model.NewID("ctl")
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	c := &Controller{cfg: cfg, st: cfg.Store, ev: cfg.Events, log: cfg.Logger, kick: make(chan struct{}, 1), stopping: make(chan struct{})}
	if tracing.On(cfg.Tracer) {
		c.tracer = tracing.Tracer(cfg.Tracer)
	}
	return c
}

// OperationDeadline is how long new operations should be given.
func (c *Controller) OperationDeadline() time.Duration { return c.cfg.OperationDeadline }

// HeartbeatTTL is the configured heartbeat freshness window.
func (c *Controller) HeartbeatTTL() time.Duration { return c.cfg.HeartbeatTTL }

// WorkerLossGrace returns the configured (or default) Config.WorkerLossGrace.
func (c *Controller) WorkerLossGrace() time.Duration { return c.cfg.WorkerLossGrace }

// DefaultWorkerLossGrace is Config.WorkerLossGrace's default.
const DefaultWorkerLossGrace = scheduler.DefaultWorkerLossGrace

// Values of Config.OnWorkerLoss (airlock server --on-worker-loss).
const (
	OnLossMark    = "mark"
	OnLossRestore = "restore"
)

// Placer is the placement the controller uses (Config.Placer), for other
// callers that place a sandbox (the service's import).
func (c *Controller) Placer() scheduler.Placer { return c.cfg.Placer }

func (c *Controller) now() time.Time { return c.cfg.Now().UTC() }

// Kick asks Run for a reconcile round now. It never blocks.
func (c *Controller) Kick() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Run reconciles until ctx ends, then returns ctx's error.
func (c *Controller) Run(ctx context.Context) error {
	defer c.stoppingOnce.Do(func() { close(c.stopping) })
	tick := time.NewTicker(c.cfg.Resync)
	defer tick.Stop()
	var lastGC, lastBlobGC time.Time
	defer c.releaseLease()
	leaseTick := time.NewTicker(c.cfg.LeaseTTL / 3)
	defer leaseTick.Stop()
	for {
		changed := c.ev.Changed() // taken before the round so no wake-up is missed
		if !c.lead(ctx) {
			// Look again at the next renewal tick, or sooner when there is
			// work (a change, a kick: the holder may have released the
			// lease on its way out), at most every followerRetry.
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-leaseTick.C:
			case <-changed:
			case <-c.kick:
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(followerRetry):
			}
			continue
		}
		t0 := time.Now()
		// The round's transitions are fenced by the lease it holds: a
		// replica deposed meanwhile (stalled past its TTL) writes none.
		rs, err := c.reconcileAll(withFence(ctx, fence{name: LeaseName, holder: c.cfg.Instance, epoch: c.lease.Epoch}))
		if err != nil && ctx.Err() == nil {
			c.log.Warn("controller: reconcile round", "err", err)
		}
		if f := c.onRound.Load(); f != nil && ctx.Err() == nil {
			rs.Duration = time.Since(t0)
			(*f)(rs)
		}
		if c.now().Sub(lastGC) >= TemplateGCInterval {
			lastGC = c.now()
			if _, err := c.collectTemplates(ctx); err != nil && ctx.Err() == nil {
				c.log.Warn("controller: template garbage collection", "err", err)
			}
		}
		if c.cfg.Blobs != nil && c.now().Sub(lastBlobGC) >= BlobGCInterval {
			lastBlobGC = c.now()
			if _, err := c.collectBlobs(ctx); err != nil && ctx.Err() == nil {
				c.log.Warn("controller: blob store garbage collection", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		case <-c.kick:
		case <-tick.C:
		case <-leaseTick.C: // renew in time
		}
	}
}

// lead reports whether this replica holds the controller lease, taking or
// renewing it when due. A store error counts as not holding it: a
// replica that cannot reach the store must not act on what it last read.
func (c *Controller) lead(ctx context.Context) bool {
	now := time.Now()
	if c.leading.Load() && now.Before(c.renewAt) {
		return true
	}
	l, err := c.st.AcquireLease(ctx, LeaseName, c.cfg.Instance, c.now(), c.cfg.LeaseTTL)
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("controller: lease", "err", err)
		}
		c.leading.Store(false)
		return false
	}
	held := l.Holder == c.cfg.Instance
	switch {
	case held && !c.leading.Load():
		c.log.Info("controller: leading", "instance", c.cfg.Instance, "epoch", l.Epoch)
	case !held && (c.leading.Load() || l.Holder != c.lease.Holder):
		c.log.Info("controller: following", "instance", c.cfg.Instance, "leader", l.Holder, "epoch", l.Epoch)
	}
	c.lease = l
	c.leading.Store(held)
	c.renewAt = now.Add(c.cfg.LeaseTTL / 3)
	return held
}

// releaseLease lets the lease go when Run ends, so another replica takes
// over at once instead of after the TTL.
func (c *Controller) releaseLease() {
	if !c.leading.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.st.ReleaseLease(ctx, LeaseName, c.cfg.Instance, c.now()); err != nil {
		c.log.Warn("controller: release lease", "err", err)
	}
	c.leading.Store(false)
}

// Leading reports whether this replica's controller held the controller
// lease at its last look, and this replica's instance name.
func (c *Controller) Leading() (bool, string) {
	return c.leading.Load(), c.cfg.Instance
}

// Ready returns nil when at least one worker has a fresh heartbeat and a
// template; otherwise an error wrapping model.ErrUnavailable that says what
// is missing (scheduler.Ready over the registered workers).
func (c *Controller) Ready(ctx context.Context) error {
	workers, err := c.st.ListWorkers(ctx)
	if err != nil {
		return fmt.Errorf("controller: ready: list workers: %w", err)
	}
	return scheduler.Ready(workers, c.now(), c.cfg.HeartbeatTTL)
}

// SigningKey returns the installation's first data-plane master key
// (token.SigningKey), creating it on first use.
func (c *Controller) SigningKey(ctx context.Context) ([]byte, error) {
	return token.SigningKey(ctx, c.st)
}
