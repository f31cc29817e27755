package cli

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
)

// WorkerAdminVerbs are the `airlock worker <verb>` commands of the CLI;
// `airlock worker` with anything else runs the worker daemon.
var WorkerAdminVerbs = []string{"ls", "get", "cordon", "uncordon", "drain"}

var workerListCmd = &command{
	name:    "worker ls",
	args:    "[--json]",
	summary: "list the registered workers: state, capacity, sandboxes (operator key)",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		asJSON := fs.Bool("json", false, "print a JSON array")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 0 {
				return usagef("worker ls", "unexpected argument %q", args[0])
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			ws, err := c.ListWorkers(ctx)
			if err != nil {
				return fmt.Errorf("list workers: %w", err)
			}
			if *asJSON {
				if ws == nil {
					ws = []apitypes.Worker{}
				}
				return printJSON(r.stdout, ws)
			}
			tw := tabwriter.NewWriter(r.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATE\tRUNTIMES\tVCPUS\tMEMORY\tSANDBOXES\tHEARTBEAT")
			for _, w := range ws {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%d/%d MiB\t%s\t%s\n", w.ID, w.State, runtimeNames(w.Worker),
					w.UsedVCPUs, w.CapacityVCPUs, w.UsedMiB, w.CapacityMiB, sandboxCounts(w.Sandboxes), ago(w.LastHeartbeat))
			}
			return tw.Flush()
		}
	},
}

var workerGetCmd = &command{
	name:    "worker get",
	args:    "<worker-id>",
	summary: "show one worker as JSON (operator key)",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 1 {
				return usagef("worker get", "want exactly one worker id, got %d arguments", len(args))
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			w, err := c.GetWorker(ctx, args[0])
			if err != nil {
				return fmt.Errorf("get worker %s: %w", args[0], err)
			}
			return printJSON(r.stdout, w)
		}
	},
}

var workerCordonCmd = cordonCmd("worker cordon", true, "stop placing new sandboxes on a worker; what runs there stays (operator key)")
var workerUncordonCmd = cordonCmd("worker uncordon", false, "place new sandboxes on a cordoned worker again (operator key)")

func cordonCmd(name string, cordoned bool, summary string) *command {
	return &command{
		name:    name,
		args:    "<worker-id>",
		summary: summary,
		setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
			return func(ctx context.Context, r *runner, args []string) error {
				if len(args) != 1 {
					return usagef(name, "want exactly one worker id, got %d arguments", len(args))
				}
				c, err := r.client()
				if err != nil {
					return err
				}
				w, err := c.CordonWorker(ctx, args[0], cordoned)
				if err != nil {
					return fmt.Errorf("%s %s: %w", strings.TrimPrefix(name, "worker "), args[0], err)
				}
				fmt.Fprintf(r.stdout, "worker %s is %s\n", w.ID, w.State)
				return nil
			}
		},
	}
}

var workerDrainCmd = &command{
	name:    "worker drain",
	args:    "<worker-id> [--wait] [--timeout 30m]",
	summary: "cordon a worker and move its sandboxes to other workers through the blob store; --wait until it runs nothing (operator key)",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		wait := fs.Bool("wait", false, "wait until the worker runs no sandbox, printing progress")
		timeout := fs.Duration("timeout", 30*time.Minute, "with --wait: give up after this long")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 1 {
				return usagef("worker drain", "want exactly one worker id, got %d arguments", len(args))
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			w, err := c.DrainWorker(ctx, args[0])
			if err != nil {
				return fmt.Errorf("drain %s: %w", args[0], err)
			}
			fmt.Fprintf(r.stdout, "worker %s is %s: %s\n", w.ID, w.State, sandboxCounts(w.Sandboxes))
			if !*wait {
				return nil
			}
			ctx, cancel := context.WithTimeout(ctx, *timeout)
			defer cancel()
			last := ""
			for {
				if n := activeOn(w.Sandboxes); n == 0 {
					fmt.Fprintf(r.stdout, "worker %s is drained: %s\n", w.ID, sandboxCounts(w.Sandboxes))
					return nil
				}
				if now := sandboxCounts(w.Sandboxes); now != last {
					fmt.Fprintf(r.stdout, "  %s\n", now)
					last = now
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("drain %s: still %s after %s", w.ID, sandboxCounts(w.Sandboxes), *timeout)
				case <-time.After(500 * time.Millisecond):
				}
				if w, err = c.GetWorker(ctx, args[0]); err != nil {
					return fmt.Errorf("drain %s: %w", args[0], err)
				}
			}
		}
	},
}

// activeOn counts a worker's sandboxes that hold a runtime there (all
// but suspended, failed and lost ones): a drain is over at zero.
func activeOn(m map[model.SandboxState]int) int {
	n := 0
	for st, k := range m {
		if st != model.StateSuspended && !st.Terminal() {
			n += k
		}
	}
	return n
}

func runtimeNames(w model.Worker) string {
	var names []string
	for _, rt := range w.Runtimes {
		names = append(names, rt.Name)
	}
	if len(names) == 0 {
		return "-"
	}
	return strings.Join(names, ",")
}

// sandboxCounts words a worker's sandboxes by state: "3 running, 1 suspended".
func sandboxCounts(m map[model.SandboxState]int) string {
	var states []string
	total := 0
	for st, n := range m {
		states = append(states, string(st))
		total += n
	}
	if total == 0 {
		return "0"
	}
	slices.Sort(states)
	parts := make([]string, 0, len(states))
	for _, st := range states {
		parts = append(parts, fmt.Sprintf("%d %s", m[model.SandboxState(st)], st))
	}
	return strings.Join(parts, ", ")
}
