package service

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
)

// Disk limits of a sandbox (resources.disk_mib).
const (
	DefaultDiskMiB = 4096
	MinDiskMiB     = 64
	// DefaultMaxDiskMiB is the largest disk_mib a create may ask for unless
	// the operator sets Service.MaxDiskMiB (`--max-disk-mib`).
	DefaultMaxDiskMiB = 65536
)

// Default per-org create rate: sandboxes created (create, fork, import
// requests) per second and the bucket size.
const (
	DefaultCreateRate  = 50
	DefaultCreateBurst = 100
)

// MaxEnvBytes bounds a sandbox's env (the sum of its keys' and values'
// lengths) and, separately, a command's own env plus argv.
const MaxEnvBytes = 256 << 10

// maxDisk is the operator's disk_mib ceiling.
func (s *Service) maxDisk() int {
	if s.cfg.MaxDiskMiB > 0 {
		return s.cfg.MaxDiskMiB
	}
	return DefaultMaxDiskMiB
}

// resources fills in the defaults of a create's resources and checks them
// against the limits.
func (s *Service) resources(res model.Resources) (model.Resources, error) {
	res, err := defaultResources(res)
	if err != nil {
		return res, err
	}
	if res.DiskMiB == 0 {
		res.DiskMiB = min(DefaultDiskMiB, s.maxDisk())
	}
	if res.DiskMiB < MinDiskMiB || res.DiskMiB > s.maxDisk() {
		return res, model.Errorf(model.ErrUnprocessable, "resources.disk_mib is %d; it must be between %d and %d (the operator's --max-disk-mib)", res.DiskMiB, MinDiskMiB, s.maxDisk())
	}
	return res, nil
}

// fullResources is res with a record's missing disk_mib (sandboxes and
// pools older than the limit) read as the default the runtimes apply.
func fullResources(res model.Resources) model.Resources {
	if res.DiskMiB == 0 {
		res.DiskMiB = DefaultDiskMiB
	}
	return res
}

// holdsCapacity reports whether sb counts against the sandboxes, vCPUs and
// memory quotas: it is placed or waiting to be, and not on its way out.
func holdsCapacity(sb model.Sandbox) bool {
	switch sb.State {
	case model.StateSuspended, model.StateFailed, model.StateLost, model.StateDeleting, model.StateDeleted:
		return false
	}
	return sb.DesiredState != model.StateDeleted
}

// OrgUsage sums what an org's sandboxes hold, in the units of its quotas.
func (s *Service) OrgUsage(ctx context.Context, orgID string) (Usage, error) {
	sbs, err := store.ListAllSandboxes(ctx, s.st, store.SandboxFilter{OrgID: orgID})
	if err != nil {
		return Usage{}, fmt.Errorf("usage of org %s: %w", orgID, err)
	}
	var u Usage
	for _, sb := range sbs {
		if sb.State == model.StateDeleted || sb.DesiredState == model.StateDeleted || sb.Pool != "" {
			continue
		}
		res := fullResources(sb.Resources)
		if holdsCapacity(sb) {
			u.Sandboxes++
			u.VCPUs += res.VCPUs
			u.MemoryMiB += res.MemoryMiB
		}
		u.DiskMiB += res.DiskMiB
		u.Checkpoints += len(sb.Checkpoints)
	}
	u.Transfers = s.transfers.count(orgID)
	return u, nil
}

// QuotaError names the quota a request would exceed.
func quotaError(orgID, quota string, limit, used, more int, unit string) error {
	return withHint(model.Errorf(model.ErrQuotaExceeded, "org %s is at its %s quota: %d%s in use, the request needs %d more, the quota is %d; free some (delete or suspend sandboxes, delete checkpoints) or ask the operator to raise quotas.%s",
		orgID, quota, used, unit, more, limit, quota), Hint{Kind: HintRaiseQuota, OrgID: orgID, Quota: quota})
}

// admit checks that n more sandboxes of res fit the org's quotas. The
// caller holds lockOrg(orgID) until it has recorded them, so that two
// requests of one org cannot both take the last unit (on one server;
// replicas check independently).
func (s *Service) admit(ctx context.Context, orgID string, res model.Resources, n int) error {
	_, err := s.admitN(ctx, orgID, res, n)
	return err
}

// admitN is admit; limited says whether the org has a quota admit checks.
func (s *Service) admitN(ctx context.Context, orgID string, res model.Resources, n int) (limited bool, err error) {
	org, err := s.st.GetOrg(ctx, orgID)
	if errors.Is(err, model.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get org %s: %w", orgID, err)
	}
	q := org.Quotas
	if q.Sandboxes == 0 && q.VCPUs == 0 && q.MemoryMiB == 0 && q.DiskMiB == 0 {
		return false, nil
	}
	u, err := s.OrgUsage(ctx, orgID)
	if err != nil {
		return true, err
	}
	res = fullResources(res)
	for _, c := range []struct {
		name        string
		limit, used int
		more        int
		unit        string
	}{
		{"sandboxes", q.Sandboxes, u.Sandboxes, n, ""},
		{"vcpus", q.VCPUs, u.VCPUs, n * res.VCPUs, ""},
		{"memory_mib", q.MemoryMiB, u.MemoryMiB, n * res.MemoryMiB, " MiB"},
		{"disk_mib", q.DiskMiB, u.DiskMiB, n * res.DiskMiB, " MiB"},
	} {
		if c.limit > 0 && c.used+c.more > c.limit {
			return true, quotaError(orgID, c.name, c.limit, c.used, c.more, c.unit)
		}
	}
	return true, nil
}

// patchQuotas applies the fields of pt to q.
func patchQuotas(q model.Quotas, pt QuotasPatch) (model.Quotas, error) {
	for _, f := range []struct {
		name string
		v    *int
		dst  *int
	}{
		{"sandboxes", pt.Sandboxes, &q.Sandboxes},
		{"vcpus", pt.VCPUs, &q.VCPUs},
		{"memory_mib", pt.MemoryMiB, &q.MemoryMiB},
		{"disk_mib", pt.DiskMiB, &q.DiskMiB},
		{"checkpoints", pt.Checkpoints, &q.Checkpoints},
		{"transfers", pt.Transfers, &q.Transfers},
	} {
		if f.v == nil {
			continue
		}
		if *f.v < 0 {
			return q, model.Errorf(model.ErrUnprocessable, "quotas.%s is %d; it must be 0 (unlimited) or more", f.name, *f.v)
		}
		*f.dst = *f.v
	}
	return q, nil
}

// wakeGuard is the LifecycleRequest.Guard of a wake: a suspended sandbox
// takes capacity again, so it must fit its org's quotas.
func (s *Service) wakeGuard(ctx context.Context) func(model.Sandbox) error {
	return func(cur model.Sandbox) error {
		if holdsCapacity(cur) {
			return nil // already counted
		}
		return s.admit(ctx, cur.OrgID, cur.Resources, 1)
	}
}

// WakeQuotaGuard is the LifecycleRequest.Guard of a wake that a worker asks
// for on data-plane traffic (the controller's wake route): a suspended
// sandbox must fit its org's quotas. A refusal is model.ErrConflict (like a
// sandbox that opted out of auto-wake) with the quota's message, so that it
// reaches the data-plane client as is.
func WakeQuotaGuard(ctx context.Context, st store.Store) func(model.Sandbox) error {
	guard := New(Config{Store: st}).wakeGuard(ctx)
	return func(cur model.Sandbox) error {
		err := guard(cur)
		if errors.Is(err, model.ErrQuotaExceeded) {
			return model.Errorf(model.ErrConflict, "%s", err)
		}
		return err
	}
}

// admitCheckpoint checks that the org may store one more checkpoint.
func (s *Service) admitCheckpoint(ctx context.Context, orgID string) error {
	org, err := s.st.GetOrg(ctx, orgID)
	if err != nil || org.Quotas.Checkpoints == 0 {
		return nil
	}
	u, err := s.OrgUsage(ctx, orgID)
	if err != nil {
		return err
	}
	if u.Checkpoints+1 > org.Quotas.Checkpoints {
		return quotaError(orgID, "checkpoints", org.Quotas.Checkpoints, u.Checkpoints, 1, "")
	}
	return nil
}

// startTransfer counts one export or import of the org against its
// transfers quota; the caller calls done when the bytes have moved.
func (s *Service) startTransfer(ctx context.Context, orgID string) (done func(), err error) {
	limit := 0
	if org, err := s.st.GetOrg(ctx, orgID); err == nil {
		limit = org.Quotas.Transfers
	}
	if !s.transfers.acquire(orgID, limit) {
		return nil, quotaError(orgID, "transfers", limit, s.transfers.count(orgID), 1, "")
	}
	var once sync.Once
	return func() { once.Do(func() { s.transfers.release(orgID) }) }, nil
}

// admitLocked is admit under lockOrg(orgID): the caller calls unlock once
// it has recorded what was admitted. An org without sandbox or resource
// quotas has nothing to race for, so the lock is released at once and its
// creates run in parallel (a burst of one org's creates is not serialized
// on the server).
func (s *Service) admitLocked(ctx context.Context, orgID string, res model.Resources, n int) (unlock func(), err error) {
	unlock = s.lockOrg(orgID)
	limited, err := s.admitN(ctx, orgID, res, n)
	if err != nil || !limited {
		unlock()
		return func() {}, err
	}
	return unlock, nil
}

// lockOrg serializes quota checks and the writes they admit, per org.
func (s *Service) lockOrg(orgID string) func() {
	m, _ := s.orgLocks.LoadOrStore(orgID, new(sync.Mutex))
	mu := m.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}

// counter counts transfers in progress per org.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counter) acquire(org string, limit int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if limit > 0 && c.n[org] >= limit {
		return false
	}
	if c.n == nil {
		c.n = make(map[string]int)
	}
	c.n[org]++
	return true
}

func (c *counter) release(org string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[org]--; c.n[org] <= 0 {
		delete(c.n, org)
	}
}

func (c *counter) count(org string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[org]
}

// createRateError is a create refused by the org's create rate; it wraps
// the *RateLimitError that carries Retry-After.
type createRateError struct {
	org   string
	rate  float64
	burst int
	limit *RateLimitError
}

func (e *createRateError) Error() string {
	return fmt.Sprintf("org %s creates sandboxes faster than its limit of %g per second (burst %d); retry after %s, or ask the operator to raise --create-rate",
		e.org, e.rate, e.burst, e.limit.RetryAfter)
}

func (e *createRateError) Unwrap() error { return e.limit }

// allowCreate charges one create request to the org's token bucket.
func (s *Service) allowCreate(orgID string) error {
	rate, burst := s.cfg.CreateRate, s.cfg.CreateBurst
	if rate == 0 {
		rate = DefaultCreateRate
	}
	if burst <= 0 {
		burst = DefaultCreateBurst
	}
	err := s.createLimiter.allow(orgID, rate, float64(burst), s.now())
	var rl *RateLimitError
	if errors.As(err, &rl) {
		return &createRateError{org: orgID, rate: rate, burst: burst, limit: rl}
	}
	return err
}

// envSize is the bytes an env takes: its keys and values.
func envSize(env map[string]string) int {
	n := 0
	for k, v := range env {
		n += len(k) + len(v)
	}
	return n
}
