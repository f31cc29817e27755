package e2bcompat

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"maps"
	"net/http"
	"strconv"
	"strings"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
)

// E2B's persistent snapshots and forks, onto Airlock's checkpoints and
// forks (docs/e2b.md, "Snapshots and forks"):
//
//   - createSnapshot (POST /sandboxes/{id}/snapshots {name?}) writes a
//     checkpoint of the sandbox (named name, else snap-<random>) and answers
//     its snapshotID "<sandboxID>:<checkpoint>";
//   - Sandbox.create(snapshotID) forks a new sandbox from that checkpoint;
//   - listSnapshots (GET /snapshots) lists the org's checkpoints;
//   - deleteSnapshot (DELETE /templates/{snapshotID}) deletes one;
//   - fork (POST /sandboxes/{id}/fork {timeout?, count?}) checkpoints the
//     sandbox (e2b-fork-<random>) and forks count sandboxes from it.
//
// A checkpoint lives with its sandbox (on that sandbox's worker): unlike
// E2B's snapshots it goes when the sandbox is deleted.

// snapshotInfo is E2B's SnapshotInfo.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

// forkResult is E2B's SandboxForkResult: exactly one of the two is set.
type forkResult struct {
	Sandbox *sandboxJSON `json:"sandbox,omitempty"`
	Error   *errorBody   `json:"error,omitempty"`
}

// snapshotID is the E2B id of checkpoint name of sandbox sid.
func snapshotID(sid, name string) string { return sid + ":" + name }

// parseSnapshotID splits "<sandboxID>:<checkpoint>"; ok is false for
// anything else (a template name, "alias:tag").
func parseSnapshotID(id string) (sid, name string, ok bool) {
	if i := strings.LastIndex(id, "/"); i >= 0 {
		id = id[i+1:] // a team/ prefix, as templateRef strips it
	}
	sid, name, ok = strings.Cut(id, ":")
	if !ok || !strings.HasPrefix(sid, "sb-") || len(sid) <= 3 || name == "" {
		return "", "", false
	}
	return sid, name, true
}

// randomName is prefix followed by 8 random base32-ish characters.
func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + strings.ToLower(strings.TrimRight(base64.RawURLEncoding.EncodeToString(b[:]), "=")) // 8 chars
}

// checkpointNameOf turns an E2B snapshot name into a checkpoint name
// (lower-cased, as E2B canonicalizes names).
func checkpointNameOf(name string) (string, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	n = strings.ReplaceAll(n, "_", "-")
	if n == "" || len(n) > 63 || !isCheckpointName(n) {
		return "", badRequest("snapshot name %.80q: use 1-63 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit", name)
	}
	return n, nil
}

func isCheckpointName(n string) bool {
	for i, c := range n {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case (c == '.' || c == '-') && i > 0:
		default:
			return false
		}
	}
	return true
}

func (s *server) createSnapshot(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req struct {
		Name   string `json:"name"`
		Memory *bool  `json:"memory"`
	}
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Memory != nil && !*req.Memory {
		return notSupported("filesystem-only snapshots are not supported by Airlock (a snapshot is a checkpoint of memory, processes and files; leave mode out)")
	}
	id := r.PathValue("id")
	if _, err := s.visible(r.Context(), p, id); err != nil {
		return err
	}
	name := randomName("snap-")
	if req.Name != "" {
		var err error
		if name, err = checkpointNameOf(req.Name); err != nil {
			return err
		}
	}
	if err := s.checkpoint(r.Context(), p, id, name); err != nil {
		return err
	}
	sid := snapshotID(id, name)
	writeJSON(w, http.StatusCreated, snapshotInfo{SnapshotID: sid, Names: []string{sid}})
	return nil
}

// checkpoint writes checkpoint name of sandbox id and waits for it.
func (s *server) checkpoint(ctx context.Context, p service.Principal, id, name string) error {
	op, err := s.svc.CreateCheckpoint(ctx, p, id, name)
	if err != nil {
		return err
	}
	_, err = s.waitOp(ctx, p, op, "write a snapshot")
	return err
}

// listSnapshots serves GET /snapshots?sandboxID=&name=&limit=&nextToken=:
// the checkpoints of one sandbox, or of every sandbox of the org, oldest
// sandbox first; nextToken is a sandbox-list cursor, and a page holds the
// checkpoints of up to limit sandboxes.
func (s *server) listSnapshots(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	q := r.URL.Query()
	var name string
	if n := q.Get("name"); n != "" {
		var err error
		if name, err = checkpointNameOf(n); err != nil {
			return err
		}
	}
	out := []snapshotInfo{}
	add := func(sb model.Sandbox) {
		for _, cp := range sb.Checkpoints {
			if name == "" || cp.Name == name {
				id := snapshotID(sb.ID, cp.Name)
				out = append(out, snapshotInfo{SnapshotID: id, Names: []string{id}})
			}
		}
	}
	if sid := q.Get("sandboxID"); sid != "" {
		sb, err := s.visible(r.Context(), p, sid)
		if err != nil {
			return err
		}
		add(sb)
		writeJSON(w, http.StatusOK, out)
		return nil
	}
	f := service.ListParams{Cursor: q.Get("nextToken"), Limit: 100}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 {
			return badRequest("limit %q is not a positive number", l)
		}
		f.Limit = min(n, service.MaxListLimit)
	}
	sbs, next, err := s.svc.ListSandboxes(r.Context(), p, f)
	if err != nil {
		return err
	}
	for _, sb := range sbs {
		if e2bState(sb) != "" {
			add(sb)
		}
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// deleteTemplate serves DELETE /templates/{templateID}: deleteSnapshot
// for a snapshot id (204, 404 when gone); templates themselves are
// removed with `airlock template rm` (501).
func (s *server) deleteTemplate(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	sid, name, ok := parseSnapshotID(r.PathValue("templateID"))
	if !ok {
		return notSupported("deleting templates through the E2B API is not supported by Airlock (remove them with `airlock template rm`); snapshots (<sandboxID>:<name>) are deleted here")
	}
	if _, err := s.visible(r.Context(), p, sid); err != nil {
		return model.Errorf(model.ErrNotFound, "snapshot %s not found", r.PathValue("templateID"))
	}
	if err := s.svc.DeleteCheckpoint(r.Context(), p, sid, name); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// fork serves POST /sandboxes/{id}/fork {timeout?, count?}: a checkpoint
// of the sandbox (it keeps running), then count sandboxes from it, each
// waited for; 201 with one result per fork.
func (s *server) fork(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req struct {
		Timeout *int `json:"timeout"`
		Count   *int `json:"count"`
	}
	if err := decode(r, &req); err != nil {
		return err
	}
	count := 1
	if req.Count != nil {
		count = *req.Count
	}
	if count < 1 || count > service.MaxForks {
		return badRequest("count is %d; it must be between 1 and %d", count, service.MaxForks)
	}
	timeout, err := sandboxTimeout(req.Timeout)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	src, err := s.visible(r.Context(), p, id)
	if err != nil {
		return err
	}
	autoWake := !src.NoAutoWake
	cp := randomName("e2b-fork-")
	if err := s.checkpoint(r.Context(), p, id, cp); err != nil {
		return err
	}
	created, err := s.svc.ForkSandboxes(r.Context(), p, service.CreateParams{
		Env: src.Env, Metadata: src.Metadata, TimeoutS: timeout, OnExpiry: model.ExpiryDelete, PublicTraffic: src.PublicTraffic,
		AutoWake: &autoWake, FromCheckpoint: &service.CheckpointRef{SandboxID: id, Checkpoint: cp}, Count: count,
	}, r.Header.Get("Idempotency-Key"))
	if err != nil && len(created) == 0 {
		return err
	}
	out := make([]forkResult, 0, count)
	for _, c := range created {
		out = append(out, s.forkOutcome(r, p, c))
	}
	for len(out) < count { // ForkSandboxes stopped early: say why for the rest
		out = append(out, forkResult{Error: &errorBody{Code: http.StatusInternalServerError, Message: message(err)}})
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// forkOutcome waits for one fork to run and reports it.
func (s *server) forkOutcome(r *http.Request, p service.Principal, c service.Created) forkResult {
	sb, err := s.waitOp(r.Context(), p, c.Operation, "start")
	if err == nil {
		var out sandboxJSON
		if out, err = s.sandboxOut(r, sb); err == nil {
			return forkResult{Sandbox: &out}
		}
	}
	status := http.StatusInternalServerError
	var failed errFailed
	switch {
	case errors.As(err, &failed):
	case errors.Is(err, model.ErrUnavailable):
		status = http.StatusServiceUnavailable
	case errors.Is(err, model.ErrConflict):
		status = http.StatusConflict
	}
	return forkResult{Error: &errorBody{Code: status, Message: message(err)}}
}

// sandboxTimeout is a create's or fork's time to live in seconds:
// DefaultTimeout when t is nil, else *t, between 1 and MaxSandboxTimeout
// (compared in seconds, so no multiplication can overflow).
func sandboxTimeout(t *int) (int, error) {
	timeout := DefaultTimeout
	if t != nil {
		timeout = *t
	}
	if timeout <= 0 || int64(timeout) > int64(service.MaxSandboxTimeout.Seconds()) {
		return 0, badRequest("timeout is %d seconds; it must be between 1 and %d", timeout, int(service.MaxSandboxTimeout.Seconds()))
	}
	return timeout, nil
}

// createFromSnapshot is create for a templateID that is a snapshot id: a
// fork of that checkpoint with the request's settings.
func (s *server) createFromSnapshot(w http.ResponseWriter, r *http.Request, p service.Principal, sid, name string, params service.CreateParams) error {
	src, err := s.visible(r.Context(), p, sid)
	if err != nil {
		return model.Errorf(model.ErrNotFound, "snapshot %s not found: its sandbox is gone", snapshotID(sid, name))
	}
	// As a restored E2B snapshot keeps its envs: the source's, then the
	// request's on top.
	env := make(map[string]string, len(src.Env)+len(params.Env))
	maps.Copy(env, src.Env)
	maps.Copy(env, params.Env)
	params.Env = env
	params.Template = ""
	params.FromCheckpoint = &service.CheckpointRef{SandboxID: sid, Checkpoint: name}
	created, err := s.svc.ForkSandboxes(r.Context(), p, params, r.Header.Get("Idempotency-Key"))
	if err != nil {
		if errors.Is(err, model.ErrNotFound) {
			return model.Errorf(model.ErrNotFound, "snapshot %s not found", snapshotID(sid, name))
		}
		return err
	}
	sb, err := s.waitOp(r.Context(), p, created[0].Operation, "start")
	if err != nil {
		return err
	}
	out, err := s.sandboxOut(r, sb)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// E2B's secrets API (/secrets), onto the org's secrets: the ones the
// egress gateway injects into intercepted requests as network policies'
// inject rules say (docs/network.md). A secret's id is "sec_<name>";
// values are write-only; metadata and versions are not kept (metadata is
// always {}, currentVersion 1). Setting and removing need an admin key.

// secretJSON is E2B's Secret.
type secretJSON struct {
	SecretID       string            `json:"secretID"`
	Name           string            `json:"name"`
	Metadata       map[string]string `json:"metadata"`
	CurrentVersion int64             `json:"currentVersion"`
	CreatedAt      string            `json:"createdAt"`
	UpdatedAt      string            `json:"updatedAt"`
}

const secretIDPrefix = "sec_"

func secretOut(sec model.Secret) secretJSON {
	return secretJSON{SecretID: secretIDPrefix + sec.Name, Name: sec.Name, Metadata: map[string]string{}, CurrentVersion: 1,
		CreatedAt: sec.CreatedAt.UTC().Format(rfc3339ms), UpdatedAt: sec.UpdatedAt.UTC().Format(rfc3339ms)}
}

const rfc3339ms = "2006-01-02T15:04:05.000Z07:00"

// secretName is the Airlock name of an E2B secret id (or name).
func secretName(id string) string {
	return strings.ToLower(strings.TrimPrefix(id, secretIDPrefix))
}

func noSecretMetadata(md map[string]string) error {
	if len(md) > 0 {
		return notSupported("secret metadata is not supported by Airlock (leave metadata out)")
	}
	return nil
}

func (s *server) findSecret(ctx context.Context, p service.Principal, name string) (model.Secret, error) {
	list, err := s.svc.ListSecrets(ctx, p)
	if err != nil {
		return model.Secret{}, err
	}
	for _, sec := range list {
		if sec.Name == name {
			return sec, nil
		}
	}
	return model.Secret{}, model.Errorf(model.ErrNotFound, "secret %s not found", secretIDPrefix+name)
}

func (s *server) createSecret(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req struct {
		Name     string            `json:"name"`
		Value    string            `json:"value"`
		Metadata map[string]string `json:"metadata"`
	}
	if err := decode(r, &req); err != nil {
		return err
	}
	if err := noSecretMetadata(req.Metadata); err != nil {
		return err
	}
	name := strings.ToLower(req.Name)
	if strings.HasPrefix(name, secretIDPrefix) {
		return badRequest("secret name %.80q: the %s prefix is reserved for secret ids", req.Name, secretIDPrefix)
	}
	if _, err := s.findSecret(r.Context(), p, name); err == nil {
		return model.Errorf(model.ErrConflict, "secret %q already exists; update it with POST /secrets/%s%s", name, secretIDPrefix, name)
	}
	sec, err := s.svc.PutSecret(r.Context(), p, name, req.Value)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, secretOut(sec))
	return nil
}

func (s *server) listSecrets(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	list, err := s.svc.ListSecrets(r.Context(), p)
	if err != nil {
		return err
	}
	out := make([]secretJSON, 0, len(list))
	for _, sec := range list {
		out = append(out, secretOut(sec))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *server) getSecret(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	sec, err := s.findSecret(r.Context(), p, secretName(r.PathValue("secretID")))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, secretOut(sec))
	return nil
}

func (s *server) updateSecret(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req struct {
		Value    *string           `json:"value"`
		Metadata map[string]string `json:"metadata"`
	}
	if err := decode(r, &req); err != nil {
		return err
	}
	if err := noSecretMetadata(req.Metadata); err != nil {
		return err
	}
	if req.Value == nil {
		return badRequest("value is required")
	}
	name := secretName(r.PathValue("secretID"))
	if _, err := s.findSecret(r.Context(), p, name); err != nil {
		return err
	}
	sec, err := s.svc.PutSecret(r.Context(), p, name, *req.Value)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, secretOut(sec))
	return nil
}

func (s *server) deleteSecret(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	name := secretName(r.PathValue("secretID"))
	if err := s.svc.DeleteSecret(r.Context(), p, name); err != nil {
		if errors.Is(err, model.ErrNotFound) {
			return model.Errorf(model.ErrNotFound, "secret %s not found", secretIDPrefix+name)
		}
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
