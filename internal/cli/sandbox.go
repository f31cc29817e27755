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

// client builds the API client from the global flags and the environment.
func (r *runner) client() (*client.Client, error) {
	cfg, err := LoadConfig(r.env.getenv, r.global.url, r.global.apiKey)
	if err != nil {
		return nil, err
	}
	return client.New(cfg.URL, cfg.APIKey), nil
}

// createResult is what `sandbox create --json` prints.
type createResult struct {
	Sandbox   model.Sandbox   `json:"sandbox"`
	Operation model.Operation `json:"operation"`
}

var sandboxCreateCmd = &command{
	name:    "sandbox create",
	args:    "[--template base] [--env K=V]... [--metadata K=V]... [--vcpus N] [--memory MiB] [--disk MiB] [--timeout S] [--runtime R] [--idle-suspend-after 6h|0] [--no-auto-wake] [--public-traffic] [--network-profile NAME | --network-policy FILE] [--idempotency-key K] [--no-wait] [--json]",
	summary: "create a sandbox and wait until it runs; prints its id",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		tmpl := fs.String("template", "base", "template `name[:tag]` or digest")
		env, meta := kvFlag{}, kvFlag{}
		fs.Var(env, "env", "environment variable `K=V` for every command (repeatable)")
		fs.Var(meta, "metadata", "metadata `K=V` (repeatable)")
		vcpus := fs.Int("vcpus", 0, "virtual CPUs (0: server default)")
		mem := fs.Int("memory", 0, "memory in `MiB` (0: server default)")
		disk := fs.Int("disk", 0, "disk limit in `MiB`: what the sandbox may write to its filesystem (0: server default, 4096)")
		timeout := fs.Int("timeout", 0, "delete the sandbox after this many `seconds` (0: never)")
		rt := fs.String("runtime", "", "runtime, e.g. gvisor (default: the server's)")
		idle := &idleFlag{}
		fs.Var(idle, "idle-suspend-after", "suspend after this long without activity (`duration`; 0 never; default: the org's, else 6h)")
		noAutoWake := fs.Bool("no-auto-wake", false, "do not wake the sandbox for commands or files while it is paused or suspended")
		public := fs.Bool("public-traffic", false, "let anyone who knows the sandbox id reach its ports, without its traffic token (see `airlock sandbox token`)")
		netProfile := fs.String("network-profile", "", "egress: network profile `name` (default: the org's; see `airlock network-profile ls`)")
		netPolicy := fs.String("network-policy", "", "egress: NetworkPolicyV1 JSON `file` (- for stdin), if the org may send its own")
		idem := fs.String("idempotency-key", "", "retry-safe `key`: the same key returns the same sandbox")
		noWait := fs.Bool("no-wait", false, "return once the create is accepted, without waiting")
		asJSON := fs.Bool("json", false, "print {\"sandbox\", \"operation\"} as JSON")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 0 {
				return usagef("sandbox create", "unexpected argument %q", args[0])
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			req := client.CreateSandboxRequest{
				Template: *tmpl, Env: env, Metadata: meta, Runtime: *rt,
				Resources: model.Resources{VCPUs: *vcpus, MemoryMiB: *mem, DiskMiB: *disk}, TimeoutS: *timeout,
				PublicTraffic: *public,
			}
			if req.Network, err = networkRequest(r, "sandbox create", *netProfile, *netPolicy); err != nil {
				return err
			}
			if idle.set {
				req.IdleSuspendAfterS = &idle.secs
			}
			if *noAutoWake {
				f := false
				req.AutoWake = &f
			}
			sb, op, err := c.CreateSandbox(ctx, req, *idem)
			if err != nil {
				return fmt.Errorf("create sandbox: %w", err)
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

// waitOp waits for op to finish and returns an error naming the reason when
// it did not succeed. The returned operation is the last one read.
func waitOp(ctx context.Context, c *client.Client, op model.Operation) (model.Operation, error) {
	if op.State.Done() {
		return op, opError(op)
	}
	done, err := c.WaitOperation(ctx, op.ID)
	if done.State.Done() {
		// The client reports a failed operation as an error too; the
		// operation's own reason says more.
		return done, opError(done)
	}
	if err != nil {
		return op, fmt.Errorf("wait for operation %s: %w", op.ID, err)
	}
	return done, opError(done)
}

// opError describes an operation that finished without succeeding.
func opError(op model.Operation) error {
	switch op.State {
	case model.OpSucceeded:
		return nil
	case model.OpFailed, model.OpCancelled:
		reason := op.Reason
		if reason == "" {
			reason = "no reason given"
		}
		return fmt.Errorf("%s operation %s %s: %s", op.Kind, op.ID, op.State, reason)
	}
	return fmt.Errorf("%s operation %s is still %s", op.Kind, op.ID, op.State)
}

var sandboxListCmd = &command{
	name:    "sandbox ls",
	args:    "[--state S] [--metadata K=V]... [--json]",
	summary: "list sandboxes (every page)",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		state := fs.String("state", "", "only sandboxes in this `state` (e.g. running)")
		meta := kvFlag{}
		fs.Var(meta, "metadata", "only sandboxes whose metadata has `K=V` (repeatable)")
		asJSON := fs.Bool("json", false, "print a JSON array")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 0 {
				return usagef("sandbox ls", "unexpected argument %q", args[0])
			}
			if *state != "" && !model.SandboxState(*state).Valid() {
				return usagef("sandbox ls", "unknown state %q", *state)
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			all, err := listAllSandboxes(ctx, c, *state, meta)
			if err != nil {
				return err
			}
			if *asJSON {
				return printJSON(r.stdout, all)
			}
			tw := tabwriter.NewWriter(r.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATE\tTEMPLATE\tCREATED")
			for _, sb := range all {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", sb.ID, sb.State, sb.Template, ago(sb.CreatedAt))
			}
			return tw.Flush()
		}
	},
}

// listAllSandboxes follows every page.
func listAllSandboxes(ctx context.Context, c *client.Client, state string, meta map[string]string) ([]model.Sandbox, error) {
	all := []model.Sandbox{}
	cursor := ""
	for {
		f := client.SandboxFilter{Metadata: meta, Cursor: cursor}
		if state != "" {
			f.States = []model.SandboxState{model.SandboxState(state)}
		}
		page, err := c.ListSandboxes(ctx, f)
		if err != nil {
			return nil, fmt.Errorf("list sandboxes: %w", err)
		}
		all = append(all, page.Sandboxes...)
		next := page.NextCursor
		if next == "" || next == cursor {
			return all, nil
		}
		cursor = next
	}
}

// ago formats t relative to now for tables.
func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := time.Since(t).Round(time.Second)
	switch {
	case d < 0:
		return t.Format(time.RFC3339)
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}

var sandboxGetCmd = &command{
	name:    "sandbox get",
	args:    "<sandbox-id> [--json]",
	summary: "show one sandbox",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		asJSON := fs.Bool("json", false, "print the sandbox as JSON")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 1 {
				return usagef("sandbox get", "want exactly one sandbox id, got %d arguments", len(args))
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			sb, err := c.GetSandbox(ctx, args[0])
			if err != nil {
				return fmt.Errorf("get sandbox %s: %w", args[0], err)
			}
			if *asJSON {
				return printJSON(r.stdout, sb)
			}
			printSandbox(r.stdout, sb)
			return nil
		}
	},
}

var sandboxTokenCmd = &command{
	name:    "sandbox token",
	args:    "<sandbox-id>",
	summary: "print the traffic token a sandbox's ports need (header E2b-Traffic-Access-Token)",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 1 {
				return usagef("sandbox token", "want exactly one sandbox id, got %d arguments", len(args))
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			tok, err := c.TrafficToken(ctx, args[0])
			if err != nil {
				return fmt.Errorf("get sandbox %s: %w", args[0], err)
			}
			if tok == "" {
				return fmt.Errorf("sandbox %s was created with public traffic: its ports need no token", args[0])
			}
			fmt.Fprintln(r.stdout, tok)
			return nil
		}
	},
}

func printSandbox(w io.Writer, sb model.Sandbox) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("ID", sb.ID)
	state := string(sb.State)
	if sb.DesiredState != "" && sb.DesiredState != sb.State {
		state += " (desired " + string(sb.DesiredState) + ")"
	}
	row("State", state)
	if sb.Reason != "" {
		row("Reason", sb.Reason)
	}
	tmpl := sb.Template
	if sb.TemplateDigest != "" {
		tmpl += " (" + sb.TemplateDigest + ")"
	}
	row("Template", tmpl)
	if sb.Runtime != "" {
		row("Runtime", sb.Runtime)
	}
	res := fmt.Sprintf("%d vCPU, %d MiB", sb.Resources.VCPUs, sb.Resources.MemoryMiB)
	if sb.Resources.DiskMiB > 0 {
		res += fmt.Sprintf(", %d MiB disk", sb.Resources.DiskMiB)
	}
	row("Resources", res)
	row("Created", stamp(sb.CreatedAt))
	row("Last activity", stamp(sb.LastActivityAt))
	row("Idle suspend", idleText(sb.IdleSuspendS))
	if sb.NoAutoWake {
		row("Auto-wake", "off")
	}
	if sb.SnapshotID != "" || sb.SnapshotBytes > 0 {
		snap := size(sb.SnapshotBytes)
		if sb.SnapshotID != "" {
			snap += " (" + sb.SnapshotID + ")"
		}
		label := "Snapshot"
		if sb.State != model.StateSuspended && sb.State != model.StateWaking {
			label = "Last snapshot"
		}
		row(label, snap)
	}
	if len(sb.Checkpoints) > 0 {
		names := make([]string, len(sb.Checkpoints))
		for i, cp := range sb.Checkpoints {
			names[i] = cp.Name
		}
		row("Checkpoints", strings.Join(names, ", "))
	}
	if sb.StartedFrom != "" {
		from := sb.StartedFrom
		if src := sb.Source; src != nil && from == model.StartedSnapshot {
			from += " (checkpoint " + src.Checkpoint + " of " + src.SandboxID + ")"
		}
		row("Started from", from)
	}
	if sb.ExpiresAt != nil {
		row("Expires", stamp(*sb.ExpiresAt))
	}
	if len(sb.Metadata) > 0 {
		row("Metadata", kvFlag(sb.Metadata).String())
	}
	if sb.WorkerID != "" {
		row("Worker", sb.WorkerID)
	}
	tw.Flush()
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format(time.RFC3339) + " (" + ago(t) + ")"
}

var sandboxRemoveCmd = &command{
	name:    "sandbox rm",
	args:    "<sandbox-id> [--no-wait] [--json]",
	summary: "delete a sandbox and wait until it is gone",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		noWait := fs.Bool("no-wait", false, "return once the delete is accepted")
		asJSON := fs.Bool("json", false, "print the delete operation as JSON")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 1 {
				return usagef("sandbox rm", "want exactly one sandbox id, got %d arguments", len(args))
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			op, err := c.DeleteSandbox(ctx, args[0])
			if err != nil {
				return fmt.Errorf("delete sandbox %s: %w", args[0], err)
			}
			if !*noWait {
				op, err = waitOp(ctx, c, op)
				if err != nil {
					if *asJSON {
						printJSON(r.stdout, op)
					}
					return fmt.Errorf("sandbox %s: %w", args[0], err)
				}
			}
			if *asJSON {
				return printJSON(r.stdout, op)
			}
			if *noWait {
				fmt.Fprintln(r.stdout, op.ID)
			} else {
				fmt.Fprintln(r.stdout, args[0])
			}
			return nil
		}
	},
}
