package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
)

// lifecycleCmd builds `sandbox pause|resume|suspend|wake`.
func lifecycleCmd(verb, summary string, call func(*client.Client, context.Context, string) (model.Operation, error)) *command {
	name := "sandbox " + verb
	return &command{
		name:    name,
		args:    "<sandbox-id> [--no-wait] [--json]",
		summary: summary,
		setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
			noWait := fs.Bool("no-wait", false, "return once the request is accepted; prints the operation id")
			asJSON := fs.Bool("json", false, "print {\"sandbox\", \"operation\"} as JSON")
			return func(ctx context.Context, r *runner, args []string) error {
				if len(args) != 1 {
					return usagef(name, "want exactly one sandbox id, got %d arguments", len(args))
				}
				id := args[0]
				c, err := r.client()
				if err != nil {
					return err
				}
				op, err := call(c, ctx, id)
				if err != nil {
					return fmt.Errorf("%s sandbox %s: %w", verb, id, err)
				}
				return finishLifecycle(ctx, r, c, id, op, *noWait, *asJSON)
			}
		},
	}
}

// finishLifecycle waits for a sandbox's operation op (unless noWait) and
// prints the sandbox (plain), the operation id (noWait) or both as JSON.
func finishLifecycle(ctx context.Context, r *runner, c *client.Client, id string, op model.Operation, noWait, asJSON bool) error {
	var waitErr error
	if !noWait {
		op, waitErr = waitOp(ctx, c, op)
	}
	sb, err := c.GetSandbox(ctx, id)
	if err != nil {
		return fmt.Errorf("get sandbox %s: %w", id, err)
	}
	switch {
	case asJSON:
		if err := printJSON(r.stdout, createResult{Sandbox: sb, Operation: op}); err != nil {
			return err
		}
	case noWait:
		fmt.Fprintln(r.stdout, op.ID)
	case waitErr == nil:
		printSandbox(r.stdout, sb)
	}
	if waitErr != nil {
		return fmt.Errorf("sandbox %s: %w", id, waitErr)
	}
	return nil
}

var (
	sandboxPauseCmd = lifecycleCmd("pause", "pause a running sandbox (memory stays on its worker) and wait",
		(*client.Client).PauseSandbox)
	sandboxResumeCmd = lifecycleCmd("resume", "resume a paused sandbox and wait",
		(*client.Client).ResumeSandbox)
	sandboxSuspendCmd = lifecycleCmd("suspend", "suspend a running or paused sandbox to a snapshot and wait",
		(*client.Client).SuspendSandbox)
	sandboxWakeCmd = lifecycleCmd("wake", "wake a suspended (or resume a paused) sandbox and wait",
		(*client.Client).WakeSandbox)
)

// idleFlag parses --idle-suspend-after: a duration ("6h", "90m"), "0" or
// "never" (disabled) and, where allowed, "default".
type idleFlag struct {
	set      bool
	secs     int64 // -1: default
	allowDef bool
}

func (f *idleFlag) String() string {
	if f == nil || !f.set {
		return ""
	}
	if f.secs < 0 {
		return "default"
	}
	return (time.Duration(f.secs) * time.Second).String()
}

func (f *idleFlag) Set(s string) error {
	switch s {
	case "0", "never", "off":
		f.set, f.secs = true, 0
		return nil
	case "default":
		if !f.allowDef {
			return fmt.Errorf("\"default\" is not allowed here; omit the flag")
		}
		f.set, f.secs = true, -1
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < time.Second {
		return fmt.Errorf("want a duration of at least 1s such as 6h or 90m, 0 (never) or default")
	}
	f.set, f.secs = true, int64(d/time.Second)
	return nil
}

var orgSetCmd = &command{
	name:    "org set",
	args:    "<org-id> [--features a,b] [--idle-suspend-after 6h|0|default] [--max-sandboxes N] [--max-vcpus N] [--max-memory-mib N] [--max-disk-mib N] [--max-checkpoints N] [--max-transfers N] [--json]",
	summary: "change an org's feature gates and quotas (default org admins) or idle auto-suspend delay (its admins)",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		features := fs.String("features", "", "comma-separated `list` of feature gates to turn on (replaces the current ones; \"\" turns all off); known: snapshots, unsigned_imports")
		idle := &idleFlag{allowDef: true}
		fs.Var(idle, "idle-suspend-after", "suspend the org's new sandboxes after this long without activity (`duration`; 0 never; default: 6h)")
		quotas := map[string]*int{}
		for _, q := range []struct{ name, help string }{
			{"max-sandboxes", "sandboxes holding capacity (all but suspended, failed, deleted)"},
			{"max-vcpus", "vCPUs of those sandboxes"},
			{"max-memory-mib", "memory of those sandboxes, MiB"},
			{"max-disk-mib", "disk_mib of all the org's sandboxes (suspended ones too), MiB"},
			{"max-checkpoints", "stored checkpoints"},
			{"max-transfers", "checkpoint exports and imports in progress"},
		} {
			quotas[q.name] = fs.Int(q.name, 0, "quota: at most `N` "+q.help+"; 0 is unlimited")
		}
		asJSON := fs.Bool("json", false, "print the org as JSON")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 1 {
				return usagef("org set", "want exactly one org id, got %d arguments", len(args))
			}
			var req client.UpdateOrgRequest
			var qp apitypes.QuotasPatch
			quota := map[string]**int{
				"max-sandboxes": &qp.Sandboxes, "max-vcpus": &qp.VCPUs, "max-memory-mib": &qp.MemoryMiB,
				"max-disk-mib": &qp.DiskMiB, "max-checkpoints": &qp.Checkpoints, "max-transfers": &qp.Transfers,
			}
			fs.Visit(func(f *flag.Flag) {
				if dst, ok := quota[f.Name]; ok {
					*dst = quotas[f.Name]
					req.Quotas = &qp
				}
				if f.Name == "features" {
					list := []string{}
					for _, s := range strings.Split(*features, ",") {
						if s = strings.TrimSpace(s); s != "" {
							list = append(list, s)
						}
					}
					req.Features = &list
				}
			})
			if idle.set {
				req.IdleSuspendAfterS = &idle.secs
			}
			if req.Features == nil && req.IdleSuspendAfterS == nil && req.Quotas == nil {
				return usagef("org set", "nothing to change: give --features, --idle-suspend-after and/or a --max-… quota")
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			org, err := c.UpdateOrg(ctx, args[0], req)
			if err != nil {
				return fmt.Errorf("update org %s: %w", args[0], err)
			}
			if *asJSON {
				return printJSON(r.stdout, org)
			}
			printOrg(r.stdout, org)
			return nil
		}
	},
}

var orgGetCmd = &command{
	name:    "org get",
	args:    "<org-id> [--json]",
	summary: "show an org, its settings, and its usage against its quotas",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		asJSON := fs.Bool("json", false, "print the org as JSON")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 1 {
				return usagef("org get", "want exactly one org id, got %d arguments", len(args))
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			org, err := c.GetOrg(ctx, args[0])
			if err != nil {
				return fmt.Errorf("get org %s: %w", args[0], err)
			}
			if *asJSON {
				return printJSON(r.stdout, org)
			}
			printOrg(r.stdout, org)
			return nil
		}
	},
}

func printOrg(w io.Writer, org apitypes.Org) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("ID", org.ID)
	row("Name", org.Name)
	features := strings.Join(org.Features, ", ")
	if features == "" {
		features = "-"
	}
	row("Features", features)
	idle := "default (" + idleText(int64(model.DefaultIdleSuspend/time.Second)) + ")"
	if org.IdleSuspendS != nil {
		idle = idleText(*org.IdleSuspendS)
	}
	row("Idle suspend", idle)
	q, u := org.Quotas, org.Usage
	for _, l := range []struct {
		name        string
		used, limit int
	}{
		{"Sandboxes", u.Sandboxes, q.Sandboxes}, {"vCPUs", u.VCPUs, q.VCPUs}, {"Memory MiB", u.MemoryMiB, q.MemoryMiB},
		{"Disk MiB", u.DiskMiB, q.DiskMiB}, {"Checkpoints", u.Checkpoints, q.Checkpoints}, {"Transfers", u.Transfers, q.Transfers},
	} {
		limit := "unlimited"
		if l.limit > 0 {
			limit = strconv.Itoa(l.limit)
		}
		row(l.name, fmt.Sprintf("%d of %s", l.used, limit))
	}
	row("Created", stamp(org.CreatedAt))
	tw.Flush()
}

// idleText renders an idle auto-suspend delay in seconds.
func idleText(secs int64) string {
	if secs <= 0 {
		return "never"
	}
	return "after " + (time.Duration(secs) * time.Second).String()
}
