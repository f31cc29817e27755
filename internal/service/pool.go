package service

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
)

// Warm pools. A pool keeps Size running sandboxes of one template digest
// with fixed resources, owned by the internal org PoolOrgID (invisible to
// every other org's API). The controller keeps the count (see
// controller's pool reconciler); CreateSandbox claims a running member
// when the request matches a pool, which turns a boot into a single
// guarded write.
const (
	PoolOrgID   = "org-pool"
	PoolOrgName = "pool (internal)"
	// MaxPoolSize caps one pool's size.
	MaxPoolSize = 64
)

// EnsurePoolOrg creates the internal org that owns pool members if it does
// not exist yet.
func EnsurePoolOrg(ctx context.Context, st store.Store, now time.Time) error {
	if _, err := st.GetOrg(ctx, PoolOrgID); err == nil {
		return nil
	} else if !errors.Is(err, model.ErrNotFound) {
		return fmt.Errorf("get pool org: %w", err)
	}
	err := st.CreateOrg(ctx, model.Org{ID: PoolOrgID, Name: PoolOrgName, CreatedAt: now})
	if err != nil && !errors.Is(err, model.ErrConflict) {
		return fmt.Errorf("create pool org: %w", err)
	}
	return nil
}

// NewPoolMember returns a pending pool member of p and the create operation
// that tracks it, as CreateSandbox would write them.
func NewPoolMember(p model.Pool, now time.Time, deadline time.Duration) (model.Sandbox, model.Operation) {
	sb := model.Sandbox{
		ID: model.NewID("sb"), OrgID: PoolOrgID, Template: p.Template, TemplateDigest: p.Digest, Runtime: DefaultRuntime,
		State: model.StatePending, DesiredState: model.StateRunning, Resources: p.Resources,
		CreatedAt: now, UpdatedAt: now, LastActivityAt: now, Pool: p.Digest,
	}
	op := model.Operation{
		ID: model.NewID("op"), OrgID: PoolOrgID, SandboxID: sb.ID, Kind: model.OpCreate, State: model.OpPending,
		Target: model.StateRunning, CreatedAt: now, UpdatedAt: now, Deadline: now.Add(deadline),
	}
	return sb, op
}

// PoolMembers returns the pool members that count towards a pool: owned by
// PoolOrgID, not being deleted, not deleted or failed.
func PoolMembers(ctx context.Context, st store.Store) ([]model.Sandbox, error) {
	out, err := store.ListAllSandboxes(ctx, st, store.SandboxFilter{OrgID: PoolOrgID})
	if err != nil {
		return nil, fmt.Errorf("list pool members: %w", err)
	}
	return out, nil
}

// Counts reports whether sb is a live member (not failed, not going away).
func countsInPool(sb model.Sandbox) bool {
	return sb.Pool != "" && sb.DesiredState == model.StateRunning && !sb.State.Terminal() &&
		sb.State != model.StateDeleting
}

func (s *Service) requireOperator(p Principal, what string) error {
	if !p.Operator() {
		return model.Errorf(model.ErrForbidden, "%s needs an admin key of the %q org", what, DefaultOrgName)
	}
	return nil
}

// SetPool configures the warm pool of template (name, name:tag or digest):
// size members with req's resources (default 1 vCPU / 512 MiB). Operators
// only. The controller fills or drains the pool in the background.
func (s *Service) SetPool(ctx context.Context, p Principal, template string, req PoolParams) (PoolStatus, error) {
	if err := s.requireOperator(p, "configuring warm pools"); err != nil {
		return PoolStatus{}, err
	}
	if req.Size < 0 || req.Size > MaxPoolSize {
		return PoolStatus{}, model.Errorf(model.ErrUnprocessable, "size is %d; it must be between 0 and %d", req.Size, MaxPoolSize)
	}
	res, err := s.resources(req.Resources)
	if err != nil {
		return PoolStatus{}, err
	}
	tpl, ref, err := s.resolveTemplate(ctx, template)
	if err != nil {
		return PoolStatus{}, err
	}
	if !strings.HasPrefix(ref, digestPrefix) && !strings.Contains(ref, ":") {
		ref += ":" + defaultTemplateTag
	}
	now := s.now()
	pool := model.Pool{Template: ref, Digest: tpl.Digest, Size: req.Size, Resources: res, CreatedAt: now, UpdatedAt: now}
	if err := s.st.PutPool(ctx, pool); err != nil {
		return PoolStatus{}, fmt.Errorf("store pool %s: %w", ref, err)
	}
	s.kick()
	pools, err := s.ListPools(ctx, p)
	if err != nil {
		return PoolStatus{}, err
	}
	for _, got := range pools {
		if got.Digest == pool.Digest {
			return got, nil
		}
	}
	return PoolStatus{Pool: pool}, nil
}

// ListPools returns every warm pool with its member counts. Operators only.
func (s *Service) ListPools(ctx context.Context, p Principal) ([]PoolStatus, error) {
	if err := s.requireOperator(p, "listing warm pools"); err != nil {
		return nil, err
	}
	pools, err := s.st.ListPools(ctx)
	if err != nil {
		return nil, fmt.Errorf("list pools: %w", err)
	}
	members, err := PoolMembers(ctx, s.st)
	if err != nil {
		return nil, err
	}
	out := make([]PoolStatus, 0, len(pools))
	for _, pl := range pools {
		ap := PoolStatus{Pool: pl}
		for _, m := range members {
			if m.Pool != pl.Digest || !countsInPool(m) || fullResources(m.Resources) != fullResources(pl.Resources) {
				continue
			}
			if m.State == model.StateRunning {
				ap.Ready++
			} else {
				ap.Starting++
			}
		}
		out = append(out, ap)
	}
	return out, nil
}

// DeletePool removes the warm pool of template; the controller deletes its
// members. Operators only.
func (s *Service) DeletePool(ctx context.Context, p Principal, template string) error {
	if err := s.requireOperator(p, "removing warm pools"); err != nil {
		return err
	}
	tpl, ref, err := s.resolveTemplate(ctx, template)
	if err != nil {
		return err
	}
	if err := s.st.DeletePool(ctx, tpl.Digest); errors.Is(err, model.ErrNotFound) {
		return model.Errorf(model.ErrNotFound, "no warm pool for template %s", ref)
	} else if err != nil {
		return fmt.Errorf("delete pool %s: %w", ref, err)
	}
	s.kick()
	return nil
}

func defaultResources(res model.Resources) (model.Resources, error) {
	if res.VCPUs == 0 {
		res.VCPUs = DefaultVCPUs
	}
	if res.MemoryMiB == 0 {
		res.MemoryMiB = DefaultMemoryMiB
	}
	if res.VCPUs < MinVCPUs || res.VCPUs > MaxVCPUs {
		return res, model.Errorf(model.ErrUnprocessable, "resources.vcpus is %d; it must be between %d and %d", res.VCPUs, MinVCPUs, MaxVCPUs)
	}
	if res.MemoryMiB < MinMemoryMiB || res.MemoryMiB > MaxMemoryMiB {
		return res, model.Errorf(model.ErrUnprocessable, "resources.memory_mib is %d; it must be between %d and %d", res.MemoryMiB, MinMemoryMiB, MaxMemoryMiB)
	}
	return res, nil
}

// claim hands a running member of a pool matching want (digest, resources,
// runtime) to the caller, filled in by fill. ok is false when no pool
// matches or no member is ready: the caller boots a sandbox instead.
func (s *Service) claim(ctx context.Context, want model.Sandbox, idempotencyKey string) (model.Sandbox, model.Operation, bool, error) {
	if want.Runtime != DefaultRuntime {
		return model.Sandbox{}, model.Operation{}, false, nil
	}
	pools, err := s.st.ListPools(ctx)
	if err != nil {
		return model.Sandbox{}, model.Operation{}, false, fmt.Errorf("list pools: %w", err)
	}
	matched := false
	for _, pl := range pools {
		if pl.Digest == want.TemplateDigest && fullResources(pl.Resources) == fullResources(want.Resources) && pl.Size > 0 {
			matched = true
		}
	}
	if !matched {
		return model.Sandbox{}, model.Operation{}, false, nil
	}
	members, err := PoolMembers(ctx, s.st)
	if err != nil {
		return model.Sandbox{}, model.Operation{}, false, err
	}
	hit := false
	defer func() {
		if f := s.onPoolClaim.Load(); f != nil {
			(*f)(hit)
		}
	}()
	for _, m := range members {
		if m.Pool != want.TemplateDigest || m.State != model.StateRunning || m.DesiredState != model.StateRunning ||
			fullResources(m.Resources) != fullResources(want.Resources) || m.Runtime != want.Runtime || m.WorkerID == "" {
			continue
		}
		now := s.now()
		sb := m
		sb.OrgID, sb.Pool, sb.Template = want.OrgID, "", want.Template
		sb.Env, sb.Metadata, sb.TimeoutS, sb.ExpiresAt = want.Env, want.Metadata, want.TimeoutS, want.ExpiresAt
		sb.IdleSuspendS, sb.NoAutoWake, sb.LastActivityAt, sb.Reason = want.IdleSuspendS, want.NoAutoWake, now, ""
		sb.PublicTraffic, sb.OnExpiry, sb.Network = want.PublicTraffic, want.OnExpiry, want.Network
		op := model.Operation{
			ID: model.NewID("op"), OrgID: want.OrgID, SandboxID: m.ID, Kind: model.OpCreate, State: model.OpSucceeded,
			Target: model.StateRunning, CreatedAt: now, UpdatedAt: now, Deadline: now.Add(s.deadline()),
		}
		got, gotOp, existed, err := s.st.ClaimSandbox(ctx, sb, op, idempotencyKey)
		if errors.Is(err, model.ErrConflict) {
			continue // claimed or changed by someone else: try the next
		}
		if err != nil {
			return model.Sandbox{}, model.Operation{}, false, fmt.Errorf("claim pool member %s: %w", m.ID, err)
		}
		if existed {
			got, gotOp = s.current(ctx, got, gotOp)
			hit = true
			return got, gotOp, true, nil
		}
		s.publish(ctx, &got, &gotOp)
		s.kick() // the controller refills the pool
		hit = true
		return got, gotOp, true, nil
	}
	return model.Sandbox{}, model.Operation{}, false, nil
}

// ObservePoolClaims has f called for every create that a warm pool
// matches: hit when a running member was handed over, a miss when none was
// ready and the sandbox boots (the daemon's Prometheus metrics).
func (s *Service) ObservePoolClaims(f func(hit bool)) { s.onPoolClaim.Store(&f) }
