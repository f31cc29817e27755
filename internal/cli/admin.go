package cli

import (
	"context"
	"flag"
	"fmt"
	"text/tabwriter"

	"github.com/airlock/airlock/internal/api/apitypes"
)

var templateListCmd = &command{
	name:    "template ls",
	args:    "[--json]",
	summary: "list templates",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		asJSON := fs.Bool("json", false, "print a JSON array")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 0 {
				return usagef("template ls", "unexpected argument %q", args[0])
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			ts, err := c.ListTemplates(ctx)
			if err != nil {
				return fmt.Errorf("list templates: %w", err)
			}
			if *asJSON {
				return printJSON(r.stdout, ts)
			}
			tw := tabwriter.NewWriter(r.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tTAG\tDIGEST\tSIZE\tCREATED")
			for _, t := range ts {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.Name, t.Tag, t.Digest, size(t.SizeBytes), ago(t.CreatedAt))
			}
			return tw.Flush()
		}
	},
}

// size formats n bytes in binary units.
func size(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

var orgCreateCmd = &command{
	name:    "org create",
	args:    "<name> [--json]",
	summary: "create an org (admin key only); prints its id",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		asJSON := fs.Bool("json", false, "print the org as JSON")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 1 {
				return usagef("org create", "want exactly one org name, got %d arguments", len(args))
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			org, err := c.CreateOrg(ctx, args[0])
			if err != nil {
				return fmt.Errorf("create org %q: %w", args[0], err)
			}
			if *asJSON {
				return printJSON(r.stdout, org)
			}
			fmt.Fprintln(r.stdout, org.ID)
			return nil
		}
	},
}

var keyCreateCmd = &command{
	name:    "key create",
	args:    "--org <org-id> [--name N] [--admin] [--e2b] [--json]",
	summary: "create an API key in an org (admin key only); prints the secret, shown only once",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		org := fs.String("org", "", "the `org id` the key belongs to (required)")
		name := fs.String("name", "", "a `name` to recognise the key by")
		admin := fs.Bool("admin", false, "make it an admin key")
		e2b := fs.Bool("e2b", false, "issue an E2B-shaped key (e2b_…) for the E2B SDKs (E2B_API_KEY)")
		asJSON := fs.Bool("json", false, "print {\"key\", \"secret\"} as JSON")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 0 {
				return usagef("key create", "unexpected argument %q", args[0])
			}
			if *org == "" {
				return usagef("key create", "--org is required")
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			res, err := c.CreateKey(ctx, *org, apitypes.CreateKeyRequest{Name: *name, Admin: *admin, E2B: *e2b})
			if err != nil {
				return fmt.Errorf("create key in %s: %w", *org, err)
			}
			if *asJSON {
				return printJSON(r.stdout, res)
			}
			fmt.Fprintln(r.stdout, res.Secret)
			fmt.Fprintf(r.stderr, "key %s created in %s; the secret above is shown only once\n", res.Key.ID, res.Key.OrgID)
			return nil
		}
	},
}
