package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/model"
)

var opWaitCmd = &command{
	name:    "op wait",
	args:    "<op-id | sandbox-id> [--json]",
	summary: "wait for an operation to finish (or for a sandbox to settle); fails if it failed",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		asJSON := fs.Bool("json", false, "print the operation (or, for a sandbox id, the sandbox) as JSON")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 1 {
				return usagef("op wait", "want exactly one operation or sandbox id, got %d arguments", len(args))
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			if strings.HasPrefix(args[0], "sb-") {
				sb, err := waitSandboxSettled(ctx, c, args[0], 250*time.Millisecond)
				if *asJSON && sb.ID != "" {
					if perr := printJSON(r.stdout, sb); err == nil {
						err = perr
					}
				} else if err == nil {
					fmt.Fprintf(r.stdout, "%s %s\n", sb.ID, sb.State)
				}
				return err
			}
			op, err := c.GetOperation(ctx, args[0])
			if err != nil {
				return fmt.Errorf("get operation %s: %w", args[0], err)
			}
			op, err = waitOp(ctx, c, op)
			if *asJSON && op.ID != "" {
				if perr := printJSON(r.stdout, op); err == nil {
					err = perr
				}
			} else if err == nil {
				fmt.Fprintf(r.stdout, "%s %s\n", op.ID, op.State)
			}
			return err
		}
	},
}

// Settled reports whether a sandbox in state s has no lifecycle operation
// in flight.
func Settled(s model.SandboxState) bool {
	switch s {
	case model.StateRunning, model.StatePaused, model.StateSuspended, model.StateDeleted, model.StateFailed, model.StateLost:
		return true
	}
	return false
}

// waitSandboxSettled polls the sandbox until no operation is in flight (its
// state is running, paused or suspended and equals its desired state, and no
// checkpoint or rollback task is pending, or it is deleted or failed);
// failed is an error carrying the reason. The API has no per-sandbox
// operation list, so the state (and the task) is the signal.
func waitSandboxSettled(ctx context.Context, c *client.Client, id string, every time.Duration) (model.Sandbox, error) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		sb, err := c.GetSandbox(ctx, id)
		if err != nil {
			return model.Sandbox{}, fmt.Errorf("get sandbox %s: %w", id, err)
		}
		// Settled, and not about to move: a pause or suspend just accepted
		// leaves the state running until the controller acts; a checkpoint
		// or rollback (a Task) leaves it running or paused throughout.
		if Settled(sb.State) && (sb.State.Terminal() || (sb.DesiredState == "" || sb.DesiredState == sb.State) && sb.Task == nil) {
			if sb.State.Broken() {
				reason := sb.Reason
				if reason == "" {
					reason = "no reason given"
				}
				return sb, fmt.Errorf("sandbox %s %s: %s", id, sb.State, reason)
			}
			return sb, nil
		}
		select {
		case <-ctx.Done():
			return sb, fmt.Errorf("wait for sandbox %s (state %s): %w", id, sb.State, ctx.Err())
		case <-t.C:
		}
	}
}

var opGetCmd = &command{
	name:    "op get",
	args:    "<op-id> [--json]",
	summary: "show one operation",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		asJSON := fs.Bool("json", false, "print the operation as JSON")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 1 {
				return usagef("op get", "want exactly one operation id, got %d arguments", len(args))
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			op, err := c.GetOperation(ctx, args[0])
			if err != nil {
				return fmt.Errorf("get operation %s: %w", args[0], err)
			}
			if *asJSON {
				return printJSON(r.stdout, op)
			}
			printOperation(r.stdout, op)
			return nil
		}
	},
}

func printOperation(w io.Writer, op model.Operation) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("ID", op.ID)
	row("Kind", string(op.Kind))
	row("Sandbox", op.SandboxID)
	row("State", string(op.State))
	if op.Reason != "" {
		row("Reason", op.Reason)
	}
	row("Target", string(op.Target))
	row("Created", stamp(op.CreatedAt))
	row("Updated", stamp(op.UpdatedAt))
	row("Deadline", stamp(op.Deadline))
	tw.Flush()
}
