package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

// SessionTTL is how long command and files tokens stay valid.
const SessionTTL = time.Hour

// Limits on command requests.
const (
	MaxArgs     = 4096
	MaxCmdBytes = 256 << 10
	// MaxCommandBytes bounds a command's spec as its token carries it (JSON),
	// so that every token fits the worker's 1 MiB header limit.
	MaxCommandBytes = 384 << 10
)

// runningSandbox returns the caller's sandbox and the worker serving it, or
// model.ErrConflict if it is not running. With wake set, a paused or suspended
// sandbox (or one on its way there or back) is woken first unless it opted
// out of auto-wake; the session is returned at once and the worker waits for
// the sandbox to run before serving it.
func (s *Service) runningSandbox(ctx context.Context, p Principal, id, what string, wake bool) (model.Sandbox, model.Worker, error) {
	sb, err := s.GetSandbox(ctx, p, id)
	if err != nil {
		return model.Sandbox{}, model.Worker{}, err
	}
	switch sb.State {
	case model.StatePaused, model.StateSuspended, model.StateSuspending, model.StateWaking:
		if wake && sb.DesiredState != model.StateDeleted {
			if err := s.autoWake(ctx, sb, what); err != nil {
				return model.Sandbox{}, model.Worker{}, err
			}
			sb.State = model.StateRunning // for the checks below: it is on its way
		}
	}
	if sb.State != model.StateRunning || sb.DesiredState == model.StateDeleted {
		state := string(sb.State)
		if sb.State == model.StateRunning {
			state = "being deleted"
		}
		return model.Sandbox{}, model.Worker{}, model.Errorf(model.ErrConflict, "sandbox %s is %s; %s need a running sandbox", id, state, what)
	}
	if sb.WorkerID == "" {
		return model.Sandbox{}, model.Worker{}, model.Errorf(model.ErrUnavailable, "sandbox %s is running but has no worker; retry shortly", id)
	}
	w, err := s.workerOf(ctx, sb)
	if err != nil {
		return model.Sandbox{}, model.Worker{}, err
	}
	return sb, w, nil
}

// workerOf returns the registered worker of a placed sandbox.
func (s *Service) workerOf(ctx context.Context, sb model.Sandbox) (model.Worker, error) {
	if sb.WorkerID == "" {
		return model.Worker{}, model.Errorf(model.ErrConflict, "sandbox %s is not placed on a worker yet; retry when it is running", sb.ID)
	}
	w, err := s.st.GetWorker(ctx, sb.WorkerID)
	if errors.Is(err, model.ErrNotFound) {
		return model.Worker{}, model.Errorf(model.ErrUnavailable, "worker %s of sandbox %s is not registered; retry shortly", sb.WorkerID, sb.ID)
	}
	if err != nil {
		return model.Worker{}, fmt.Errorf("get worker %s: %w", sb.WorkerID, err)
	}
	if w.DataPlaneURL == "" {
		return model.Worker{}, model.Errorf(model.ErrUnavailable, "worker %s has no data-plane URL", w.ID)
	}
	return w, nil
}

// target is worker w's data plane for one call about sandbox sb,
// authorized by a one-minute token with claims c (the sandbox, its org, the
// worker and the expiry filled in; signed with w's own key).
func (s *Service) target(ctx context.Context, w model.Worker, sb model.Sandbox, c token.Claims) (workerapi.Target, error) {
	c.SandboxID, c.OrgID, c.Worker, c.Expires = sb.ID, sb.OrgID, w.ID, s.now().Add(time.Minute).Unix()
	tok, err := s.sign(ctx, c)
	if err != nil {
		return workerapi.Target{}, err
	}
	return workerapi.Target{Worker: w.ID, URL: w.DataPlaneURL, Token: tok}, nil
}

// CreateCommand prepares a command session on a running sandbox: it returns
// the command's id, the worker's WebSocket attach URL and a token carrying
// the signed command spec. The process starts when the client first attaches.
func (s *Service) CreateCommand(ctx context.Context, p Principal, sandboxID string, req CommandParams) (CommandSession, error) {
	var argv []string
	switch {
	case req.Cmd != "" && len(req.Argv) > 0:
		return CommandSession{}, model.Errorf(model.ErrUnprocessable, "set either cmd or argv, not both")
	case req.Cmd != "":
		if len(req.Cmd) > MaxCmdBytes {
			return CommandSession{}, model.Errorf(model.ErrUnprocessable, "cmd is %d bytes; at most %d are allowed", len(req.Cmd), MaxCmdBytes)
		}
		argv = []string{"/bin/bash", "-lc", req.Cmd}
	case len(req.Argv) > 0:
		if len(req.Argv) > MaxArgs {
			return CommandSession{}, model.Errorf(model.ErrUnprocessable, "argv has %d elements; at most %d are allowed", len(req.Argv), MaxArgs)
		}
		if req.Argv[0] == "" {
			return CommandSession{}, model.Errorf(model.ErrUnprocessable, "argv[0] is empty; name the program to run")
		}
		argv = req.Argv
	}
	for _, a := range argv {
		if strings.ContainsRune(a, 0) {
			return CommandSession{}, model.Errorf(model.ErrUnprocessable, "argv contains NUL")
		}
	}
	if err := validateEnv("env", req.Env); err != nil {
		return CommandSession{}, err
	}
	if req.TimeoutS < 0 {
		return CommandSession{}, model.Errorf(model.ErrUnprocessable, "timeout_s is %d; it must be 0 (no limit) or more", req.TimeoutS)
	}
	if strings.ContainsRune(req.Cwd, 0) || strings.ContainsRune(req.User, 0) {
		return CommandSession{}, model.Errorf(model.ErrUnprocessable, "cwd and user must not contain NUL")
	}
	pty := req.PTY
	if pty != nil {
		if err := (agentapi.PTYSize{Cols: pty.Cols, Rows: pty.Rows}).Validate(); err != nil {
			return CommandSession{}, model.Errorf(model.ErrUnprocessable, "%v", err)
		}
	}
	sb, w, err := s.runningSandbox(ctx, p, sandboxID, "commands", true)
	if err != nil {
		return CommandSession{}, err
	}
	if len(argv) == 0 {
		// Neither: the template's own command, an imported image's
		// Entrypoint and Cmd (as `docker run IMAGE` runs them).
		if t, err := s.st.GetTemplateByDigest(ctx, sb.TemplateDigest); err == nil && t.Config != nil {
			argv = append(append([]string(nil), t.Config.Entrypoint...), t.Config.Cmd...)
		}
		if len(argv) == 0 {
			return CommandSession{}, model.Errorf(model.ErrUnprocessable, "set cmd (run by /bin/bash -lc) or argv (the sandbox's template has no Entrypoint or Cmd to run instead)")
		}
	}
	// The sandbox's env is not in the token: the worker has it from the
	// sandbox's assignment and merges it under the command's. Its digest
	// is, so that the worker waits for the assignment of a sandbox just
	// claimed from a warm pool (the claim sets its env).
	spec := model.CommandSpec{
		ID: model.NewID("cmd"), SandboxID: sb.ID, Argv: argv, Env: req.Env, Cwd: req.Cwd,
		User: req.User, Stdin: req.Stdin || pty != nil, TimeoutS: req.TimeoutS, SandboxEnv: model.EnvDigest(sb.Env),
		PTY: pty,
	}
	if enc, err := json.Marshal(spec); err != nil {
		return CommandSession{}, fmt.Errorf("encode command: %w", err)
	} else if len(enc) > MaxCommandBytes {
		return CommandSession{}, model.Errorf(model.ErrUnprocessable, "the command (argv or cmd, env, cwd and user) is %d bytes encoded; at most %d are allowed; pass large input on stdin or as a file", len(enc), MaxCommandBytes)
	}
	exp := s.now().Add(SessionTTL).Truncate(time.Second)
	tok, err := s.sign(ctx, token.Claims{SandboxID: sb.ID, OrgID: sb.OrgID, Scope: token.ScopeCommand, Command: &spec, Expires: exp.Unix(), Worker: w.ID})
	if err != nil {
		return CommandSession{}, err
	}
	attach, err := wsURL(w.DataPlaneURL, workerapi.AttachPath(sb.ID, spec.ID))
	if err != nil {
		return CommandSession{}, err
	}
	s.touch(ctx, sb.ID)
	return CommandSession{ID: spec.ID, AttachURL: attach, Token: tok, ExpiresAt: exp}, nil
}

// ListCommands asks the sandbox's worker for one page of the processes
// started in it: at most limit (0: the worker's page size,
// agentapi.MaxPageEntries) from cursor ("" for the first page). next is
// the cursor of the following page, "" after the last.
func (s *Service) ListCommands(ctx context.Context, p Principal, sandboxID string, limit int, cursor string) (_ []agentapi.ProcessInfo, next string, _ error) {
	if limit < 0 || limit > agentapi.MaxPageEntries {
		return nil, "", model.Errorf(model.ErrUnprocessable, "limit %d is out of range: ask for 1 to %d commands (0 or none: %d)", limit, agentapi.MaxPageEntries, agentapi.MaxPageEntries)
	}
	if len(cursor) > 1024 {
		return nil, "", model.Errorf(model.ErrUnprocessable, "cursor is %d bytes: pass the next_cursor of the previous page as it came", len(cursor))
	}
	sb, w, err := s.runningSandbox(ctx, p, sandboxID, "commands", false)
	if err != nil {
		return nil, "", err
	}
	t, err := s.target(ctx, w, sb, token.Claims{Scope: token.ScopeFiles})
	if err != nil {
		return nil, "", err
	}
	out, err := s.dataPlane().ListCommands(ctx, t, sb.ID, limit, cursor)
	if errors.Is(err, model.ErrInvalid) && cursor != "" {
		// The worker refuses a cursor it did not hand out.
		return nil, "", model.Errorf(model.ErrUnprocessable, "cursor %q is not one this sandbox handed out: pass the next_cursor of the previous page, or none for the first page", cursor)
	}
	if err != nil {
		return nil, "", workerError(err, w.ID, "listing commands of "+sb.ID)
	}
	if out.Commands == nil {
		out.Commands = []agentapi.ProcessInfo{}
	}
	s.touch(ctx, sb.ID)
	return out.Commands, out.NextCursor, nil
}

// FilesSession returns the data-plane URL for the sandbox's files and a
// files-scoped token for it.
func (s *Service) FilesSession(ctx context.Context, p Principal, sandboxID string) (FilesSession, error) {
	sb, w, err := s.runningSandbox(ctx, p, sandboxID, "file operations", true)
	if err != nil {
		return FilesSession{}, err
	}
	exp := s.now().Add(SessionTTL).Truncate(time.Second)
	tok, err := s.sign(ctx, token.Claims{SandboxID: sb.ID, OrgID: sb.OrgID, Scope: token.ScopeFiles, Expires: exp.Unix(), Worker: w.ID})
	if err != nil {
		return FilesSession{}, err
	}
	s.touch(ctx, sb.ID)
	return FilesSession{
		URL:   strings.TrimRight(w.DataPlaneURL, "/") + workerapi.FilesPath(sb.ID),
		Token: tok, ExpiresAt: exp,
	}, nil
}

func (s *Service) sign(ctx context.Context, c token.Claims) (string, error) {
	key, err := s.signingKey(ctx)
	if err != nil {
		return "", err
	}
	tok, err := token.Sign(key, c)
	if err != nil {
		return "", fmt.Errorf("sign %s token: %w", c.Scope, err)
	}
	return tok, nil
}

func (s *Service) touch(ctx context.Context, id string) {
	if err := s.st.TouchSandbox(ctx, id, s.now()); err != nil {
		s.logger().Warn("touch sandbox", "sandbox", id, "err", err)
	}
}

// wsURL turns an http(s) base URL into the ws(s) URL of path.
func wsURL(base, path string) (string, error) {
	u, err := url.Parse(strings.TrimRight(base, "/") + path)
	if err != nil {
		return "", fmt.Errorf("parse data-plane URL %q: %w", base, err)
	}
	switch u.Scheme {
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	}
	return u.String(), nil
}
