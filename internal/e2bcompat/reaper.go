package e2bcompat

import (
	"context"
	"errors"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/store"
)

// RunReaper ends sandboxes whose ExpiresAt has passed until ctx ends: it
// deletes them, or suspends them when they were created with E2B's
// autoPause. It honours
// ExpiresAt for every sandbox, native ones included.
func (a *Adapter) RunReaper(ctx context.Context) error {
	t := time.NewTicker(a.reapInterval)
	defer t.Stop()
	for {
		if err := a.Reap(ctx); err != nil && ctx.Err() == nil {
			a.s.log.Warn("reap expired sandboxes", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Reap ends every sandbox that has expired by now (one pass).
func (a *Adapter) Reap(ctx context.Context) error {
	now := time.Now()
	if a.s.svc.Now != nil {
		now = a.s.svc.Now()
	}
	f := store.SandboxFilter{
		States: []model.SandboxState{model.StatePending, model.StateStarting, model.StateRunning, model.StateWaking,
			model.StatePaused},
		Limit: service.MaxListLimit,
	}
	var errs []error
	for {
		sbs, next, err := a.s.svc.Store.ListSandboxes(ctx, f)
		if err != nil {
			return err
		}
		for _, sb := range sbs {
			if sb.ExpiresAt == nil || sb.ExpiresAt.After(now) || sb.DesiredState == model.StateDeleted {
				continue
			}
			if err := a.expire(ctx, sb); err != nil {
				errs = append(errs, err)
			}
		}
		if next == "" {
			return errors.Join(errs...)
		}
		f.Cursor = next
	}
}

func (a *Adapter) expire(ctx context.Context, sb model.Sandbox) error {
	p := service.Principal{OrgID: sb.OrgID}
	log := a.s.log.With("sandbox", sb.ID, "expired_at", sb.ExpiresAt)
	if sb.Metadata[metaOnTimeout] == "pause" {
		if sb.State == model.StateRunning {
			// Clear the expiry first so the next pass does not suspend again;
			// connect sets a new one.
			if err := a.clearExpiry(ctx, sb); errors.Is(err, model.ErrConflict) {
				return nil // changed meanwhile: the next pass decides again
			} else if err != nil {
				return err
			}
			log.Info("sandbox expired; suspending it (autoPause)")
			_, err := a.s.svc.SuspendSandbox(ctx, p, sb.ID)
			if err == nil {
				return nil
			}
			// The timeout must end the sandbox one way or the other.
			log.Warn("suspend at expiry failed; deleting the sandbox instead", "err", err)
		} else {
			if sb.State == model.StatePaused {
				if err := a.clearExpiry(ctx, sb); err != nil && !errors.Is(err, model.ErrConflict) {
					return err
				}
			}
			return nil // already paused, or starting or waking: decide when it settles
		}
	}
	log.Info("sandbox expired; deleting it")
	if _, err := a.s.svc.DeleteSandbox(ctx, p, sb.ID); err != nil && !errors.Is(err, model.ErrNotFound) {
		return err
	}
	return nil
}

func (a *Adapter) clearExpiry(ctx context.Context, sb model.Sandbox) error {
	sb.ExpiresAt = nil
	_, err := a.s.svc.Store.UpdateSandbox(ctx, sb)
	return err
}
