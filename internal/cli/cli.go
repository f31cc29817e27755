// Package cli implements the client side of the airlock binary: the
// `airlock <noun> <verb>` commands that talk only to the Airlock API through
// client. Each command has its own flag.FlagSet; Main dispatches,
// prints errors to stderr and maps them to exit codes (ExitError for a
// failed command, ExitUsage for bad arguments, the remote exit code for exec).
//
// The daemon subcommands (up, server, worker) live elsewhere; cmd/airlock
// routes them before calling Main.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/airlock/airlock/internal/bench"
)

// Exit codes.
const (
	ExitOK    = 0
	ExitError = 1 // the command failed
	ExitUsage = 2 // bad arguments or flags
)

// Env is what a command sees of the process it runs in. Tests build one
// over buffers; cmd/airlock builds one over the real process.
type Env struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// Getenv reads an environment variable (os.Getenv when nil).
	Getenv func(string) string
	// StdinIsTerminal reports whether Stdin is an interactive terminal: exec
	// then sends no stdin unless -i is given.
	StdinIsTerminal bool
	// Signals delivers the interrupts the process receives (SIGINT, SIGTERM).
	// exec forwards them to the remote command; every other command stops
	// (its context is cancelled). Nil means none arrive.
	Signals <-chan os.Signal
	// Terminal is the local terminal, for `exec -t` and `shell` (nil:
	// none; those then refuse, saying so).
	Terminal Terminal
	// BenchEgress runs `airlock bench --only egress` (nil: the group is
	// skipped). cmd/airlock sets it: the gateway is worker code the CLI
	// does not link.
	BenchEgress bench.EgressFunc
	// ImportTemplate runs `airlock template import` (nil: unavailable);
	// cmd/airlock sets it, as BenchEgress.
	ImportTemplate ImportFunc
}

// Terminal is the terminal the CLI runs in, for a remote PTY session.
type Terminal interface {
	// MakeRaw puts the terminal in raw mode (keys, Ctrl-C included, go to
	// the remote side as typed); restore undoes it.
	MakeRaw() (restore func() error, err error)
	// Size is the terminal's size.
	Size() (cols, rows int, err error)
	// Resized receives a value whenever the terminal's size changes
	// (SIGWINCH), until stop is called.
	Resized() (c <-chan struct{}, stop func())
}

func (e *Env) getenv(k string) string {
	if e.Getenv == nil {
		return os.Getenv(k)
	}
	return e.Getenv(k)
}

// command is one leaf of the command tree.
type command struct {
	name    string // full name, e.g. "sandbox create"
	args    string // synopsis of positional arguments and flags
	summary string
	// flags registers the command's own flags on fs; run is called with the
	// positional arguments after parsing.
	setup func(fs *flag.FlagSet) func(ctx context.Context, r *runner, args []string) error
	// ownSignals: the command handles Env.Signals itself (exec) instead of
	// having its context cancelled by them.
	ownSignals bool
	// rawArgs: positional arguments are not re-parsed for flags after the
	// first one (exec: everything after the sandbox id belongs to the command).
	rawArgs bool
}

// commands is the whole CLI surface; help lists it in this order.
var commands = []*command{
	sandboxCreateCmd, sandboxListCmd, sandboxGetCmd, sandboxTokenCmd, sandboxRemoveCmd,
	sandboxPauseCmd, sandboxResumeCmd, sandboxSuspendCmd, sandboxWakeCmd,
	sandboxCheckpointCmd, sandboxCheckpointsCmd, sandboxCheckpointRmCmd, sandboxRollbackCmd, sandboxForkCmd,
	sandboxExportCmd, sandboxImportCmd,
	execCmd, shellCmd, cpCmd,
	opWaitCmd, opGetCmd,
	templateListCmd, templateGetCmd, templateRemoveCmd, templateImportCmd, templatePullCmd, templateBuildCmd, e2bEnvCmd,
	orgCreateCmd, orgGetCmd, orgSetCmd, keyCreateCmd, keyListCmd, keyRemoveCmd,
	poolSetCmd, poolListCmd, poolRemoveCmd,
	workerListCmd, workerGetCmd, workerCordonCmd, workerUncordonCmd, workerDrainCmd,
	sandboxNetworkCmd,
	networkProfileSetCmd, networkProfileListCmd, networkProfileRemoveCmd,
	secretSetCmd, secretListCmd, secretRemoveCmd,
	benchCmd, mcpCmd,
}

// aliases maps alternative names to command names.
var aliases = map[string]string{
	"sandbox list":           "sandbox ls",
	"sandbox delete":         "sandbox rm",
	"sandbox remove":         "sandbox rm",
	"template list":          "template ls",
	"template delete":        "template rm",
	"template remove":        "template rm",
	"key list":               "key ls",
	"key revoke":             "key rm",
	"op show":                "op get",
	"network-profile list":   "network-profile ls",
	"network-profile remove": "network-profile rm",
	"secret list":            "secret ls",
	"secret remove":          "secret rm",
}

// daemonCommands are dispatched by cmd/airlock; help only mentions them.
var daemonCommands = []struct{ name, summary string }{
	{"up", "run a server and one worker on this machine (SQLite, first-run set-up)"},
	{"server", "run the API server and controllers"},
	{"worker", "run a worker that hosts sandboxes"},
}

// ExitCodeError carries an exit code chosen by the command (exec propagates
// the remote command's). Main prints nothing for it.
type ExitCodeError struct{ Code int }

func (e *ExitCodeError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// UsageError is a mistake in the command line; Main prints it with a hint
// and exits ExitUsage.
type UsageError struct {
	Cmd string // the command name, "" for the top level
	Msg string
}

func (e *UsageError) Error() string { return e.Msg }

func usagef(cmd, format string, args ...any) error {
	return &UsageError{Cmd: cmd, Msg: fmt.Sprintf(format, args...)}
}

// ExitCode maps an error returned by a command to the process exit code.
func ExitCode(err error) int {
	var ec *ExitCodeError
	var ue *UsageError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ec):
		return ec.Code
	case errors.As(err, &ue), errors.Is(err, flag.ErrHelp):
		return ExitUsage
	}
	return ExitError
}

// globalFlags are accepted before the command and by every command.
type globalFlags struct {
	url    string
	apiKey string
}

func (g *globalFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&g.url, "url", g.url, "API base URL (default $AIRLOCK_URL or "+DefaultURL+")")
	fs.StringVar(&g.apiKey, "api-key", g.apiKey, "API key (default $AIRLOCK_API_KEY or <data-dir>/admin.key)")
}

// runner is handed to every command: the environment, the resolved global
// flags and a lazily built client.
type runner struct {
	env    *Env
	global globalFlags
	stdout io.Writer
	stderr io.Writer
}

// Main runs the command line args (without the program name) and returns
// the process exit code.
func Main(ctx context.Context, args []string, env Env) int {
	if env.Stdin == nil {
		env.Stdin = strings.NewReader("")
	}
	if env.Stdout == nil {
		env.Stdout = io.Discard
	}
	if env.Stderr == nil {
		env.Stderr = io.Discard
	}
	err := run(ctx, args, &env)
	code := ExitCode(err)
	var ec *ExitCodeError
	var ue *UsageError
	switch {
	case err == nil, errors.As(err, &ec):
	case errors.Is(err, flag.ErrHelp):
		// Usage was printed already.
	case errors.As(err, &ue):
		prefix, hint := "airlock", "airlock help"
		if ue.Cmd != "" {
			prefix, hint = "airlock "+ue.Cmd, "airlock "+ue.Cmd+" -h"
		}
		fmt.Fprintf(env.Stderr, "%s: %s\nrun '%s' for usage\n", prefix, ue.Msg, hint)
	default:
		// Client errors carry their own "airlock: " prefix; say it once.
		fmt.Fprintf(env.Stderr, "airlock: %s\n", strings.ReplaceAll(err.Error(), ": airlock: ", ": "))
	}
	return code
}

// errHelpShown is returned when help was requested and printed: exit 0.
var errHelpShown = errors.New("help shown")

func run(ctx context.Context, args []string, env *Env) error {
	r := &runner{env: env, stdout: env.Stdout, stderr: env.Stderr}
	top := flag.NewFlagSet("airlock", flag.ContinueOnError)
	top.SetOutput(io.Discard)
	r.global.register(top)
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp(env.Stdout)
			return nil
		}
		return usagef("", "%v", err)
	}
	args = top.Args()
	if len(args) == 0 {
		printHelp(env.Stderr)
		return usagef("", "no command given")
	}
	if args[0] == "help" {
		return helpCommand(env, args[1:])
	}
	cmd, rest, err := lookup(args)
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("airlock "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	r.global.register(fs)
	runFn := cmd.setup(fs)
	pos, err := parseArgs(fs, rest, cmd.rawArgs)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printCommandHelp(env.Stdout, cmd)
			return nil
		}
		return usagef(cmd.name, "%v", err)
	}
	if !cmd.ownSignals && env.Signals != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			select {
			case <-env.Signals:
				cancel()
			case <-stop:
			}
		}()
	}
	return runFn(ctx, r, pos)
}

// lookup finds the command named by the first one or two words of args.
func lookup(args []string) (*command, []string, error) {
	for _, n := range []int{2, 1} {
		if len(args) < n {
			continue
		}
		name := strings.Join(args[:n], " ")
		if a, ok := aliases[name]; ok {
			name = a
		}
		for _, c := range commands {
			if c.name == name {
				return c, args[n:], nil
			}
		}
	}
	// A known noun with an unknown or missing verb.
	var verbs []string
	for _, c := range commands {
		if noun, verb, ok := strings.Cut(c.name, " "); ok && noun == args[0] {
			verbs = append(verbs, verb)
		}
	}
	if len(verbs) > 0 {
		if len(args) == 1 {
			return nil, nil, usagef("", "%s needs a subcommand: %s", args[0], strings.Join(verbs, ", "))
		}
		return nil, nil, usagef("", "unknown command %q; %s has: %s", args[0]+" "+args[1], args[0], strings.Join(verbs, ", "))
	}
	for _, d := range daemonCommands {
		if d.name == args[0] {
			return nil, nil, usagef("", "%s is a daemon command and is handled by cmd/airlock", args[0])
		}
	}
	return nil, nil, usagef("", "unknown command %q", args[0])
}

// parseArgs parses flags anywhere among the positional arguments (so both
// `sandbox get --json ID` and `sandbox get ID --json` work); "--" ends
// flag parsing. With raw, parsing stops at the first positional argument
// after flags have been parsed once more (exec's command line).
func parseArgs(fs *flag.FlagSet, args []string, raw bool) ([]string, error) {
	var pos []string
	for {
		before := len(args)
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		dashed := len(rest) < before && before > 0 && args[before-len(rest)-1] == "--"
		if dashed || len(rest) == 0 {
			return append(pos, rest...), nil
		}
		if raw {
			// exec: the sandbox id, then flags again until the command.
			pos = append(pos, rest[0])
			rest = rest[1:]
			if len(rest) == 0 {
				return pos, nil
			}
			if err := fs.Parse(rest); err != nil {
				return nil, err
			}
			return append(pos, fs.Args()...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// kvFlag collects repeated K=V flags.
type kvFlag map[string]string

func (m kvFlag) String() string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ",")
}

func (m kvFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q is not KEY=VALUE", s)
	}
	m[k] = v
	return nil
}

// printJSON writes v indented, with a trailing newline.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("print json: %w", err)
	}
	return nil
}

func helpCommand(env *Env, args []string) error {
	if len(args) == 0 {
		printHelp(env.Stdout)
		return nil
	}
	cmd, _, err := lookup(args)
	if err != nil {
		return err
	}
	printCommandHelp(env.Stdout, cmd)
	return nil
}

func printHelp(w io.Writer) {
	fmt.Fprintf(w, "airlock — self-hosted sandboxes for AI agents\n\nUsage: airlock [--url URL] [--api-key KEY] <command> [flags] [args]\n\nDaemons:\n")
	for _, d := range daemonCommands {
		fmt.Fprintf(w, "  %-20s %s\n", d.name, d.summary)
	}
	fmt.Fprintf(w, "\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-20s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nConfiguration: $AIRLOCK_URL (default %s), $AIRLOCK_API_KEY (default: the key\n"+
		"`airlock up` wrote to $AIRLOCK_DATA_DIR/admin.key, data dir default ~/.local/share/airlock).\n"+
		"Run 'airlock <command> -h' for a command's flags. Exit status: 0 ok, 1 error, 2 usage;\n"+
		"exec exits with the remote command's status.\n", DefaultURL)
}

func printCommandHelp(w io.Writer, c *command) {
	fmt.Fprintf(w, "Usage: airlock %s %s\n\n%s\n", c.name, c.args, c.summary)
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	var g globalFlags
	g.register(fs)
	c.setup(fs)
	fmt.Fprintf(w, "\nFlags:\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
}
