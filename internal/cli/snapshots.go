package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"text/tabwriter"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
)

// Checkpoints, rollback, forks, export and import (the org's feature gate
// "snapshots").

// checkpointResult is what `sandbox checkpoint --json` prints; Checkpoint
// is absent with --no-wait or when the operation failed.
type checkpointResult struct {
	Checkpoint *model.Checkpoint `json:"checkpoint,omitempty"`
	Operation  model.Operation   `json:"operation"`
}

var sandboxCheckpointCmd = &command{
	name:    "sandbox checkpoint",
	args:    "<sandbox-id> <name> [--no-wait] [--json]",
	summary: "take a named checkpoint of a running or paused sandbox and wait (it keeps running)",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		noWait := fs.Bool("no-wait", false, "return once the request is accepted; prints the operation id")
		asJSON := fs.Bool("json", false, "print {\"checkpoint\", \"operation\"} as JSON")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 2 {
				return usagef("sandbox checkpoint", "want <sandbox-id> <name>, got %d arguments", len(args))
			}
			id, name := args[0], args[1]
			c, err := r.client()
			if err != nil {
				return err
			}
			op, err := c.CreateCheckpoint(ctx, id, name)
			if err != nil {
				return fmt.Errorf("checkpoint sandbox %s: %w", id, err)
			}
			if *noWait {
				if *asJSON {
					return printJSON(r.stdout, checkpointResult{Operation: op})
				}
				fmt.Fprintln(r.stdout, op.ID)
				return nil
			}
			op, err = waitOp(ctx, c, op)
			if err != nil {
				if *asJSON {
					printJSON(r.stdout, checkpointResult{Operation: op})
				}
				return fmt.Errorf("sandbox %s: %w", id, err)
			}
			cps, err := c.ListCheckpoints(ctx, id)
			if err != nil {
				return fmt.Errorf("list checkpoints of %s: %w", id, err)
			}
			var cp *model.Checkpoint
			for i := range cps {
				if cps[i].Name == name {
					cp = &cps[i]
				}
			}
			if cp == nil {
				return fmt.Errorf("sandbox %s: checkpoint %s is not listed after operation %s succeeded", id, name, op.ID)
			}
			if *asJSON {
				return printJSON(r.stdout, checkpointResult{Checkpoint: cp, Operation: op})
			}
			return printCheckpoints(r.stdout, []model.Checkpoint{*cp})
		}
	},
}

var sandboxCheckpointsCmd = &command{
	name:    "sandbox checkpoints",
	args:    "<sandbox-id> [--json]",
	summary: "list a sandbox's checkpoints, oldest first",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		asJSON := fs.Bool("json", false, "print a JSON array")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 1 {
				return usagef("sandbox checkpoints", "want exactly one sandbox id, got %d arguments", len(args))
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			cps, err := c.ListCheckpoints(ctx, args[0])
			if err != nil {
				return fmt.Errorf("list checkpoints of %s: %w", args[0], err)
			}
			if *asJSON {
				if cps == nil {
					cps = []model.Checkpoint{}
				}
				return printJSON(r.stdout, cps)
			}
			return printCheckpoints(r.stdout, cps)
		}
	},
}

var sandboxCheckpointRmCmd = &command{
	name:    "sandbox checkpoint-rm",
	args:    "<sandbox-id> <checkpoint>",
	summary: "delete a checkpoint of a sandbox (from its record, then from its worker's disk)",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 2 {
				return usagef("sandbox checkpoint-rm", "want a sandbox id and a checkpoint name, got %d arguments", len(args))
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			if err := c.DeleteCheckpoint(ctx, args[0], args[1]); err != nil {
				return fmt.Errorf("delete checkpoint %s of %s: %w", args[1], args[0], err)
			}
			fmt.Fprintf(r.stdout, "deleted checkpoint %s of %s\n", args[1], args[0])
			return nil
		}
	},
}

func printCheckpoints(w io.Writer, cps []model.Checkpoint) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSIZE\tCREATED")
	for _, cp := range cps {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", cp.Name, size(cp.Bytes), ago(cp.CreatedAt))
	}
	return tw.Flush()
}

var sandboxRollbackCmd = &command{
	name:    "sandbox rollback",
	args:    "<sandbox-id> <checkpoint> [--no-wait] [--json]",
	summary: "return a sandbox to a checkpoint (memory, processes, files) and wait until it runs",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		noWait := fs.Bool("no-wait", false, "return once the request is accepted; prints the operation id")
		asJSON := fs.Bool("json", false, "print {\"sandbox\", \"operation\"} as JSON")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 2 {
				return usagef("sandbox rollback", "want <sandbox-id> <checkpoint>, got %d arguments", len(args))
			}
			id := args[0]
			c, err := r.client()
			if err != nil {
				return err
			}
			op, err := c.RollbackSandbox(ctx, id, args[1])
			if err != nil {
				return fmt.Errorf("roll back sandbox %s: %w", id, err)
			}
			return finishLifecycle(ctx, r, c, id, op, *noWait, *asJSON)
		}
	},
}

// createFlags are the settings a fork or an import may give its new
// sandboxes (template, runtime and resources come from the checkpoint).
type createFlags struct {
	env, meta  kvFlag
	timeout    *int
	idle       *idleFlag
	noAutoWake *bool
}

func registerCreateFlags(fs *flag.FlagSet, what string) *createFlags {
	f := &createFlags{env: kvFlag{}, meta: kvFlag{}, idle: &idleFlag{}}
	fs.Var(f.env, "env", "environment variable `K=V` for every command of "+what+" (repeatable)")
	fs.Var(f.meta, "metadata", "metadata `K=V` of "+what+" (repeatable)")
	f.timeout = fs.Int("timeout", 0, "delete "+what+" after this many `seconds` (0: never)")
	fs.Var(f.idle, "idle-suspend-after", "suspend after this long without activity (`duration`; 0 never; default: the org's, else 6h)")
	f.noAutoWake = fs.Bool("no-auto-wake", false, "do not wake for commands or files while paused or suspended")
	return f
}

func (f *createFlags) request() client.CreateSandboxRequest {
	req := client.CreateSandboxRequest{Env: f.env, Metadata: f.meta, TimeoutS: *f.timeout}
	if len(f.env) == 0 {
		req.Env = nil
	}
	if len(f.meta) == 0 {
		req.Metadata = nil
	}
	if f.idle.set {
		req.IdleSuspendAfterS = &f.idle.secs
	}
	if *f.noAutoWake {
		no := false
		req.AutoWake = &no
	}
	return req
}

var sandboxForkCmd = &command{
	name:    "sandbox fork",
	args:    "<sandbox-id> <checkpoint> [--count N] [--env K=V]... [--metadata K=V]... [--timeout S] [--idle-suspend-after 6h|0] [--no-auto-wake] [--idempotency-key K] [--no-wait] [--json]",
	summary: "start new sandboxes from a checkpoint and wait until they run; prints their ids",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		count := fs.Int("count", 1, fmt.Sprintf("how many sandboxes to start (1 … %d)", apitypes.MaxForks))
		cf := registerCreateFlags(fs, "each fork")
		idem := fs.String("idempotency-key", "", "retry-safe `key`: the same key returns the same forks")
		noWait := fs.Bool("no-wait", false, "return once the fork is accepted, without waiting")
		asJSON := fs.Bool("json", false, "print a JSON array of {\"sandbox\", \"operation\"}")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 2 {
				return usagef("sandbox fork", "want <sandbox-id> <checkpoint>, got %d arguments", len(args))
			}
			if *count < 1 || *count > apitypes.MaxForks {
				return usagef("sandbox fork", "--count must be 1 … %d", apitypes.MaxForks)
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			req := cf.request()
			req.FromCheckpoint = &client.CheckpointRef{SandboxID: args[0], Checkpoint: args[1]}
			if *count > 1 {
				req.Count = *count
			}
			forks, err := c.ForkSandbox(ctx, req, *idem)
			if err != nil {
				return fmt.Errorf("fork checkpoint %s of %s: %w", args[1], args[0], err)
			}
			results := make([]createResult, len(forks))
			errs := make([]error, len(forks))
			for i, f := range forks {
				results[i] = createResult{Sandbox: f.Sandbox, Operation: f.Operation}
			}
			if !*noWait {
				var wg sync.WaitGroup
				for i := range results {
					wg.Go(func() {
						res := &results[i]
						op, err := waitOp(ctx, c, res.Operation)
						res.Operation = op
						if err != nil {
							errs[i] = fmt.Errorf("sandbox %s: %w", res.Sandbox.ID, err)
							return
						}
						sb, err := c.GetSandbox(ctx, res.Sandbox.ID)
						if err != nil {
							errs[i] = fmt.Errorf("get sandbox %s: %w", res.Sandbox.ID, err)
							return
						}
						res.Sandbox = sb
					})
				}
				wg.Wait()
			}
			if *asJSON {
				if err := printJSON(r.stdout, results); err != nil {
					return err
				}
			} else {
				for i, res := range results {
					if errs[i] == nil {
						fmt.Fprintln(r.stdout, res.Sandbox.ID)
					}
				}
			}
			return errors.Join(errs...)
		}
	},
}

var sandboxExportCmd = &command{
	name:    "sandbox export",
	args:    "<sandbox-id> <checkpoint> [-o FILE|-]",
	summary: "download a checkpoint as a portable tar archive (to <sandbox-id>-<checkpoint>.tar)",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		out := fs.String("o", "", "write the archive to `FILE` (a directory: the default name in it; \"-\": stdout)")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 2 {
				return usagef("sandbox export", "want <sandbox-id> <checkpoint>, got %d arguments", len(args))
			}
			id, name := args[0], args[1]
			c, err := r.client()
			if err != nil {
				return err
			}
			if *out == "-" {
				if _, err := c.ExportCheckpoint(ctx, id, name, r.stdout); err != nil {
					return fmt.Errorf("export checkpoint %s of %s: %w", name, id, err)
				}
				return nil
			}
			target := *out
			def := id + "-" + name + ".tar"
			if target == "" {
				target = def
			} else if st, err := os.Stat(target); err == nil && st.IsDir() {
				target = filepath.Join(target, def)
			}
			n, err := exportToFile(ctx, c, id, name, target)
			if err != nil {
				return fmt.Errorf("export checkpoint %s of %s: %w", name, id, err)
			}
			fmt.Fprintln(r.stdout, target)
			fmt.Fprintf(r.stderr, "wrote %s (%s)\n", target, size(n))
			return nil
		}
	},
}

// exportToFile writes the archive to a temporary file next to target and
// renames it into place once complete, so a failed or interrupted export
// leaves no partial archive (and an existing target untouched). The file
// is readable by its owner only: it holds the sandbox's memory.
func exportToFile(ctx context.Context, c *client.Client, id, name, target string) (int64, error) {
	dir, base := filepath.Split(target)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".*.part")
	if err != nil {
		return 0, err
	}
	tmp := f.Name()
	done := false
	defer func() {
		if !done {
			f.Close()
			os.Remove(tmp)
		}
	}()
	n, err := c.ExportCheckpoint(ctx, id, name, f)
	if err != nil {
		return n, err
	}
	if err := f.Sync(); err != nil {
		return n, fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return n, fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, target); err != nil {
		os.Remove(tmp)
		done = true
		return n, err
	}
	done = true
	return n, nil
}

var sandboxImportCmd = &command{
	name:    "sandbox import",
	args:    "<FILE|-> [--env K=V]... [--metadata K=V]... [--timeout S] [--idle-suspend-after 6h|0] [--no-auto-wake] [--no-wait] [--json]",
	summary: "create a sandbox from an exported checkpoint archive and wait until it runs; prints its id",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		cf := registerCreateFlags(fs, "the sandbox")
		noWait := fs.Bool("no-wait", false, "return once the import is accepted, without waiting")
		asJSON := fs.Bool("json", false, "print {\"sandbox\", \"operation\"} as JSON")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 1 {
				return usagef("sandbox import", "want exactly one archive file (or - for stdin), got %d arguments", len(args))
			}
			var in io.Reader = r.env.Stdin
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return fmt.Errorf("open archive: %w", err)
				}
				defer f.Close()
				if st, err := f.Stat(); err == nil && st.IsDir() {
					return fmt.Errorf("%s is a directory, not a checkpoint archive", args[0])
				}
				in = f
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			sb, op, err := c.ImportSandbox(ctx, cf.request(), in)
			if err != nil {
				return fmt.Errorf("import %s: %w", archiveName(args[0]), err)
			}
			if !*noWait {
				if op, err = waitOp(ctx, c, op); err != nil {
					if *asJSON {
						printJSON(r.stdout, createResult{Sandbox: sb, Operation: op})
					}
					return fmt.Errorf("sandbox %s: %w", sb.ID, err)
				}
				if sb, err = c.GetSandbox(ctx, sb.ID); err != nil {
					return fmt.Errorf("get sandbox %s: %w", sb.ID, err)
				}
			}
			if *asJSON {
				return printJSON(r.stdout, createResult{Sandbox: sb, Operation: op})
			}
			fmt.Fprintln(r.stdout, sb.ID)
			return nil
		}
	},
}

// archiveName names the archive argument in messages.
func archiveName(arg string) string {
	if arg == "-" {
		return "stdin"
	}
	return arg
}
