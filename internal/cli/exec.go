package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/model"
)

var execCmd = &command{
	name:       "exec",
	args:       "[-d] [-i] [-t] [--env K=V]... [--cwd DIR] [--user U] [--timeout S] <sandbox-id> [-- <command> [args...]]",
	summary:    "run a command in a sandbox, streaming its output; exits with its exit status",
	ownSignals: true,
	rawArgs:    true,
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		detach := fs.Bool("d", false, "detach: start the command, print its id and return (it keeps running)")
		interactive := fs.Bool("i", false, "forward stdin even when it is a terminal")
		tty := fs.Bool("t", false, "run the command on a pseudo-terminal: the local terminal goes raw, keys (Ctrl-C too) and window resizes reach the command")
		it := fs.Bool("it", false, "-i and -t together")
		ti := fs.Bool("ti", false, "-i and -t together")
		env := kvFlag{}
		fs.Var(env, "env", "environment variable `K=V` (repeatable)")
		cwd := fs.String("cwd", "", "working `directory` (default: the user's home)")
		user := fs.String("user", "", "run as this `user` (default: user)")
		timeout := fs.Int("timeout", 0, "kill the command after this many `seconds` (0: never)")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) < 1 {
				return usagef("exec", "want a sandbox id and a command, e.g. airlock exec sb-… -- ls -l (without a command: the template's Entrypoint and Cmd)")
			}
			id, argv := args[0], args[1:]
			if *it || *ti {
				*interactive, *tty = true, true
			}
			// Stdin is forwarded when asked for, or when it is a pipe or a
			// file; a terminal is left alone unless -i (the command would
			// otherwise wait for input nobody means to type).
			sendStdin := !*detach && (*interactive || !r.env.StdinIsTerminal)
			req := client.CreateCommandRequest{Argv: argv, Env: env, Cwd: *cwd, User: *user, Stdin: sendStdin, TimeoutS: *timeout}
			if *tty {
				if *detach {
					return usagef("exec", "-d and -t do not go together: a detached command has no terminal to talk to")
				}
				return runTerminal(ctx, r, "exec", id, req)
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			cmd, err := c.CreateCommand(ctx, id, req)
			if err != nil {
				return fmt.Errorf("create command in %s: %w", id, err)
			}
			if *detach {
				return startDetached(ctx, r, cmd)
			}
			var stdin io.Reader
			if sendStdin {
				stdin = r.env.Stdin
			}
			exit, err := attach(ctx, r, cmd.AttachURL, cmd.Token, stdin, nil)
			if err != nil {
				return fmt.Errorf("command %s: %w", cmd.ID, err)
			}
			return exitStatus(r.stderr, exit)
		}
	},
}

// loginShell runs the user's login shell: bash when the sandbox has it,
// sh otherwise.
var loginShell = []string{"/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi"}

var shellCmd = &command{
	name:       "shell",
	args:       "[--env K=V]... [--cwd DIR] [--user U] <sandbox-id>",
	summary:    "an interactive login shell in a sandbox (= airlock exec -it <sandbox-id> -- bash -l)",
	ownSignals: true,
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		env := kvFlag{}
		fs.Var(env, "env", "environment variable `K=V` (repeatable)")
		cwd := fs.String("cwd", "", "working `directory` (default: the user's home)")
		user := fs.String("user", "", "log in as this `user` (default: user)")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 1 {
				return usagef("shell", "want one sandbox id, e.g. airlock shell sb-…")
			}
			return runTerminal(ctx, r, "shell", args[0], client.CreateCommandRequest{Argv: loginShell, Env: env, Cwd: *cwd, User: *user})
		}
	},
}

// runTerminal runs req on a pseudo-terminal the size of the local one,
// with the local terminal in raw mode until the command exits: every key
// (Ctrl-C and Ctrl-D included) goes to the remote terminal, and window
// size changes follow. It exits with the command's status.
func runTerminal(ctx context.Context, r *runner, name, id string, req client.CreateCommandRequest) error {
	term := r.env.Terminal
	if term == nil || !r.env.StdinIsTerminal {
		return usagef(name, "stdin is not a terminal, and a pseudo-terminal session needs one; run it from a terminal, or drop -t (airlock exec -i passes piped input)")
	}
	cols, rows, err := term.Size()
	if err != nil || cols <= 0 || rows <= 0 {
		cols, rows = 80, 24
	}
	req.PTY = &client.PTYSize{Cols: cols, Rows: rows}
	req.Stdin = true
	c, err := r.client()
	if err != nil {
		return err
	}
	cmd, err := c.CreateCommand(ctx, id, req)
	if err != nil {
		return fmt.Errorf("create command in %s: %w", id, err)
	}
	restore, err := term.MakeRaw()
	if err != nil {
		return fmt.Errorf("put the terminal in raw mode: %w", err)
	}
	exit, err := attach(ctx, r, cmd.AttachURL, cmd.Token, r.env.Stdin, term)
	if rerr := restore(); rerr != nil && err == nil {
		err = fmt.Errorf("restore the terminal: %w", rerr)
	}
	if err != nil {
		return fmt.Errorf("command %s: %w", cmd.ID, err)
	}
	return exitStatus(r.stderr, exit)
}

// startDetached attaches just long enough for the command to start (the
// first attach starts it), then leaves it running.
func startDetached(ctx context.Context, r *runner, cmd client.Command) error {
	sess, err := client.AttachCommand(ctx, cmd.AttachURL, cmd.Token, 0)
	if err != nil {
		return fmt.Errorf("start command %s: %w", cmd.ID, err)
	}
	defer sess.Close()
	for {
		kind, payload, err := sess.Next()
		if err != nil {
			return fmt.Errorf("start command %s: %w", cmd.ID, err)
		}
		switch kind {
		case agentapi.FrameStarted, agentapi.FrameStdout, agentapi.FrameStderr:
			fmt.Fprintln(r.stdout, cmd.ID)
			return nil
		case agentapi.FrameExit:
			// It already finished; still report the id, and a start failure.
			var e agentapi.Exit
			if json.Unmarshal(payload, &e) == nil && e.Error != "" {
				return fmt.Errorf("start command %s: %s", cmd.ID, e.Error)
			}
			fmt.Fprintln(r.stdout, cmd.ID)
			return nil
		case agentapi.FrameError:
			return fmt.Errorf("start command %s: %s", cmd.ID, frameMessage(payload))
		}
	}
}

// attach streams a command's output to the local stdout and stderr, sends
// stdin (when not nil) and forwards interrupts, until the command exits. A
// dropped connection is re-attached from the output offset reached, so no
// output is lost or repeated.
func attach(ctx context.Context, r *runner, url, tok string, stdin io.Reader, term Terminal) (agentapi.Exit, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cur := &currentSession{changed: make(chan struct{})}
	if stdin != nil {
		go copyStdin(ctx, stdin, cur)
	}
	if term != nil {
		resized, stop := term.Resized()
		defer stop()
		go func() {
			for {
				select {
				case <-resized:
					cols, rows, err := term.Size()
					if err != nil || cols <= 0 || rows <= 0 {
						continue
					}
					if !cur.do(ctx, func(s *client.CommandSession) error { return s.Resize(cols, rows) }) {
						return
					}
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	if r.env.Signals != nil {
		go func() {
			for n := 1; ; n++ {
				select {
				case sig := <-r.env.Signals:
					if n >= 3 {
						// The command ignores them: stop waiting, leave it running.
						fmt.Fprintf(r.stderr, "airlock: detached after %d interrupts; the command may still run\n", n)
						cancel()
						return
					}
					name := signalName(sig)
					if !cur.do(ctx, func(s *client.CommandSession) error { return s.Signal(name) }) {
						return
					}
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	var offset int64
	failures := 0
	for {
		sess, err := client.AttachCommand(ctx, url, tok, offset)
		if err == nil {
			cur.set(sess)
			var exit agentapi.Exit
			var done, progressed bool
			exit, done, progressed, err = pump(sess, &offset, r.stdout, r.stderr)
			if done {
				sess.Close()
				return exit, err
			}
			sess.Close()
			if progressed {
				failures = 0
			}
		}
		if ctx.Err() != nil {
			return agentapi.Exit{}, ctx.Err()
		}
		if failures >= client.AttachRetries || !retryable(err) {
			return agentapi.Exit{}, fmt.Errorf("attach: %w", err)
		}
		failures++
		select {
		case <-ctx.Done():
			return agentapi.Exit{}, ctx.Err()
		case <-time.After(time.Duration(failures) * 200 * time.Millisecond):
		}
	}
}

// retryable reports whether attaching again may help.
func retryable(err error) bool {
	return !(errors.Is(err, model.ErrNotFound) || errors.Is(err, model.ErrUnauthorized) ||
		errors.Is(err, model.ErrForbidden) || errors.Is(err, model.ErrInvalid) || errors.Is(err, model.ErrConflict))
}

// pump copies frames until the exit (done), an error frame (done, with
// err) or a broken connection (not done).
func pump(s *client.CommandSession, offset *int64, stdout, stderr io.Writer) (exit agentapi.Exit, done, progressed bool, err error) {
	for {
		kind, payload, err := s.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("stream closed before the command exited")
			}
			return exit, false, progressed, err
		}
		switch kind {
		case agentapi.FrameStdout, agentapi.FrameStderr:
			w := stdout
			if kind == agentapi.FrameStderr {
				w = stderr
			}
			*offset += int64(len(payload))
			progressed = true
			if _, err := w.Write(payload); err != nil {
				return exit, true, progressed, fmt.Errorf("write output: %w", err)
			}
		case agentapi.FrameExit:
			if err := json.Unmarshal(payload, &exit); err != nil {
				return exit, true, progressed, fmt.Errorf("decode exit frame: %w", err)
			}
			return exit, true, progressed, nil
		case agentapi.FrameError:
			return exit, true, progressed, errors.New(frameMessage(payload))
		}
	}
}

// currentSession is the attachment stdin and signals go to; it changes when
// attach re-attaches.
type currentSession struct {
	mu      sync.Mutex
	s       *client.CommandSession
	gen     int
	changed chan struct{} // closed and replaced on every set
}

func (c *currentSession) set(s *client.CommandSession) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.s = s
	c.gen++
	close(c.changed)
	c.changed = make(chan struct{})
}

// do runs f on the current session, retrying on the next one when it
// fails; false when ctx ended first.
func (c *currentSession) do(ctx context.Context, f func(*client.CommandSession) error) bool {
	tried := -1
	for {
		c.mu.Lock()
		s, gen, changed := c.s, c.gen, c.changed
		c.mu.Unlock()
		if s != nil && gen != tried {
			if f(s) == nil {
				return true
			}
			tried = gen
		}
		select {
		case <-ctx.Done():
			return false
		case <-changed:
		}
	}
}

func copyStdin(ctx context.Context, stdin io.Reader, cur *currentSession) {
	buf := make([]byte, 256<<10)
	for {
		n, err := stdin.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if !cur.do(ctx, func(s *client.CommandSession) error { return s.WriteStdin(chunk) }) {
				return
			}
		}
		if err != nil {
			// EOF or a read error: either way the command sees the end.
			cur.do(ctx, func(s *client.CommandSession) error { return s.CloseStdin() })
			return
		}
	}
}

func frameMessage(payload []byte) string {
	var m struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(payload, &m) == nil && m.Message != "" {
		return m.Message
	}
	return string(payload)
}

// signalName names sig the way the agent expects ("INT", "TERM").
func signalName(sig os.Signal) string {
	if s, ok := sig.(syscall.Signal); ok {
		if name := unix.SignalName(s); name != "" {
			return strings.TrimPrefix(name, "SIG")
		}
		return strconv.Itoa(int(s))
	}
	return sig.String()
}

// ExitStatusOf maps a remote exit to a local exit status: the exit code, or
// 128 + the signal number when the command was killed by a signal.
func ExitStatusOf(e agentapi.Exit) int {
	if e.Signal != "" {
		if n := signalNumber(e.Signal); n > 0 {
			return 128 + n
		}
		return 128
	}
	if e.ExitCode < 0 || e.ExitCode > 255 {
		return ExitError
	}
	return e.ExitCode
}

// signalNumber parses "KILL", "SIGKILL" or "9".
func signalNumber(name string) int {
	if n, err := strconv.Atoi(name); err == nil {
		return n
	}
	name = strings.ToUpper(name)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	return int(unix.SignalNum(name))
}

// exitStatus turns a remote exit into the command's result, saying on
// stderr why when the status alone does not.
func exitStatus(stderr io.Writer, e agentapi.Exit) error {
	switch {
	case e.Error != "":
		fmt.Fprintf(stderr, "airlock: command did not run: %s\n", e.Error)
		if e.ExitCode > 0 && e.ExitCode < 256 {
			return &ExitCodeError{Code: e.ExitCode}
		}
		return &ExitCodeError{Code: 127}
	case e.TimedOut:
		fmt.Fprintf(stderr, "airlock: command timed out and was killed\n")
	}
	if code := ExitStatusOf(e); code != 0 {
		return &ExitCodeError{Code: code}
	}
	return nil
}
