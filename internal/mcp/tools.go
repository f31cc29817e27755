package mcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/model"
)

// Bounds of what a tool returns.
const (
	MaxOutputBytes   = 64 << 10 // run_command keeps this much of stdout and of stderr
	MaxReadFileBytes = 1 << 20  // read_file refuses larger files
	DefaultTimeoutS  = 60       // run_command's default timeout
	MaxListEntries   = 1000     // list_files returns at most this many entries
)

// Sandbox is a sandbox as the tools return it.
type Sandbox struct {
	ID        string            `json:"id" jsonschema:"the sandbox id (sb-…)"`
	State     string            `json:"state" jsonschema:"pending, starting, running, paused, suspending, suspended, waking, deleting, deleted or failed"`
	Template  string            `json:"template,omitempty"`
	Runtime   string            `json:"runtime,omitempty"`
	Reason    string            `json:"reason,omitempty" jsonschema:"why the sandbox is in its state (e.g. failed)"`
	VCPUs     int               `json:"vcpus,omitempty"`
	MemoryMiB int               `json:"memory_mib,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	CreatedAt string            `json:"created_at,omitempty"`
	ExpiresAt string            `json:"expires_at,omitempty"`
}

func toSandbox(sb model.Sandbox) Sandbox {
	out := Sandbox{
		ID: sb.ID, State: string(sb.State), Template: sb.Template, Runtime: sb.Runtime, Reason: sb.Reason,
		VCPUs: sb.Resources.VCPUs, MemoryMiB: sb.Resources.MemoryMiB,
	}
	if len(sb.Metadata) > 0 {
		out.Metadata = sb.Metadata
	}
	if !sb.CreatedAt.IsZero() {
		out.CreatedAt = sb.CreatedAt.UTC().Format(time.RFC3339)
	}
	if sb.ExpiresAt != nil {
		out.ExpiresAt = sb.ExpiresAt.UTC().Format(time.RFC3339)
	}
	return out
}

// Inputs and outputs.
type (
	CreateSandboxInput struct {
		Template  string            `json:"template,omitempty" jsonschema:"template name[:tag] or digest (default: base)"`
		Metadata  map[string]string `json:"metadata,omitempty" jsonschema:"metadata key/value pairs, for finding the sandbox again with list_sandboxes"`
		Env       map[string]string `json:"env,omitempty" jsonschema:"environment variables for every command in the sandbox"`
		VCPUs     int               `json:"vcpus,omitempty" jsonschema:"virtual CPUs (0 or absent: the server's default)"`
		MemoryMiB int               `json:"memory_mib,omitempty" jsonschema:"memory in MiB (0 or absent: the server's default)"`
		TimeoutS  int               `json:"timeout_s,omitempty" jsonschema:"delete the sandbox after this many seconds (0 or absent: never)"`
	}
	SandboxIDInput struct {
		SandboxID string `json:"sandbox_id" jsonschema:"the sandbox id (sb-…)"`
	}
	ListSandboxesInput struct {
		State    []string          `json:"state,omitempty" jsonschema:"only sandboxes in one of these states (e.g. running, paused, suspended)"`
		Metadata map[string]string `json:"metadata,omitempty" jsonschema:"only sandboxes whose metadata has all these key/value pairs"`
	}
	ListSandboxesOutput struct {
		Sandboxes []Sandbox `json:"sandboxes"`
	}
	DeleteOutput struct {
		ID      string `json:"id"`
		Deleted bool   `json:"deleted"`
	}
	RunCommandInput struct {
		SandboxID string            `json:"sandbox_id" jsonschema:"the sandbox id (sb-…)"`
		Cmd       string            `json:"cmd,omitempty" jsonschema:"a shell command line, run by /bin/bash -lc (give cmd or argv, not both)"`
		Argv      []string          `json:"argv,omitempty" jsonschema:"the program and its arguments, run without a shell (give cmd or argv, not both)"`
		Cwd       string            `json:"cwd,omitempty" jsonschema:"working directory (default: the sandbox user's home)"`
		Env       map[string]string `json:"env,omitempty" jsonschema:"extra environment variables for this command"`
		Stdin     string            `json:"stdin,omitempty" jsonschema:"text sent to the command's standard input (then closed)"`
		TimeoutS  int               `json:"timeout_s,omitempty" jsonschema:"kill the command after this many seconds (default 60)"`
	}
	RunCommandOutput struct {
		ExitCode        int    `json:"exit_code" jsonschema:"the exit status; -1 if killed by a signal"`
		Stdout          string `json:"stdout"`
		Stderr          string `json:"stderr"`
		StdoutTruncated bool   `json:"stdout_truncated,omitempty" jsonschema:"stdout was longer than 64 KiB and was cut"`
		StderrTruncated bool   `json:"stderr_truncated,omitempty" jsonschema:"stderr was longer than 64 KiB and was cut"`
		TimedOut        bool   `json:"timed_out" jsonschema:"the command was killed at its timeout"`
		Signal          string `json:"signal,omitempty" jsonschema:"the signal that killed it, e.g. KILL"`
		Error           string `json:"error,omitempty" jsonschema:"why the command could not run (e.g. program not found)"`
	}
	PathInput struct {
		SandboxID string `json:"sandbox_id" jsonschema:"the sandbox id (sb-…)"`
		Path      string `json:"path" jsonschema:"absolute path inside the sandbox"`
	}
	ReadFileOutput struct {
		Path    string `json:"path"`
		Size    int    `json:"size"`
		Content string `json:"content"`
	}
	WriteFileInput struct {
		SandboxID string `json:"sandbox_id" jsonschema:"the sandbox id (sb-…)"`
		Path      string `json:"path" jsonschema:"absolute path inside the sandbox; parent directories are created and the file is replaced"`
		Content   string `json:"content" jsonschema:"the file's new content (text)"`
	}
	FileEntry struct {
		Name    string `json:"name"`
		Path    string `json:"path"`
		Type    string `json:"type" jsonschema:"file, dir, symlink or other"`
		Size    int64  `json:"size"`
		Mode    string `json:"mode,omitempty"`
		ModTime string `json:"mod_time,omitempty"`
		Target  string `json:"target,omitempty" jsonschema:"a symlink's target"`
	}
	WriteFileOutput struct {
		Path string `json:"path"`
		Size int64  `json:"size"`
	}
	ListFilesOutput struct {
		Path      string      `json:"path"`
		Entries   []FileEntry `json:"entries"`
		Truncated bool        `json:"truncated,omitempty" jsonschema:"more than 1000 entries; only the first 1000 are listed"`
	}
	CheckpointInput struct {
		SandboxID string `json:"sandbox_id" jsonschema:"the sandbox id (sb-…)"`
		Name      string `json:"name" jsonschema:"checkpoint name: 1-63 of a-z, 0-9, '.', '_', '-', starting with a letter or digit; unique in the sandbox"`
	}
	CheckpointOutput struct {
		SandboxID  string `json:"sandbox_id"`
		Checkpoint string `json:"checkpoint"`
		State      string `json:"state" jsonschema:"the sandbox's state afterwards"`
	}
	RollbackInput struct {
		SandboxID  string `json:"sandbox_id" jsonschema:"the sandbox id (sb-…)"`
		Checkpoint string `json:"checkpoint" jsonschema:"name of a checkpoint of this sandbox"`
	}
	ForkInput struct {
		SandboxID  string `json:"sandbox_id" jsonschema:"the sandbox whose checkpoint the forks start from"`
		Checkpoint string `json:"checkpoint" jsonschema:"name of a checkpoint of that sandbox"`
		Count      int    `json:"count,omitempty" jsonschema:"how many sandboxes to create (default 1)"`
	}
	ForkOutput struct {
		Sandboxes []Sandbox `json:"sandboxes"`
	}
)

func (s *server) register(srv *mcp.Server) {
	mcp.AddTool(srv, &mcp.Tool{Name: "create_sandbox", Description: "Create a sandbox (an isolated Linux machine) and wait until it runs. Returns its id and state; pass the id to the other tools. Delete it with delete_sandbox when done."}, s.createSandbox)
	mcp.AddTool(srv, &mcp.Tool{Name: "list_sandboxes", Description: "List the sandboxes of this API key's org, optionally only those in some states or with some metadata."}, s.listSandboxes)
	mcp.AddTool(srv, &mcp.Tool{Name: "get_sandbox", Description: "Describe one sandbox: state, template, resources, metadata."}, s.getSandbox)
	mcp.AddTool(srv, &mcp.Tool{Name: "delete_sandbox", Description: "Delete a sandbox and wait until it is gone. Its files and processes are lost."}, s.deleteSandbox)
	mcp.AddTool(srv, &mcp.Tool{Name: "run_command", Description: "Run a command in a sandbox and wait for it to end. Returns exit_code, stdout and stderr (each cut at 64 KiB, with a note) and timed_out. A non-zero exit code is a result, not a tool error."}, s.runCommand)
	mcp.AddTool(srv, &mcp.Tool{Name: "read_file", Description: "Read a text file (UTF-8, at most 1 MiB) from a sandbox. For binary or larger files, use run_command (e.g. head, base64)."}, s.readFile)
	mcp.AddTool(srv, &mcp.Tool{Name: "write_file", Description: "Write a text file in a sandbox, creating parent directories and replacing the file."}, s.writeFile)
	mcp.AddTool(srv, &mcp.Tool{Name: "list_files", Description: "List a directory in a sandbox (name, type, size, mode, modification time)."}, s.listFiles)
	s.lifecycleTool(srv, "pause_sandbox", "Pause a running sandbox (frozen in memory; resume_sandbox or wake_sandbox continues it).", (*client.Client).PauseSandbox)
	s.lifecycleTool(srv, "resume_sandbox", "Resume a paused sandbox.", (*client.Client).ResumeSandbox)
	s.lifecycleTool(srv, "suspend_sandbox", "Suspend a running or paused sandbox to a snapshot on disk, releasing its memory (wake_sandbox restores it).", (*client.Client).SuspendSandbox)
	s.lifecycleTool(srv, "wake_sandbox", "Wake a suspended sandbox (or resume a paused one) and wait until it runs.", (*client.Client).WakeSandbox)
	mcp.AddTool(srv, &mcp.Tool{Name: "checkpoint_sandbox", Description: "Take a named checkpoint of a running or paused sandbox (memory, processes, files); it keeps running. Needs a runtime and org with snapshots."}, s.checkpoint)
	mcp.AddTool(srv, &mcp.Tool{Name: "rollback_sandbox", Description: "Put a sandbox back to one of its checkpoints (memory, processes and files); it is running afterwards."}, s.rollback)
	mcp.AddTool(srv, &mcp.Tool{Name: "fork_sandbox", Description: "Create count new sandboxes that start from a checkpoint of a sandbox, and wait until they run."}, s.fork)
}

// text is the human-readable content of a result beside its structured
// content.
func text(format string, args ...any) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(format, args...)}}}
}

func needID(id string) error {
	if strings.TrimSpace(id) == "" {
		return errors.New("sandbox_id is required (an id such as sb-…, from create_sandbox or list_sandboxes)")
	}
	return nil
}

// wait waits for op and returns the sandbox as it is afterwards.
func wait(ctx context.Context, c *client.Client, op model.Operation, what string) (model.Sandbox, error) {
	if _, err := c.WaitOperation(ctx, op.ID); err != nil {
		return model.Sandbox{}, fmt.Errorf("%s: %w", what, err)
	}
	sb, err := c.GetSandbox(ctx, op.SandboxID)
	if err != nil {
		return model.Sandbox{}, fmt.Errorf("%s: %w", what, err)
	}
	return sb, nil
}

func (s *server) createSandbox(ctx context.Context, req *mcp.CallToolRequest, in CreateSandboxInput) (*mcp.CallToolResult, Sandbox, error) {
	c, err := s.client(req)
	if err != nil {
		return nil, Sandbox{}, err
	}
	tmpl := in.Template
	if tmpl == "" {
		tmpl = "base"
	}
	sb, op, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{
		Template: tmpl, Env: in.Env, Metadata: in.Metadata, TimeoutS: in.TimeoutS,
		Resources: model.Resources{VCPUs: in.VCPUs, MemoryMiB: in.MemoryMiB},
	}, "")
	if err != nil {
		return nil, Sandbox{}, fmt.Errorf("create sandbox: %w", err)
	}
	if op.ID != "" {
		if sb, err = wait(ctx, c, op, "create sandbox "+sb.ID); err != nil {
			return nil, Sandbox{}, err
		}
	}
	out := toSandbox(sb)
	return text("sandbox %s is %s (template %s)", out.ID, out.State, out.Template), out, nil
}

func (s *server) listSandboxes(ctx context.Context, req *mcp.CallToolRequest, in ListSandboxesInput) (*mcp.CallToolResult, ListSandboxesOutput, error) {
	c, err := s.client(req)
	if err != nil {
		return nil, ListSandboxesOutput{}, err
	}
	f := client.SandboxFilter{Metadata: in.Metadata}
	for _, st := range in.State {
		f.States = append(f.States, model.SandboxState(st))
	}
	out := ListSandboxesOutput{Sandboxes: []Sandbox{}}
	for {
		page, err := c.ListSandboxes(ctx, f)
		if err != nil {
			return nil, ListSandboxesOutput{}, fmt.Errorf("list sandboxes: %w", err)
		}
		for _, sb := range page.Sandboxes {
			out.Sandboxes = append(out.Sandboxes, toSandbox(sb))
		}
		if page.NextCursor == "" || page.NextCursor == f.Cursor {
			break
		}
		f.Cursor = page.NextCursor
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d sandboxes", len(out.Sandboxes))
	for _, sb := range out.Sandboxes {
		fmt.Fprintf(&b, "\n%s %s %s", sb.ID, sb.State, sb.Template)
	}
	return text("%s", b.String()), out, nil
}

func (s *server) getSandbox(ctx context.Context, req *mcp.CallToolRequest, in SandboxIDInput) (*mcp.CallToolResult, Sandbox, error) {
	if err := needID(in.SandboxID); err != nil {
		return nil, Sandbox{}, err
	}
	c, err := s.client(req)
	if err != nil {
		return nil, Sandbox{}, err
	}
	sb, err := c.GetSandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, Sandbox{}, fmt.Errorf("get sandbox %s: %w", in.SandboxID, err)
	}
	out := toSandbox(sb)
	return text("sandbox %s is %s (template %s)", out.ID, out.State, out.Template), out, nil
}

func (s *server) deleteSandbox(ctx context.Context, req *mcp.CallToolRequest, in SandboxIDInput) (*mcp.CallToolResult, DeleteOutput, error) {
	if err := needID(in.SandboxID); err != nil {
		return nil, DeleteOutput{}, err
	}
	c, err := s.client(req)
	if err != nil {
		return nil, DeleteOutput{}, err
	}
	op, err := c.DeleteSandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, DeleteOutput{}, fmt.Errorf("delete sandbox %s: %w", in.SandboxID, err)
	}
	if op.ID != "" {
		if _, err := c.WaitOperation(ctx, op.ID); err != nil {
			return nil, DeleteOutput{}, fmt.Errorf("delete sandbox %s: %w", in.SandboxID, err)
		}
	}
	return text("sandbox %s deleted", in.SandboxID), DeleteOutput{ID: in.SandboxID, Deleted: true}, nil
}

func (s *server) lifecycleTool(srv *mcp.Server, name, desc string, call func(*client.Client, context.Context, string) (model.Operation, error)) {
	verb := strings.TrimSuffix(name, "_sandbox")
	mcp.AddTool(srv, &mcp.Tool{Name: name, Description: desc + " Waits until it is done; returns the sandbox's id and state."},
		func(ctx context.Context, req *mcp.CallToolRequest, in SandboxIDInput) (*mcp.CallToolResult, Sandbox, error) {
			if err := needID(in.SandboxID); err != nil {
				return nil, Sandbox{}, err
			}
			c, err := s.client(req)
			if err != nil {
				return nil, Sandbox{}, err
			}
			op, err := call(c, ctx, in.SandboxID)
			if err != nil {
				return nil, Sandbox{}, fmt.Errorf("%s sandbox %s: %w", verb, in.SandboxID, err)
			}
			sb, err := wait(ctx, c, op, verb+" sandbox "+in.SandboxID)
			if err != nil {
				return nil, Sandbox{}, err
			}
			out := toSandbox(sb)
			return text("sandbox %s is %s", out.ID, out.State), out, nil
		})
}

// capWriter keeps the first max bytes written to it and counts the rest.
type capWriter struct {
	buf     bytes.Buffer
	max     int
	dropped int64
}

func (w *capWriter) Write(p []byte) (int, error) {
	if room := w.max - w.buf.Len(); room > 0 {
		n := min(room, len(p))
		w.buf.Write(p[:n])
		w.dropped += int64(len(p) - n)
	} else {
		w.dropped += int64(len(p))
	}
	return len(p), nil
}

// String returns the kept text (invalid UTF-8 replaced, as JSON would) and,
// if some was dropped, a note saying how much.
func (w *capWriter) String() string {
	s := strings.ToValidUTF8(w.buf.String(), "\uFFFD")
	if w.dropped > 0 {
		s += fmt.Sprintf("\n[… output truncated: %d more bytes not shown (kept the first %d KiB); redirect to a file and read parts of it]", w.dropped, w.max>>10)
	}
	return s
}

func (s *server) runCommand(ctx context.Context, req *mcp.CallToolRequest, in RunCommandInput) (*mcp.CallToolResult, RunCommandOutput, error) {
	if err := needID(in.SandboxID); err != nil {
		return nil, RunCommandOutput{}, err
	}
	if (in.Cmd == "") == (len(in.Argv) == 0) {
		return nil, RunCommandOutput{}, errors.New("give exactly one of cmd (a shell command line) and argv (a program and its arguments)")
	}
	if in.TimeoutS < 0 {
		return nil, RunCommandOutput{}, errors.New("timeout_s must be positive")
	}
	timeout := in.TimeoutS
	if timeout == 0 {
		timeout = DefaultTimeoutS
	}
	c, err := s.client(req)
	if err != nil {
		return nil, RunCommandOutput{}, err
	}
	cs, err := c.CreateCommand(ctx, in.SandboxID, client.CreateCommandRequest{
		Cmd: in.Cmd, Argv: in.Argv, Env: in.Env, Cwd: in.Cwd, Stdin: in.Stdin != "", TimeoutS: timeout,
	})
	if err != nil {
		return nil, RunCommandOutput{}, fmt.Errorf("run command in %s: %w", in.SandboxID, err)
	}
	// The sandbox kills the command at its timeout; this bound only stops
	// waiting on a data plane that never answers.
	ctx, cancel := context.WithTimeout(ctx, time.Duration(timeout)*time.Second+60*time.Second)
	defer cancel()
	var stdin io.Reader
	if in.Stdin != "" {
		stdin = strings.NewReader(in.Stdin)
	}
	stdout, stderr := &capWriter{max: MaxOutputBytes}, &capWriter{max: MaxOutputBytes}
	exit, err := client.RunCommand(ctx, cs.AttachURL, cs.Token, stdin, stdout, stderr)
	if err != nil {
		return nil, RunCommandOutput{}, fmt.Errorf("run command in %s: %w", in.SandboxID, err)
	}
	out := RunCommandOutput{
		ExitCode: exit.ExitCode, Stdout: stdout.String(), Stderr: stderr.String(),
		StdoutTruncated: stdout.dropped > 0, StderrTruncated: stderr.dropped > 0,
		TimedOut: exit.TimedOut, Signal: exit.Signal, Error: exit.Error,
	}
	var b strings.Builder
	fmt.Fprintf(&b, "exit code %d", out.ExitCode)
	if out.TimedOut {
		fmt.Fprintf(&b, " (timed out after %ds)", timeout)
	}
	if out.Signal != "" {
		fmt.Fprintf(&b, " (signal %s)", out.Signal)
	}
	if out.Error != "" {
		fmt.Fprintf(&b, "\nerror: %s", out.Error)
	}
	fmt.Fprintf(&b, "\n--- stdout ---\n%s\n--- stderr ---\n%s", out.Stdout, out.Stderr)
	return text("%s", b.String()), out, nil
}

func needPath(in PathInput) error {
	if err := needID(in.SandboxID); err != nil {
		return err
	}
	if in.Path == "" {
		return errors.New("path is required (an absolute path inside the sandbox)")
	}
	return nil
}

func (s *server) files(ctx context.Context, req *mcp.CallToolRequest, id string) (*client.FilesClient, error) {
	c, err := s.client(req)
	if err != nil {
		return nil, err
	}
	fc, err := c.Files(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("files of %s: %w", id, err)
	}
	return fc, nil
}

func (s *server) readFile(ctx context.Context, req *mcp.CallToolRequest, in PathInput) (*mcp.CallToolResult, ReadFileOutput, error) {
	if err := needPath(in); err != nil {
		return nil, ReadFileOutput{}, err
	}
	fc, err := s.files(ctx, req, in.SandboxID)
	if err != nil {
		return nil, ReadFileOutput{}, err
	}
	rc, err := fc.Read(ctx, in.Path)
	if err != nil {
		return nil, ReadFileOutput{}, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, MaxReadFileBytes+1))
	if err != nil {
		return nil, ReadFileOutput{}, fmt.Errorf("read %s: %w", in.Path, err)
	}
	if len(b) > MaxReadFileBytes {
		return nil, ReadFileOutput{}, fmt.Errorf("read %s: the file is larger than %d MiB, more than read_file returns; read a part with run_command (e.g. head -c, tail, sed -n)", in.Path, MaxReadFileBytes>>20)
	}
	if !utf8.Valid(b) || bytes.IndexByte(b, 0) >= 0 {
		return nil, ReadFileOutput{}, fmt.Errorf("read %s: the file is binary (not UTF-8 text); read_file returns only text: use run_command (e.g. base64 %s, or od -c)", in.Path, in.Path)
	}
	out := ReadFileOutput{Path: in.Path, Size: len(b), Content: string(b)}
	return text("%s", out.Content), out, nil
}

func (s *server) writeFile(ctx context.Context, req *mcp.CallToolRequest, in WriteFileInput) (*mcp.CallToolResult, WriteFileOutput, error) {
	if err := needPath(PathInput{SandboxID: in.SandboxID, Path: in.Path}); err != nil {
		return nil, WriteFileOutput{}, err
	}
	fc, err := s.files(ctx, req, in.SandboxID)
	if err != nil {
		return nil, WriteFileOutput{}, err
	}
	fi, err := fc.Write(ctx, in.Path, strings.NewReader(in.Content), "", "")
	if err != nil {
		return nil, WriteFileOutput{}, err
	}
	out := WriteFileOutput{Path: in.Path, Size: int64(len(in.Content))}
	if fi.Path != "" {
		out.Path, out.Size = fi.Path, fi.Size
	}
	return text("wrote %d bytes to %s", out.Size, out.Path), out, nil
}

func (s *server) listFiles(ctx context.Context, req *mcp.CallToolRequest, in PathInput) (*mcp.CallToolResult, ListFilesOutput, error) {
	if err := needPath(in); err != nil {
		return nil, ListFilesOutput{}, err
	}
	fc, err := s.files(ctx, req, in.SandboxID)
	if err != nil {
		return nil, ListFilesOutput{}, err
	}
	es, next, err := fc.ListPage(ctx, in.Path, MaxListEntries, "")
	if err != nil {
		return nil, ListFilesOutput{}, err
	}
	out := ListFilesOutput{Path: in.Path, Entries: []FileEntry{}, Truncated: next != ""}
	var b strings.Builder
	for _, e := range es {
		fe := FileEntry{Name: e.Name, Path: e.Path, Type: e.Type, Size: e.Size, Mode: e.Mode, Target: e.Target}
		if !e.ModTime.IsZero() {
			fe.ModTime = e.ModTime.UTC().Format(time.RFC3339)
		}
		out.Entries = append(out.Entries, fe)
		fmt.Fprintf(&b, "%s %s %d %s\n", fe.Type, fe.Mode, fe.Size, fe.Name)
	}
	if out.Truncated {
		fmt.Fprintf(&b, "[only the first %d entries are listed]\n", MaxListEntries)
	}
	return text("%s", strings.TrimSuffix(b.String(), "\n")), out, nil
}

func (s *server) checkpoint(ctx context.Context, req *mcp.CallToolRequest, in CheckpointInput) (*mcp.CallToolResult, CheckpointOutput, error) {
	if err := needID(in.SandboxID); err != nil {
		return nil, CheckpointOutput{}, err
	}
	c, err := s.client(req)
	if err != nil {
		return nil, CheckpointOutput{}, err
	}
	op, err := c.CreateCheckpoint(ctx, in.SandboxID, in.Name)
	if err != nil {
		return nil, CheckpointOutput{}, fmt.Errorf("checkpoint %s: %w", in.SandboxID, err)
	}
	sb, err := wait(ctx, c, op, "checkpoint "+in.SandboxID)
	if err != nil {
		return nil, CheckpointOutput{}, err
	}
	out := CheckpointOutput{SandboxID: sb.ID, Checkpoint: in.Name, State: string(sb.State)}
	return text("checkpoint %s of %s taken; the sandbox is %s", in.Name, sb.ID, sb.State), out, nil
}

func (s *server) rollback(ctx context.Context, req *mcp.CallToolRequest, in RollbackInput) (*mcp.CallToolResult, Sandbox, error) {
	if err := needID(in.SandboxID); err != nil {
		return nil, Sandbox{}, err
	}
	c, err := s.client(req)
	if err != nil {
		return nil, Sandbox{}, err
	}
	op, err := c.RollbackSandbox(ctx, in.SandboxID, in.Checkpoint)
	if err != nil {
		return nil, Sandbox{}, fmt.Errorf("rollback %s: %w", in.SandboxID, err)
	}
	sb, err := wait(ctx, c, op, "rollback "+in.SandboxID)
	if err != nil {
		return nil, Sandbox{}, err
	}
	out := toSandbox(sb)
	return text("sandbox %s rolled back to %s; it is %s", out.ID, in.Checkpoint, out.State), out, nil
}

func (s *server) fork(ctx context.Context, req *mcp.CallToolRequest, in ForkInput) (*mcp.CallToolResult, ForkOutput, error) {
	if err := needID(in.SandboxID); err != nil {
		return nil, ForkOutput{}, err
	}
	c, err := s.client(req)
	if err != nil {
		return nil, ForkOutput{}, err
	}
	forks, err := c.ForkSandbox(ctx, client.CreateSandboxRequest{
		FromCheckpoint: &client.CheckpointRef{SandboxID: in.SandboxID, Checkpoint: in.Checkpoint}, Count: in.Count,
	}, "")
	if err != nil {
		return nil, ForkOutput{}, fmt.Errorf("fork %s: %w", in.SandboxID, err)
	}
	out := ForkOutput{Sandboxes: []Sandbox{}}
	var errs []error
	for _, f := range forks {
		sb := f.Sandbox
		if f.Operation.ID != "" {
			got, err := wait(ctx, c, f.Operation, "fork "+sb.ID)
			if err != nil {
				errs = append(errs, err)
			} else {
				sb = got
			}
		}
		out.Sandboxes = append(out.Sandboxes, toSandbox(sb))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, ForkOutput{}, err
	}
	ids := make([]string, len(out.Sandboxes))
	for i, sb := range out.Sandboxes {
		ids[i] = sb.ID
	}
	return text("forked %s@%s into %s", in.SandboxID, in.Checkpoint, strings.Join(ids, ", ")), out, nil
}
