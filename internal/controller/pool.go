package controller

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/store"
)

// reconcilePools keeps every warm pool at its size: it creates missing
// members (pending sandboxes of service.PoolOrgID with a create operation,
// which the placement rules then start like any other), and asks for the
// deletion of extras, of failed members, of members whose resources no
// longer match their pool and of members of pools that were removed.
// Extras that are not running yet go first. sbs are the sandboxes of this
// round (claimed members have left service.PoolOrgID, so a claim shows up
// as a missing member).
func (c *Controller) reconcilePools(ctx context.Context, sbs []model.Sandbox) error {
	pools, err := c.st.ListPools(ctx)
	if err != nil {
		return fmt.Errorf("controller: list pools: %w", err)
	}
	byDigest := make(map[string]model.Pool, len(pools))
	for _, p := range pools {
		byDigest[p.Digest] = p
	}
	live := make(map[string][]model.Sandbox)
	var drop []model.Sandbox
	for _, sb := range sbs {
		if sb.OrgID != service.PoolOrgID || sb.DesiredState == model.StateDeleted || sb.State == model.StateDeleted {
			continue
		}
		p, ok := byDigest[sb.Pool]
		switch {
		case !ok || sb.State.Broken() || sb.Resources != p.Resources:
			drop = append(drop, sb)
		default:
			live[sb.Pool] = append(live[sb.Pool], sb)
		}
	}
	var errs []error
	for _, p := range pools {
		members := live[p.Digest]
		if extra := len(members) - p.Size; extra > 0 {
			// Not yet running first, then the newest.
			sort.SliceStable(members, func(i, j int) bool {
				ri, rj := members[i].State == model.StateRunning, members[j].State == model.StateRunning
				if ri != rj {
					return !ri
				}
				return members[i].CreatedAt.After(members[j].CreatedAt)
			})
			drop = append(drop, members[:extra]...)
		}
		for range p.Size - len(members) {
			if err := c.createPoolMember(ctx, p); err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	for _, sb := range drop {
		if err := c.deletePoolMember(ctx, sb); err != nil && !errors.Is(err, model.ErrConflict) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (c *Controller) createPoolMember(ctx context.Context, p model.Pool) error {
	if err := service.EnsurePoolOrg(ctx, c.st, c.now()); err != nil {
		return fmt.Errorf("controller: pool %s: %w", p.Template, err)
	}
	sb, op := service.NewPoolMember(p, c.now(), c.cfg.OperationDeadline)
	sb, op, _, err := c.st.CreateSandbox(ctx, sb, op, "")
	if err != nil {
		return fmt.Errorf("controller: pool %s: create member: %w", p.Template, err)
	}
	c.log.Info("controller: pool member created", "pool", p.Template, "sandbox", sb.ID)
	c.publish(ctx, sb, op)
	return nil
}

func (c *Controller) deletePoolMember(ctx context.Context, sb model.Sandbox) error {
	now := c.now()
	nsb := sb
	nsb.DesiredState = model.StateDeleted
	op := model.Operation{
		ID: model.NewID("op"), OrgID: sb.OrgID, SandboxID: sb.ID, Kind: model.OpDelete, State: model.OpPending,
		Target: model.StateDeleted, CreatedAt: now, UpdatedAt: now, Deadline: now.Add(c.cfg.OperationDeadline),
	}
	err := c.st.InTx(ctx, func(tx store.Tx) error {
		var err error
		if nsb, err = tx.UpdateSandbox(ctx, nsb); err != nil {
			return err
		}
		if err := tx.CreateOperation(ctx, op); err != nil {
			return err
		}
		op, err = tx.GetOperation(ctx, op.ID)
		return err
	})
	if err != nil {
		return fmt.Errorf("controller: pool member %s: delete: %w", sb.ID, err)
	}
	c.log.Info("controller: pool member deleted", "pool", sb.Pool, "sandbox", sb.ID, "state", sb.State)
	c.publish(ctx, nsb, op)
	return nil
}

func (c *Controller) publish(ctx context.Context, sb model.Sandbox, op model.Operation) {
	if err := c.ev.Sandbox(ctx, sb); err != nil {
		c.log.Warn("controller: sandbox event", "sandbox", sb.ID, "err", err)
	}
	if err := c.ev.Operation(ctx, op); err != nil {
		c.log.Warn("controller: operation event", "operation", op.ID, "err", err)
	}
}
