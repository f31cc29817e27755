package service

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/scheduler"
	"github.com/airlock/airlock/internal/store"
)

// Worker states as operators see them (GET /v1/workers).
const (
	WorkerReady    = "ready"    // fresh heartbeat, takes new sandboxes
	WorkerCordoned = "cordoned" // fresh heartbeat, takes no new sandboxes
	WorkerStale    = "stale"    // no heartbeat within scheduler.DefaultHeartbeatTTL
	WorkerLost     = "lost"     // none within Config.WorkerLossGrace: its sandboxes are lost (or restored elsewhere)
	WorkerDraining = "draining" // fresh heartbeat, cordoned, its running sandboxes being moved off
)

// WorkerStatus is a registered worker with what it holds.
type WorkerStatus struct {
	Worker model.Worker
	// State is WorkerReady, WorkerCordoned, WorkerDraining, WorkerStale or
	// WorkerLost.
	State string
	// Sandboxes counts the sandboxes assigned to the worker (not deleted),
	// by state.
	Sandboxes map[model.SandboxState]int
	// Used is what its sandboxes reserve of its capacity.
	UsedMiB, UsedVCPUs int
}

// ListWorkers returns every registered worker with its state, sandboxes
// and used capacity (operators only).
func (s *Service) ListWorkers(ctx context.Context, p Principal) ([]WorkerStatus, error) {
	if !p.Operator() {
		return nil, model.Errorf(model.ErrForbidden, "workers are listed with an admin key of the default org (an operator's)")
	}
	workers, err := s.st.ListWorkers(ctx)
	if err != nil {
		return nil, fmt.Errorf("list workers: %w", err)
	}
	sbs, err := store.ListAllSandboxes(ctx, s.st, store.SandboxFilter{})
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	load := scheduler.LoadOf(sbs)
	counts := map[string]map[model.SandboxState]int{}
	for _, sb := range sbs {
		if sb.WorkerID == "" || sb.State == model.StateDeleted {
			continue
		}
		if counts[sb.WorkerID] == nil {
			counts[sb.WorkerID] = map[model.SandboxState]int{}
		}
		counts[sb.WorkerID][sb.State]++
	}
	now := s.now()
	out := make([]WorkerStatus, 0, len(workers))
	for _, w := range workers {
		st := WorkerReady
		switch {
		case scheduler.Lost(w, now, s.cfg.WorkerLossGrace):
			st = WorkerLost
		case !scheduler.Fresh(w, now, scheduler.DefaultHeartbeatTTL):
			st = WorkerStale
		case w.Draining:
			st = WorkerDraining
		case w.Cordoned:
			st = WorkerCordoned
		}
		c := counts[w.ID]
		if c == nil {
			c = map[model.SandboxState]int{}
		}
		l := load[w.ID]
		out = append(out, WorkerStatus{Worker: w, State: st, Sandboxes: c, UsedMiB: l.MemoryMiB, UsedVCPUs: l.VCPUs})
	}
	return out, nil
}

// GetWorker returns one worker's status (operators only).
func (s *Service) GetWorker(ctx context.Context, p Principal, id string) (WorkerStatus, error) {
	all, err := s.ListWorkers(ctx, p)
	if err != nil {
		return WorkerStatus{}, err
	}
	if i := slices.IndexFunc(all, func(w WorkerStatus) bool { return w.Worker.ID == id }); i >= 0 {
		return all[i], nil
	}
	return WorkerStatus{}, model.Errorf(model.ErrNotFound, "there is no worker %.80q; GET /v1/workers lists them", id)
}

// CordonWorker marks a worker as taking no new sandboxes (or, with
// cordoned false, as taking them again); its sandboxes stay where they
// are. Operators only.
func (s *Service) CordonWorker(ctx context.Context, p Principal, id string, cordoned bool) (WorkerStatus, error) {
	if !p.Operator() {
		return WorkerStatus{}, model.Errorf(model.ErrForbidden, "workers are cordoned with an admin key of the default org (an operator's)")
	}
	if err := s.st.SetWorkerCordoned(ctx, id, cordoned); errors.Is(err, model.ErrNotFound) {
		return WorkerStatus{}, model.Errorf(model.ErrNotFound, "there is no worker %.80q; GET /v1/workers lists them", id)
	} else if err != nil {
		return WorkerStatus{}, fmt.Errorf("cordon worker %s: %w", id, err)
	}
	what := "cordoned"
	if !cordoned {
		what = "uncordoned"
	}
	s.logger().Info("worker "+what, "worker", id)
	if !cordoned {
		s.kick() // pending sandboxes may fit now
	}
	return s.GetWorker(ctx, p, id)
}

// DrainWorker cordons a worker and has the controller move its sandboxes
// off it: each running one is suspended and woken on another worker
// through the shared blob store (same id, files and processes), each
// paused one suspended (it wakes on any worker of the store when next
// used). It needs the worker to use a blob store; the drain is over when
// the worker runs nothing (GET /v1/workers/{id}), and uncordoning ends it.
// Operators only.
func (s *Service) DrainWorker(ctx context.Context, p Principal, id string) (WorkerStatus, error) {
	if !p.Operator() {
		return WorkerStatus{}, model.Errorf(model.ErrForbidden, "workers are drained with an admin key of the default org (an operator's)")
	}
	w, err := s.st.GetWorker(ctx, id)
	if errors.Is(err, model.ErrNotFound) {
		return WorkerStatus{}, model.Errorf(model.ErrNotFound, "there is no worker %.80q; GET /v1/workers lists them", id)
	} else if err != nil {
		return WorkerStatus{}, fmt.Errorf("drain worker %s: %w", id, err)
	}
	if w.BlobStore == "" {
		return WorkerStatus{}, model.Errorf(model.ErrConflict, "worker %s uses no blob store, so its sandboxes cannot move: start the workers with --blob-store (or cordon it and let its sandboxes end)", id)
	}
	if err := s.st.SetWorkerDraining(ctx, id); err != nil {
		return WorkerStatus{}, fmt.Errorf("drain worker %s: %w", id, err)
	}
	s.logger().Info("worker draining", "worker", id)
	s.kick()
	return s.GetWorker(ctx, p, id)
}
