package service

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
)

// Limits on create requests.
const (
	DefaultTemplate    = "base"
	DefaultVCPUs       = 1
	DefaultMemoryMiB   = 512
	MinVCPUs, MaxVCPUs = 1, 8
	MinMemoryMiB       = 128
	MaxMemoryMiB       = 16384
	MaxMetadataPairs   = 64
	MaxMetadataValue   = 1024
	MaxKeyLen          = 256
	MaxIdempotencyKey  = 255
	MaxListLimit       = 1000
	DefaultListLimit   = 100
	MaxWait            = 60 * time.Second
	maxUpdateRetries   = 8
	digestPrefix       = "sha256:"
	digestHexLen       = 64
	defaultTemplateTag = "latest"
)

// errTemplateNotFound is what resolveTemplate wraps when a well-formed
// reference names no template here; it is also a model.ErrUnprocessable.
var errTemplateNotFound = fmt.Errorf("template not found: %w", model.ErrUnprocessable)

// CreateSandbox validates req, records a pending sandbox that should be
// running and the create operation that tracks it, and wakes the
// controllers. A repeated idempotencyKey (per org) returns the sandbox and
// operation of the first call and writes nothing.
func (s *Service) CreateSandbox(ctx context.Context, p Principal, req CreateParams, idempotencyKey string) (model.Sandbox, model.Operation, error) {
	if len(idempotencyKey) > MaxIdempotencyKey {
		return model.Sandbox{}, model.Operation{}, model.Errorf(model.ErrUnprocessable, "Idempotency-Key is longer than %d characters", MaxIdempotencyKey)
	}
	tpl, ref, err := s.resolveTemplate(ctx, req.Template)
	if err != nil {
		return model.Sandbox{}, model.Operation{}, err
	}
	res, err := s.resources(req.Resources)
	if err != nil {
		return model.Sandbox{}, model.Operation{}, err
	}
	sb, err := s.newSandbox(ctx, p, req)
	if err != nil {
		return model.Sandbox{}, model.Operation{}, err
	}
	rt := req.Runtime
	if rt == "" {
		rt = s.runtime()
	}
	if err := s.checkRuntime(ctx, rt); err != nil {
		return model.Sandbox{}, model.Operation{}, err
	}

	sb.ID = model.NewID("sb")
	sb.Template, sb.TemplateDigest, sb.Runtime, sb.Resources = ref, tpl.Digest, rt, res
	op := s.createOp(sb, model.OpCreate)
	unlock, err := s.admitLocked(ctx, p.OrgID, res, 1)
	defer unlock()
	if err != nil {
		return model.Sandbox{}, model.Operation{}, err
	}
	// A running warm-pool member that matches is handed over at once.
	if csb, cop, ok, err := s.claim(ctx, sb, idempotencyKey); err != nil {
		return model.Sandbox{}, model.Operation{}, err
	} else if ok {
		return csb, cop, nil
	}
	sb, op, existed, err := s.st.CreateSandbox(ctx, sb, op, idempotencyKey)
	if err != nil {
		return model.Sandbox{}, model.Operation{}, fmt.Errorf("create sandbox: %w", err)
	}
	if existed {
		sb, op = s.current(ctx, sb, op)
		return sb, op, nil
	}
	s.publish(ctx, &sb, &op)
	s.kick()
	return sb, op, nil
}

// checkRuntime accepts the default runtime and any runtime a registered
// worker offers (e.g. "qemu"); placement then picks a live worker with it.
func (s *Service) checkRuntime(ctx context.Context, rt string) error {
	if rt == DefaultRuntime {
		return nil
	}
	ws, err := s.st.ListWorkers(ctx)
	if err != nil {
		return fmt.Errorf("list workers: %w", err)
	}
	offered := []string{DefaultRuntime}
	for _, w := range ws {
		for _, r := range w.RuntimeNames() {
			if r == rt {
				return nil
			}
			if !slices.Contains(offered, r) {
				offered = append(offered, r)
			}
		}
	}
	return model.Errorf(model.ErrUnprocessable, "runtime %q is not available; workers offer %s", rt, strings.Join(offered, ", "))
}

// current returns the stored state of an idempotent request's pair (the
// given values if a read fails).
func (s *Service) current(ctx context.Context, sb model.Sandbox, op model.Operation) (model.Sandbox, model.Operation) {
	if cur, err := s.st.GetSandbox(ctx, sb.ID); err == nil {
		sb = cur
	}
	if cur, err := s.st.GetOperation(ctx, op.ID); err == nil {
		op = cur
	}
	return sb, op
}

// publish appends events for a change that is already stored. A failure
// is logged, not returned: the write happened, and failing the request
// would make clients retry it.
func (s *Service) publish(ctx context.Context, sb *model.Sandbox, op *model.Operation) {
	if s.ev == nil {
		return
	}
	if sb != nil {
		if err := s.ev.Sandbox(ctx, *sb); err != nil {
			s.logger().Warn("append sandbox event", "sandbox", sb.ID, "err", err)
		}
	}
	if op != nil {
		if err := s.ev.Operation(ctx, *op); err != nil {
			s.logger().Warn("append operation event", "operation", op.ID, "err", err)
		}
	}
}

// resolveTemplate accepts "name", "name:tag" (tag defaults to "latest") or
// "sha256:<64 hex>" and returns the template and the reference to record.
func (s *Service) resolveTemplate(ctx context.Context, ref string) (model.Template, string, error) {
	if ref == "" {
		ref = DefaultTemplate
	}
	var (
		t   model.Template
		err error
	)
	if strings.HasPrefix(ref, digestPrefix) {
		hexPart := ref[len(digestPrefix):]
		if len(hexPart) != digestHexLen || strings.Trim(hexPart, "0123456789abcdef") != "" {
			return model.Template{}, "", model.Errorf(model.ErrUnprocessable, "template %q is not a valid digest (sha256: and 64 lowercase hex characters)", ref)
		}
		t, err = s.st.GetTemplateByDigest(ctx, ref)
	} else {
		name, tag, _ := strings.Cut(ref, ":")
		if tag == "" {
			tag = defaultTemplateTag
		}
		if name == "" || strings.ContainsAny(name, " /\\@") || strings.Contains(tag, ":") {
			return model.Template{}, "", model.Errorf(model.ErrUnprocessable, "template %q is not a valid reference; use name, name:tag or sha256:<digest>", ref)
		}
		t, err = s.st.GetTemplate(ctx, name, tag)
	}
	if errors.Is(err, model.ErrNotFound) {
		return model.Template{}, "", withHint(model.Errorf(errTemplateNotFound, "template %q not found", ref), Hint{Kind: HintListTemplates})
	}
	if err != nil {
		return model.Template{}, "", fmt.Errorf("resolve template %q: %w", ref, err)
	}
	return t, ref, nil
}

func validateEnv(field string, env map[string]string) error {
	if n := envSize(env); n > MaxEnvBytes {
		return model.Errorf(model.ErrUnprocessable, "%s is %d bytes (keys and values); at most %d are allowed; pass large data as a file instead", field, n, MaxEnvBytes)
	}
	for k, v := range env {
		if k == "" || len(k) > MaxKeyLen || strings.ContainsAny(k, "=\x00") {
			return model.Errorf(model.ErrUnprocessable, "%s key %q is invalid; keys must be 1 to %d characters without '=' or NUL", field, k, MaxKeyLen)
		}
		if strings.ContainsRune(v, 0) {
			return model.Errorf(model.ErrUnprocessable, "%s value of %q contains NUL", field, k)
		}
	}
	return nil
}

func validateMetadata(md map[string]string) error {
	if len(md) > MaxMetadataPairs {
		return model.Errorf(model.ErrUnprocessable, "metadata has %d pairs; at most %d are allowed", len(md), MaxMetadataPairs)
	}
	for k, v := range md {
		if k == "" || len(k) > MaxKeyLen {
			return model.Errorf(model.ErrUnprocessable, "metadata key %q is invalid; keys must be 1 to %d characters", k, MaxKeyLen)
		}
		if len(v) > MaxMetadataValue {
			return model.Errorf(model.ErrUnprocessable, "metadata value of %q is %d bytes; at most %d are allowed", k, len(v), MaxMetadataValue)
		}
	}
	return nil
}

// GetSandbox returns the caller's sandbox. Another org's sandbox is
// reported as not found, so that ids reveal nothing across orgs.
func (s *Service) GetSandbox(ctx context.Context, p Principal, id string) (model.Sandbox, error) {
	sb, err := s.st.GetSandbox(ctx, id)
	if errors.Is(err, model.ErrNotFound) || err == nil && sb.OrgID != p.OrgID {
		return model.Sandbox{}, model.Errorf(model.ErrNotFound, "sandbox %s not found", id)
	}
	if err != nil {
		return model.Sandbox{}, fmt.Errorf("get sandbox %s: %w", id, err)
	}
	return sb, nil
}

// ListSandboxes returns one page of the caller's sandboxes and the cursor of
// the next page ("" on the last). Deleted sandboxes are listed only when
// f.States asks for them.
func (s *Service) ListSandboxes(ctx context.Context, p Principal, f ListParams) ([]model.Sandbox, string, error) {
	if f.Limit < 0 || f.Limit > MaxListLimit {
		return nil, "", model.Errorf(model.ErrUnprocessable, "limit is %d; it must be between 1 and %d", f.Limit, MaxListLimit)
	}
	if f.Limit == 0 {
		f.Limit = DefaultListLimit
	}
	sf := store.SandboxFilter{OrgID: p.OrgID, States: f.States, Metadata: f.Metadata, Cursor: f.Cursor, Limit: f.Limit,
		Templates: f.Templates, CreatedAfter: f.CreatedAfter, Descending: f.Descending}
	for _, st := range f.States {
		if !st.Valid() {
			return nil, "", model.Errorf(model.ErrUnprocessable, "unknown state %q", st)
		}
		if st == model.StateDeleted {
			sf.IncludeDeleted = true
		}
	}
	sbs, next, err := s.st.ListSandboxes(ctx, sf)
	if errors.Is(err, model.ErrInvalid) {
		return nil, "", model.Errorf(model.ErrUnprocessable, "cursor %q is invalid; pass next_cursor from the previous page", f.Cursor)
	}
	if err != nil {
		return nil, "", fmt.Errorf("list sandboxes: %w", err)
	}
	if sbs == nil {
		sbs = []model.Sandbox{}
	}
	return sbs, next, nil
}

// DeleteSandbox asks for the sandbox to be deleted and returns the delete
// operation. While a delete is in progress, calling again returns the same
// operation. A sandbox already deleted is not found.
func (s *Service) DeleteSandbox(ctx context.Context, p Principal, id string) (model.Operation, error) {
	for range maxUpdateRetries {
		sb, err := s.GetSandbox(ctx, p, id)
		if err != nil {
			return model.Operation{}, err
		}
		if sb.State == model.StateDeleted {
			return model.Operation{}, model.Errorf(model.ErrNotFound, "sandbox %s not found", id)
		}
		open, err := s.st.ListOperations(ctx, store.OperationFilter{SandboxID: id, Open: true})
		if err != nil {
			return model.Operation{}, fmt.Errorf("list operations of %s: %w", id, err)
		}
		for _, op := range open {
			if op.Kind == model.OpDelete && !op.State.Done() {
				return op, nil
			}
		}
		now := s.now()
		op := model.Operation{
			ID: model.NewID("op"), OrgID: p.OrgID, SandboxID: id, Kind: model.OpDelete, State: model.OpPending,
			Target: model.StateDeleted, CreatedAt: now, UpdatedAt: now, Deadline: now.Add(s.deadline()),
		}
		// The desired state and the operation in one write: a worker that
		// sees the sandbox's desired state also finds its operation (the
		// trace its delete joins).
		marked := sb
		err = s.st.InTx(ctx, func(tx store.Tx) error {
			if sb.DesiredState != model.StateDeleted {
				nsb := sb
				nsb.DesiredState = model.StateDeleted
				updated, err := tx.UpdateSandbox(ctx, nsb)
				if err != nil {
					return err
				}
				marked = updated
			}
			if err := tx.CreateOperation(ctx, op); err != nil {
				return fmt.Errorf("create delete operation: %w", err)
			}
			return nil
		})
		if errors.Is(err, model.ErrConflict) {
			continue // someone else wrote; re-read and decide again
		}
		if err != nil {
			return model.Operation{}, fmt.Errorf("mark sandbox %s for deletion: %w", id, err)
		}
		sb = marked
		s.publish(ctx, &sb, &op)
		s.kick()
		return op, nil
	}
	return model.Operation{}, model.Errorf(model.ErrConflict, "sandbox %s is changing too fast to delete; retry", id)
}

// GetOperation returns the caller's operation.
func (s *Service) GetOperation(ctx context.Context, p Principal, id string) (model.Operation, error) {
	op, err := s.st.GetOperation(ctx, id)
	if errors.Is(err, model.ErrNotFound) || err == nil && op.OrgID != p.OrgID {
		return model.Operation{}, model.Errorf(model.ErrNotFound, "operation %s not found", id)
	}
	if err != nil {
		return model.Operation{}, fmt.Errorf("get operation %s: %w", id, err)
	}
	return op, nil
}

// WaitOperation returns the operation once it is done or d (at most MaxWait)
// has passed, whichever is first; the caller checks State.Done().
func (s *Service) WaitOperation(ctx context.Context, p Principal, id string, d time.Duration) (model.Operation, error) {
	d = min(max(d, 0), MaxWait)
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		var changed <-chan struct{}
		if s.ev != nil {
			changed = s.ev.Changed() // before the read, so no change is missed
		}
		op, err := s.GetOperation(ctx, p, id)
		if err != nil || op.State.Done() {
			return op, err
		}
		select {
		case <-changed:
		case <-timer.C:
			return op, nil
		case <-ctx.Done():
			return op, nil
		}
	}
}

// ListEvents returns the caller's events after seq, oldest first, at most
// limit; sandboxID (optional) narrows to one sandbox, which must be the
// caller's.
func (s *Service) ListEvents(ctx context.Context, p Principal, sandboxID string, after int64, limit int) ([]model.Event, error) {
	evs, err := s.st.ListEvents(ctx, p.OrgID, sandboxID, after, limit)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].Seq < evs[j].Seq })
	return evs, nil
}

// Subscribe follows the events of org orgID (of one sandbox if sandboxID
// is set) as they are appended; the caller closes the subscription.
func (s *Service) Subscribe(ctx context.Context, orgID, sandboxID string) (*events.Subscription, error) {
	if s.ev == nil {
		return nil, errors.New("the service has no event log")
	}
	return s.ev.Subscribe(ctx, orgID, sandboxID)
}

// EventsChanged returns a channel closed when new events may exist.
func (s *Service) EventsChanged() <-chan struct{} {
	if s.ev == nil {
		return nil
	}
	return s.ev.Changed()
}

// ListTemplates returns every template.
func (s *Service) ListTemplates(ctx context.Context, p Principal) ([]model.Template, error) {
	ts, err := s.st.ListTemplates(ctx)
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	if ts == nil {
		ts = []model.Template{}
	}
	return ts, nil
}
