package service

// Checkpoints, rollback, forks, export and import: the snapshot features
// behind the per-org feature gate "snapshots" (model.FeatureSnapshots).
//
// A checkpoint or a rollback is a Task on the sandbox (model.Task) with an
// operation, started through StartLifecycle so that it is serialized with
// every other lifecycle request; the sandbox's worker runs it and reports
// its outcome, and the controller completes the operation. Checkpoints live
// in the snapshot store of the sandbox's worker, so forks are placed on that
// worker (model.Source pins them). Export and import stream the portable
// archive (internal/snapshot Export/Import) between the client and that
// worker's data plane through the API server, with a server-signed token of
// scope "snapshot".

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/httperr"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/scheduler"
	"github.com/airlock/airlock/internal/snapshot"
	"github.com/airlock/airlock/internal/store"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

// checkpointName is what a checkpoint may be called.
var checkpointName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// snapshotCaps are the powers checkpoints, rollback, forks and imports
// need of a sandbox's runtime.
var snapshotCaps = model.RuntimeCaps{Snapshot: true, LeaveRunning: true, Fork: true}

// snapshotRuntimes lists, sorted, the runtimes checkpoints, rollback, forks
// and imports work on: those with snapshotCaps as a registered worker
// declares them, and of the runtimes no registered worker offers, those
// model.LegacyRuntimes gives them (a sandbox whose workers are all gone
// keeps what its runtime could do).
func (s *Service) snapshotRuntimes(ctx context.Context) ([]string, error) {
	ws, err := s.st.ListWorkers(ctx)
	if err != nil {
		return nil, fmt.Errorf("list workers: %w", err)
	}
	can := map[string]bool{}
	for _, w := range ws {
		for _, r := range w.Runtimes {
			can[r.Name] = can[r.Name] || r.Caps.Has(snapshotCaps)
		}
	}
	for _, r := range model.LegacyRuntimes() {
		if _, offered := can[r.Name]; !offered {
			can[r.Name] = r.Caps.Has(snapshotCaps)
		}
	}
	var names []string
	for n, ok := range can {
		if ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names, nil
}

// requireSnapshots returns the 403 that names the gate when org orgID does
// not have it.
func (s *Service) requireSnapshots(ctx context.Context, orgID string) error {
	org, err := s.st.GetOrg(ctx, orgID)
	if err != nil && !errors.Is(err, model.ErrNotFound) {
		return fmt.Errorf("get org %s: %w", orgID, err)
	}
	for _, f := range org.Features {
		if f == model.FeatureSnapshots {
			return nil
		}
	}
	return withHint(model.Errorf(model.ErrForbidden, "checkpoints, rollback, forks and export/import need the %q feature gate, which org %s does not have; an admin of the %q org can enable it",
		model.FeatureSnapshots, orgID, DefaultOrgName), Hint{Kind: HintGrantFeatures, OrgID: orgID, Features: []string{model.FeatureSnapshots}})
}

// snapshotSandbox returns sandbox id of p's org once the gate and the
// runtime allow snapshot features on it.
func (s *Service) snapshotSandbox(ctx context.Context, p Principal, id string) (model.Sandbox, error) {
	sb, err := s.GetSandbox(ctx, p, id)
	if err != nil {
		return model.Sandbox{}, err
	}
	if err := s.requireSnapshots(ctx, sb.OrgID); err != nil {
		return model.Sandbox{}, err
	}
	rts, err := s.snapshotRuntimes(ctx)
	if err != nil {
		return model.Sandbox{}, err
	}
	if !slices.Contains(rts, sb.Runtime) {
		return model.Sandbox{}, model.Errorf(model.ErrConflict, "sandbox %s runs on the %s runtime; checkpoints, rollback and forks are available on the %s runtime only for now",
			id, sb.Runtime, strings.Join(rts, ", "))
	}
	return sb, nil
}

// CreateCheckpoint starts writing checkpoint name of a running or paused
// sandbox; the sandbox stays as it is. It returns the checkpoint operation.
func (s *Service) CreateCheckpoint(ctx context.Context, p Principal, id, name string) (model.Operation, error) {
	sb, err := s.snapshotSandbox(ctx, p, id)
	if err != nil {
		return model.Operation{}, err
	}
	if !checkpointName.MatchString(name) {
		return model.Operation{}, model.Errorf(model.ErrUnprocessable, "checkpoint name %q is invalid: use 1-63 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit", name)
	}
	if err := s.admitCheckpoint(ctx, sb.OrgID); err != nil {
		return model.Operation{}, err
	}
	return s.requestLifecycle(ctx, LifecycleRequest{
		SandboxID: sb.ID, Kind: model.OpCheckpoint,
		Task: &model.Task{Checkpoint: name},
		Guard: func(cur model.Sandbox) error {
			if _, ok := cur.FindCheckpoint(name); ok {
				return model.Errorf(model.ErrConflict, "sandbox %s already has a checkpoint named %q; choose another name", id, name)
			}
			return nil
		},
	})
}

// ListCheckpoints returns the completed checkpoints of a sandbox, oldest
// first.
func (s *Service) ListCheckpoints(ctx context.Context, p Principal, id string) ([]model.Checkpoint, error) {
	sb, err := s.GetSandbox(ctx, p, id)
	if err != nil {
		return nil, err
	}
	if err := s.requireSnapshots(ctx, sb.OrgID); err != nil {
		return nil, err
	}
	if sb.Checkpoints == nil {
		return []model.Checkpoint{}, nil
	}
	return sb.Checkpoints, nil
}

// DeleteCheckpoint removes checkpoint name of a sandbox: from its record
// at once (nothing can roll back to or fork from it any more, and it stops
// counting toward the org's checkpoints), then from its worker's disk (best
// effort: a worker that cannot be reached keeps the bytes until the sandbox
// is deleted). A rollback to it, or a fork still starting from it, is a
// conflict: wait for it and retry.
func (s *Service) DeleteCheckpoint(ctx context.Context, p Principal, id, name string) error {
	for attempt := 0; ; attempt++ {
		sb, err := s.GetSandbox(ctx, p, id)
		if err != nil {
			return err
		}
		if err := s.requireSnapshots(ctx, sb.OrgID); err != nil {
			return err
		}
		cp, ok := sb.FindCheckpoint(name)
		if !ok {
			return noCheckpoint(id, name)
		}
		if err := s.checkpointInUse(ctx, sb, name); err != nil {
			return err
		}
		sb.Checkpoints = slices.DeleteFunc(slices.Clone(sb.Checkpoints), func(c model.Checkpoint) bool { return c.Name == name })
		if _, err := s.st.UpdateSandbox(ctx, sb); errors.Is(err, model.ErrConflict) && attempt < 5 {
			continue // the sandbox moved on: read it again
		} else if err != nil {
			return fmt.Errorf("delete checkpoint %s of %s: %w", name, id, err)
		}
		s.dropCheckpoint(sb, cp)
		return nil
	}
}

// checkpointInUse refuses to delete a checkpoint an open rollback restores
// or a fork still starting uses.
func (s *Service) checkpointInUse(ctx context.Context, sb model.Sandbox, name string) error {
	open, err := s.st.ListOperations(ctx, store.OperationFilter{SandboxID: sb.ID, Open: true})
	if err != nil {
		return fmt.Errorf("list operations of %s: %w", sb.ID, err)
	}
	for _, op := range open {
		if (op.Kind == model.OpRollback || op.Kind == model.OpCheckpoint) && sb.Task != nil && sb.Task.OperationID == op.ID && sb.Task.Checkpoint == name {
			return withHint(model.Errorf(model.ErrConflict, "sandbox %s has a %s operation %s of checkpoint %q in progress; wait for it and retry", sb.ID, op.Kind, op.ID, name), Hint{Kind: HintWait, SandboxID: sb.ID})
		}
	}
	starting, _, err := s.st.ListSandboxes(ctx, store.SandboxFilter{OrgID: sb.OrgID, States: []model.SandboxState{model.StatePending, model.StateStarting}, Limit: MaxListLimit})
	if err != nil {
		return fmt.Errorf("list starting sandboxes: %w", err)
	}
	for _, f := range starting {
		if f.Source != nil && f.Source.SandboxID == sb.ID && f.Source.Checkpoint == name {
			return withHint(model.Errorf(model.ErrConflict, "sandbox %s is still starting from checkpoint %q of %s; wait for it and retry", f.ID, name, sb.ID), Hint{Kind: HintWait, SandboxID: f.ID})
		}
	}
	return nil
}

// dropCheckpoint asks the worker holding sb's checkpoint cp to delete its
// snapshot (best effort, logged).
func (s *Service) dropCheckpoint(sb model.Sandbox, cp model.Checkpoint) {
	if sb.WorkerID == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, err := s.workerOf(ctx, sb)
	if err == nil {
		var t workerapi.Target
		if t, err = s.target(ctx, w, sb, token.Claims{Scope: token.ScopeSnapshot, Snapshot: cp.SnapshotID}); err == nil {
			err = s.dataPlane().DropSnapshot(ctx, t, sb.ID, cp.SnapshotID)
		}
	}
	if err != nil {
		s.logger().Warn("drop deleted checkpoint", "worker", sb.WorkerID, "sandbox", sb.ID, "checkpoint", cp.Name, "snapshot", cp.SnapshotID, "err", err)
	}
}

// RollbackSandbox starts restoring a running or paused sandbox from one of
// its checkpoints (memory, processes and files); it is running afterwards.
func (s *Service) RollbackSandbox(ctx context.Context, p Principal, id, checkpoint string) (model.Operation, error) {
	sb, err := s.snapshotSandbox(ctx, p, id)
	if err != nil {
		return model.Operation{}, err
	}
	if checkpoint == "" {
		return model.Operation{}, withHint(model.Errorf(model.ErrUnprocessable, "checkpoint is required: the name of one of the sandbox's checkpoints"), Hint{Kind: HintListCheckpoints, SandboxID: id})
	}
	task := &model.Task{Checkpoint: checkpoint}
	return s.requestLifecycle(ctx, LifecycleRequest{
		SandboxID: sb.ID, Kind: model.OpRollback,
		Task: task,
		Guard: func(cur model.Sandbox) error {
			cp, ok := cur.FindCheckpoint(checkpoint)
			if !ok {
				return noCheckpoint(id, checkpoint)
			}
			task.SnapshotID = cp.SnapshotID // StartLifecycle copies the task after the guard
			return nil
		},
	})
}

// ForkSandboxes creates req.Count sandboxes (default 1) that start from
// checkpoint req.FromCheckpoint, on the worker that holds it. Each fork
// has its own create operation of kind fork. A repeated idempotencyKey
// returns the forks of the first call.
func (s *Service) ForkSandboxes(ctx context.Context, p Principal, req CreateParams, idempotencyKey string) ([]Created, error) {
	ref := req.FromCheckpoint
	if ref == nil {
		return nil, model.Errorf(model.ErrUnprocessable, "from_checkpoint is required to fork")
	}
	if req.Template != "" || req.Runtime != "" || req.Resources != (model.Resources{}) {
		return nil, model.Errorf(model.ErrUnprocessable, "a fork takes the template, runtime and resources of its checkpoint; leave template, runtime and resources out")
	}
	if req.Import != "" {
		return nil, model.Errorf(model.ErrUnprocessable, "from_checkpoint and import exclude each other")
	}
	count := req.Count
	if count == 0 {
		count = 1
	}
	if count < 1 || count > MaxForks {
		return nil, model.Errorf(model.ErrUnprocessable, "count is %d; it must be between 1 and %d", req.Count, MaxForks)
	}
	if len(idempotencyKey)+4 > MaxIdempotencyKey {
		return nil, model.Errorf(model.ErrUnprocessable, "Idempotency-Key is longer than %d characters", MaxIdempotencyKey-4)
	}
	src, err := s.snapshotSandbox(ctx, p, ref.SandboxID)
	if err != nil {
		return nil, err
	}
	cp, ok := src.FindCheckpoint(ref.Checkpoint)
	if !ok {
		return nil, noCheckpoint(src.ID, ref.Checkpoint)
	}
	if src.DesiredState == model.StateDeleted || src.State.Terminal() && src.State != model.StateFailed || src.WorkerID == "" {
		return nil, model.Errorf(model.ErrConflict, "sandbox %s is %s; its checkpoints are gone or unreachable", src.ID, src.State)
	}
	base, err := s.newSandbox(ctx, p, req)
	if err != nil {
		return nil, err
	}
	base.Template, base.TemplateDigest, base.Runtime, base.Resources = src.Template, src.TemplateDigest, src.Runtime, src.Resources
	base.Source = &model.Source{WorkerID: src.WorkerID, SandboxID: src.ID, Checkpoint: cp.Name, SnapshotID: cp.SnapshotID}
	unlock, err := s.admitLocked(ctx, p.OrgID, base.Resources, count)
	defer unlock()
	if err != nil {
		return nil, err
	}
	out := make([]Created, 0, count)
	for i := range count {
		sb := base
		sb.ID = model.NewID("sb")
		op := s.createOp(sb, model.OpFork)
		key := ""
		if idempotencyKey != "" {
			key = idempotencyKey + "#" + strconv.Itoa(i)
		}
		sb, op, existed, err := s.st.CreateSandbox(ctx, sb, op, key)
		if err != nil {
			return out, fmt.Errorf("create fork %d of %d: %w", i+1, count, err)
		}
		if existed {
			sb, op = s.current(ctx, sb, op)
		} else {
			s.publish(ctx, &sb, &op)
		}
		out = append(out, Created{Sandbox: sb, Operation: op})
	}
	s.touch(ctx, src.ID)
	s.kick()
	return out, nil
}

// newSandbox is a pending sandbox of p's org with the per-request settings
// of req (env, metadata, timeout, idle, auto-wake); the caller sets the
// template, runtime, resources and source.
func (s *Service) newSandbox(ctx context.Context, p Principal, req CreateParams) (model.Sandbox, error) {
	if err := validateEnv("env", req.Env); err != nil {
		return model.Sandbox{}, err
	}
	if err := validateMetadata(req.Metadata); err != nil {
		return model.Sandbox{}, err
	}
	if req.TimeoutS < 0 {
		return model.Sandbox{}, model.Errorf(model.ErrUnprocessable, "timeout_s is %d; it must be 0 (no expiry) or more", req.TimeoutS)
	}
	switch req.OnExpiry {
	case "", model.ExpiryDelete, model.ExpirySuspend:
	default:
		return model.Sandbox{}, model.Errorf(model.ErrUnprocessable, "unknown expiry action %.40q; it is %q or %q", req.OnExpiry, model.ExpiryDelete, model.ExpirySuspend)
	}
	idle, err := s.idleSuspend(ctx, p.OrgID, req.IdleSuspendAfterS)
	if err != nil {
		return model.Sandbox{}, err
	}
	org, err := s.st.GetOrg(ctx, p.OrgID)
	if err != nil {
		return model.Sandbox{}, fmt.Errorf("get org %s: %w", p.OrgID, err)
	}
	netw, err := s.resolveNetwork(ctx, p, org, req.Network)
	if err != nil {
		return model.Sandbox{}, err
	}
	if err := s.allowCreate(p.OrgID); err != nil {
		return model.Sandbox{}, err
	}
	now := s.now()
	sb := model.Sandbox{
		OrgID: p.OrgID, State: model.StatePending, DesiredState: model.StateRunning,
		Env: req.Env, Metadata: req.Metadata, TimeoutS: req.TimeoutS, OnExpiry: req.OnExpiry,
		CreatedAt: now, UpdatedAt: now, LastActivityAt: now,
		IdleSuspendS: idle, NoAutoWake: req.AutoWake != nil && !*req.AutoWake,
		PublicTraffic: req.PublicTraffic, Network: netw,
	}
	if req.TimeoutS > 0 {
		exp := now.Add(time.Duration(req.TimeoutS) * time.Second)
		sb.ExpiresAt = &exp
	}
	return sb, nil
}

// createOp is the operation that tracks the first start of sb (new, not
// yet written), dated like sb.
func (s *Service) createOp(sb model.Sandbox, kind model.OperationKind) model.Operation {
	now := sb.CreatedAt
	return model.Operation{
		ID: model.NewID("op"), OrgID: sb.OrgID, SandboxID: sb.ID, Kind: kind, State: model.OpPending,
		Target: model.StateRunning, CreatedAt: now, UpdatedAt: now, Deadline: now.Add(s.deadline()),
	}
}

// Export is a checkpoint archive on its way from the worker.
type Export struct {
	Body     io.ReadCloser
	Size     int64 // -1 if unknown
	Filename string
}

// ExportCheckpoint opens the portable archive of checkpoint name of a
// sandbox (streamed from its worker). The caller closes Body.
func (s *Service) ExportCheckpoint(ctx context.Context, p Principal, id, name string) (Export, error) {
	sb, err := s.GetSandbox(ctx, p, id)
	if err != nil {
		return Export{}, err
	}
	if err := s.requireSnapshots(ctx, sb.OrgID); err != nil {
		return Export{}, err
	}
	cp, ok := sb.FindCheckpoint(name)
	if !ok {
		return Export{}, noCheckpoint(id, name)
	}
	if sb.DesiredState == model.StateDeleted || sb.State == model.StateDeleted {
		return Export{}, model.Errorf(model.ErrConflict, "sandbox %s is being deleted; its checkpoints go with it", id)
	}
	w, err := s.workerOf(ctx, sb)
	if err != nil {
		return Export{}, err
	}
	done, err := s.startTransfer(ctx, sb.OrgID)
	if err != nil {
		return Export{}, err
	}
	handed := false // to the caller, with Body
	defer func() {
		if !handed {
			done()
		}
	}()
	t, err := s.target(ctx, w, sb, token.Claims{Scope: token.ScopeSnapshot, Snapshot: cp.SnapshotID})
	if err != nil {
		return Export{}, err
	}
	archive, size, err := s.dataPlane().Export(ctx, t, sb.ID, cp.SnapshotID)
	if err != nil {
		return Export{}, workerError(err, w.ID, "exporting checkpoint "+strconv.Quote(name)+" of "+id)
	}
	body, size, err := s.signArchive(ctx, archive, size)
	if err != nil {
		archive.Close()
		return Export{}, fmt.Errorf("export checkpoint %q of %s from worker %s: %w", name, id, w.ID, err)
	}
	s.touch(ctx, sb.ID)
	handed = true
	return Export{Body: readCloser{body, doneCloser{archive, done}}, Size: size, Filename: sb.ID + "-" + name + ".tar"}, nil
}

// signArchive returns archive (of size bytes, -1 if unknown) with the
// installation's signature over its manifest inserted after the manifest
// (snapshot.SignatureFile), and its new size.
func (s *Service) signArchive(ctx context.Context, archive io.Reader, size int64) (io.Reader, int64, error) {
	key, err := s.exportKey(ctx)
	if err != nil {
		return nil, 0, err
	}
	h, err := snapshot.ReadHead(archive)
	if err != nil {
		return nil, 0, model.Errorf(model.ErrUnavailable, "the worker's archive does not start as a checkpoint archive does: %v", err)
	}
	signed, extra, err := h.Signed(snapshot.Sign(key, h.ManifestBytes))
	if err != nil {
		return nil, 0, err
	}
	if size >= 0 {
		size += extra
	}
	return signed, size, nil
}

// doneCloser closes c, then calls done (the end of a transfer).
type doneCloser struct {
	c    io.Closer
	done func()
}

func (d doneCloser) Close() error {
	defer d.done()
	return d.c.Close()
}

// readCloser reads from one reader and closes another.
type readCloser struct {
	io.Reader
	io.Closer
}

// workerError words the failure of a data-plane call to worker wid (what:
// e.g. "importing an archive") for the user: what the user's request did
// wrong (invalid, unprocessable, not found, conflict, too large) keeps the
// worker's message and meaning; anything else, the worker refusing the
// server's own credentials included, is the worker failing: unavailable.
func workerError(err error, wid, what string) error {
	var we *workerapi.Error
	if !errors.As(err, &we) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%s: %w", what, err)
		}
		if errors.Is(err, model.ErrUnavailable) {
			return err // it says which worker did not answer
		}
		return model.Errorf(model.ErrUnavailable, "worker %s failed %s: %v", wid, what, err)
	}
	switch kind := httperr.Kind(we); kind {
	case model.ErrInvalid, model.ErrUnprocessable, model.ErrNotFound, model.ErrConflict, model.ErrTooLarge:
		return model.Errorf(kind, "%s", we.Message)
	}
	return model.Errorf(model.ErrUnavailable, "worker %s answered %s %s: %s", wid, we.Status, what, we.Message)
}

// ImportSandbox creates a sandbox from a checkpoint archive: it reads the
// archive's manifest, picks a worker that has the archive's template and
// runtime, streams the archive into that worker's snapshot store (which
// verifies every artifact) and records a pending sandbox that starts from
// it, with the archive's checkpoint listed under its name. On failure
// nothing is recorded and the worker drops what it received.
func (s *Service) ImportSandbox(ctx context.Context, p Principal, req CreateParams, archive io.Reader, idempotencyKey string) (model.Sandbox, model.Operation, error) {
	if err := s.requireSnapshots(ctx, p.OrgID); err != nil {
		return model.Sandbox{}, model.Operation{}, err
	}
	if req.Template != "" || req.Runtime != "" || req.Resources != (model.Resources{}) || req.FromCheckpoint != nil || req.Count != 0 {
		return model.Sandbox{}, model.Operation{}, model.Errorf(model.ErrUnprocessable, "an imported sandbox takes the template, runtime and resources of its archive; leave template, runtime, resources, from_checkpoint and count out")
	}
	if len(idempotencyKey) > MaxIdempotencyKey {
		return model.Sandbox{}, model.Operation{}, model.Errorf(model.ErrUnprocessable, "Idempotency-Key is longer than %d characters", MaxIdempotencyKey)
	}
	done, err := s.startTransfer(ctx, p.OrgID)
	if err != nil {
		return model.Sandbox{}, model.Operation{}, err
	}
	defer done()
	m, stream, err := s.peekManifest(ctx, p.OrgID, archive)
	if err != nil {
		return model.Sandbox{}, model.Operation{}, err
	}
	if m.Name != "" && !checkpointName.MatchString(m.Name) {
		return model.Sandbox{}, model.Operation{}, model.Errorf(model.ErrUnprocessable, "the archive's checkpoint name %.80q is invalid: a checkpoint name is 1-63 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit", m.Name)
	}
	rts, err := s.snapshotRuntimes(ctx)
	if err != nil {
		return model.Sandbox{}, model.Operation{}, err
	}
	if !slices.Contains(rts, m.Runtime) {
		return model.Sandbox{}, model.Operation{}, model.Errorf(model.ErrUnprocessable, "the archive was written by the %.80q runtime; imports work for the %s runtime only for now", m.Runtime, strings.Join(rts, ", "))
	}
	if m.TemplateDigest == "" {
		return model.Sandbox{}, model.Operation{}, model.Errorf(model.ErrUnprocessable, "the archive's manifest does not name the template it was taken on (template_digest); export it again with this version")
	}
	tpl, err := s.st.GetTemplateByDigest(ctx, m.TemplateDigest)
	if errors.Is(err, model.ErrNotFound) {
		return model.Sandbox{}, model.Operation{}, withHint(model.Errorf(model.ErrUnprocessable, "the archive was taken on template %.80q (%.80q), which this installation does not have", m.Template, m.TemplateDigest), Hint{Kind: HintListTemplates})
	}
	if err != nil {
		return model.Sandbox{}, model.Operation{}, fmt.Errorf("get template %s: %w", m.TemplateDigest, err)
	}
	sb, err := s.newSandbox(ctx, p, req)
	if err != nil {
		return model.Sandbox{}, model.Operation{}, err
	}
	ref, err := s.importTemplate(ctx, m.Template, tpl)
	if err != nil {
		return model.Sandbox{}, model.Operation{}, err
	}
	sb.ID = model.NewID("sb")
	sb.Template, sb.TemplateDigest, sb.Runtime = ref, tpl.Digest, m.Runtime
	sb.Resources = model.Resources{VCPUs: m.VCPUs, MemoryMiB: m.MemoryMiB}
	if sb.Resources.VCPUs < MinVCPUs || sb.Resources.VCPUs > MaxVCPUs || sb.Resources.MemoryMiB < MinMemoryMiB || sb.Resources.MemoryMiB > MaxMemoryMiB {
		return model.Sandbox{}, model.Operation{}, model.Errorf(model.ErrUnprocessable, "the archive's resources (%d vCPUs, %d MiB) are outside what a sandbox may have", m.VCPUs, m.MemoryMiB)
	}
	if err := s.admit(ctx, p.OrgID, sb.Resources, 1); err != nil {
		return model.Sandbox{}, model.Operation{}, err
	}
	workers, err := s.st.ListWorkers(ctx)
	if err != nil {
		return model.Sandbox{}, model.Operation{}, fmt.Errorf("list workers: %w", err)
	}
	sbs, err := store.ListAllSandboxes(ctx, s.st, store.SandboxFilter{})
	if err != nil {
		return model.Sandbox{}, model.Operation{}, fmt.Errorf("list sandboxes: %w", err)
	}
	wid, err := s.placer().Place(scheduler.Cluster{Workers: workers, Load: scheduler.LoadOf(sbs), Now: s.now()}, scheduler.RequestFor(sb))
	if err != nil {
		return model.Sandbox{}, model.Operation{}, model.Errorf(model.ErrUnavailable, "no worker can take the imported sandbox: %v", err)
	}
	var w model.Worker
	for _, x := range workers {
		if x.ID == wid {
			w = x
		}
	}
	got, err := s.sendArchive(ctx, w, sb, stream)
	if err != nil {
		return model.Sandbox{}, model.Operation{}, err
	}
	name := got.Name
	if name == "" || !checkpointName.MatchString(name) {
		name = "imported"
	}
	sb.Source = &model.Source{WorkerID: w.ID, SandboxID: sb.ID, Checkpoint: name, SnapshotID: got.ID}
	sb.Checkpoints = []model.Checkpoint{{Name: name, SnapshotID: got.ID, Bytes: got.Bytes, CreatedAt: s.now()}}
	op := s.createOp(sb, model.OpCreate)
	osb, oop, existed, err := s.st.CreateSandbox(ctx, sb, op, idempotencyKey)
	if err != nil || existed {
		s.dropSnapshots(w, sb)
	}
	if err != nil {
		return model.Sandbox{}, model.Operation{}, fmt.Errorf("create imported sandbox: %w", err)
	}
	if existed {
		osb, oop = s.current(ctx, osb, oop)
		return osb, oop, nil
	}
	s.publish(ctx, &osb, &oop)
	s.kick()
	return osb, oop, nil
}

// sendArchive streams an archive into worker w's snapshot store under
// sandbox sb and returns the committed manifest.
func (s *Service) sendArchive(ctx context.Context, w model.Worker, sb model.Sandbox, archive io.Reader) (snapshot.Manifest, error) {
	t, err := s.target(ctx, w, sb, token.Claims{Scope: token.ScopeSnapshot})
	if err != nil {
		return snapshot.Manifest{}, err
	}
	m, err := s.dataPlane().Import(ctx, t, sb.ID, archive)
	if err != nil {
		if ctx.Err() != nil {
			return snapshot.Manifest{}, fmt.Errorf("import: %w", ctx.Err())
		}
		return snapshot.Manifest{}, workerError(err, w.ID, "importing an archive")
	}
	return m, nil
}

// dropSnapshots asks worker w to delete what it holds for sandbox sb (an
// import that was not recorded). Best effort: workers also drop snapshots
// of sandboxes nobody assigned them (worker.OrphanSnapshotAge).
func (s *Service) dropSnapshots(w model.Worker, sb model.Sandbox) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t, err := s.target(ctx, w, sb, token.Claims{Scope: token.ScopeSnapshot})
	if err == nil {
		err = s.dataPlane().DropSnapshots(ctx, t, sb.ID)
	}
	if err != nil {
		s.logger().Warn("drop imported snapshot", "worker", w.ID, "sandbox", sb.ID, "err", err)
	}
}

// SettingExportKey is the store setting holding the base64 installation
// export key: the HMAC-SHA256 key that signs every exported checkpoint
// archive (snapshot.Sign). It is created on first use and never changes;
// installations that share it accept each other's archives.
const SettingExportKey = "checkpoint_export_key"

// exportKey returns the installation export key, creating it on first use.
func (s *Service) exportKey(ctx context.Context) ([]byte, error) {
	v, err := s.st.PutSettingIfAbsent(ctx, SettingExportKey, base64.StdEncoding.EncodeToString(newKey()))
	if err != nil {
		return nil, fmt.Errorf("store export key setting: %w", err)
	}
	k, err := base64.StdEncoding.DecodeString(v)
	if err != nil || len(k) < 16 {
		return nil, fmt.Errorf("decode export key setting %q: not base64 of at least 16 bytes", SettingExportKey)
	}
	return k, nil
}

// orgHas reports whether org orgID has feature gate f.
func (s *Service) orgHas(ctx context.Context, orgID, f string) (bool, error) {
	org, err := s.st.GetOrg(ctx, orgID)
	if errors.Is(err, model.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get org %s: %w", orgID, err)
	}
	return slices.Contains(org.Features, f), nil
}

// peekManifest reads the head of an archive to import (at most
// snapshot.MaxHeadBytes: the manifest, which must come first as a regular
// file, and its signature) and checks where it comes from: an archive
// signed with this installation's export key is accepted; one with any
// other signature never; an unsigned one only into an org with the
// model.FeatureUnsignedImports gate, because runsc restore parses the
// archive's runtime state, which gVisor does not document as untrusted
// input. It returns the manifest and the archive without its signature
// entry (what the worker's snapshot store takes).
func (s *Service) peekManifest(ctx context.Context, orgID string, archive io.Reader) (snapshot.Manifest, io.Reader, error) {
	h, err := snapshot.ReadHead(archive)
	if err != nil {
		return snapshot.Manifest{}, nil, withHint(model.Errorf(model.ErrUnprocessable, "the archive is not a checkpoint archive: %v", err), Hint{Kind: HintExportArchive})
	}
	if h.Signature == nil {
		trusted, err := s.orgHas(ctx, orgID, model.FeatureUnsignedImports)
		if err != nil {
			return snapshot.Manifest{}, nil, err
		}
		if !trusted {
			return snapshot.Manifest{}, nil, withHint(model.Errorf(model.ErrUnprocessable, "the archive is not signed by this installation (it has no %s after %s): importing unsigned archives needs the %q feature gate, which org %s does not have; import an archive exported by this installation, or ask an operator to grant the gate",
				snapshot.SignatureFile, snapshot.ManifestFile, model.FeatureUnsignedImports, orgID),
				Hint{Kind: HintGrantFeatures, OrgID: orgID, Features: []string{model.FeatureSnapshots, model.FeatureUnsignedImports}})
		}
		return h.Manifest, h.Unsigned(), nil
	}
	key, err := s.exportKey(ctx)
	if err != nil {
		return snapshot.Manifest{}, nil, err
	}
	if err := snapshot.Verify(key, h.ManifestBytes, h.Signature); err != nil {
		return snapshot.Manifest{}, nil, model.Errorf(model.ErrUnprocessable, "the archive's signature is not valid: it was not exported by this installation or was modified after export (%v); import an unmodified archive exported by this installation", err)
	}
	return h.Manifest, h.Unsigned(), nil
}

// maxTemplateRef bounds the template reference an imported manifest names.
const maxTemplateRef = 256

// importTemplate returns the template reference to record for an imported
// sandbox whose archive names ref and was taken on tpl: ref must be a
// reference a create request accepts (name, name:tag or sha256:<digest>,
// printable, at most maxTemplateRef characters); it is kept when it names
// tpl here, else the sandbox records tpl's digest.
func (s *Service) importTemplate(ctx context.Context, ref string, tpl model.Template) (string, error) {
	if ref == "" {
		return tpl.Digest, nil
	}
	if len(ref) > maxTemplateRef || strings.IndexFunc(ref, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
		return "", model.Errorf(model.ErrUnprocessable, "the archive's manifest names template %.80q, which is not a template reference (at most %d printable characters: name, name:tag or sha256:<digest>)", ref, maxTemplateRef)
	}
	t, got, err := s.resolveTemplate(ctx, ref)
	switch {
	case err == nil && t.Digest == tpl.Digest:
		return got, nil
	case err == nil, errors.Is(err, errTemplateNotFound):
		return tpl.Digest, nil // a valid reference that names another template here, or none
	case errors.Is(err, model.ErrUnprocessable):
		return "", model.Errorf(model.ErrUnprocessable, "the archive's manifest names template %q: %v", ref, err)
	}
	return "", err
}
