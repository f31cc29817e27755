package cli

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"text/tabwriter"

	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
)

// Warm-pool commands (operators: admin keys of the default org).

var poolSetCmd = &command{
	name:    "pool set",
	args:    "<template> <size> [--vcpus N] [--memory MiB] [--json]",
	summary: "keep <size> running sandboxes of a template ready for creates (operator key)",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		vcpus := fs.Int("vcpus", 0, "vCPUs of the members (0: 1); only creates asking for the same claim")
		mem := fs.Int("memory", 0, "memory of the members in `MiB` (0: 512)")
		asJSON := fs.Bool("json", false, "print the pool as JSON")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 2 {
				return usagef("pool set", "want <template> <size>, got %d arguments", len(args))
			}
			n, err := strconv.Atoi(args[1])
			if err != nil || n < 0 {
				return usagef("pool set", "size %q is not a number of sandboxes", args[1])
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			p, err := c.SetPool(ctx, args[0], apitypes.SetPoolRequest{Size: n, Resources: model.Resources{VCPUs: *vcpus, MemoryMiB: *mem}})
			if err != nil {
				return fmt.Errorf("set pool %s: %w", args[0], err)
			}
			if *asJSON {
				return printJSON(r.stdout, p)
			}
			fmt.Fprintf(r.stdout, "pool %s (%s): size %d, %d ready, %d starting\n", p.Template, p.Digest, p.Size, p.Ready, p.Starting)
			return nil
		}
	},
}

var poolListCmd = &command{
	name:    "pool ls",
	args:    "[--json]",
	summary: "list warm pools and how many members are ready (operator key)",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		asJSON := fs.Bool("json", false, "print a JSON array")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 0 {
				return usagef("pool ls", "unexpected argument %q", args[0])
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			ps, err := c.ListPools(ctx)
			if err != nil {
				return fmt.Errorf("list pools: %w", err)
			}
			if *asJSON {
				if ps == nil {
					ps = []apitypes.Pool{}
				}
				return printJSON(r.stdout, ps)
			}
			tw := tabwriter.NewWriter(r.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TEMPLATE\tDIGEST\tSIZE\tREADY\tSTARTING\tVCPUS\tMEMORY")
			for _, p := range ps {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d MiB\n", p.Template, shortDigest(p.Digest), p.Size, p.Ready, p.Starting, p.Resources.VCPUs, p.Resources.MemoryMiB)
			}
			return tw.Flush()
		}
	},
}

var poolRemoveCmd = &command{
	name:    "pool rm",
	args:    "<template>",
	summary: "remove a warm pool; its members are deleted (operator key)",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 1 {
				return usagef("pool rm", "want exactly one template, got %d arguments", len(args))
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			if err := c.DeletePool(ctx, args[0]); err != nil {
				return fmt.Errorf("remove pool %s: %w", args[0], err)
			}
			return nil
		}
	},
}

// shortDigest abbreviates "sha256:<64 hex>" to its first 12 hex characters.
func shortDigest(d string) string {
	const prefix = "sha256:"
	if len(d) > len(prefix)+12 {
		return d[:len(prefix)+12]
	}
	return d
}
