package cli

import (
	"context"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

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
	args:    "--org <org-id> [--name N] [--admin] [--e2b] [--expires D] [--json]",
	summary: "create an API key in an org (admin key only); prints the secret, shown only once",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		org := fs.String("org", "", "the `org id` the key belongs to (required)")
		name := fs.String("name", "", "a `name` to recognise the key by")
		admin := fs.Bool("admin", false, "make it an admin key")
		e2b := fs.Bool("e2b", false, "issue an E2B-shaped key (e2b_…) for the E2B SDKs (E2B_API_KEY)")
		expires := fs.Duration("expires", 0, "the key stops working after this `duration` (e.g. 720h; 0: never, until revoked)")
		asJSON := fs.Bool("json", false, "print {\"key\", \"secret\"} as JSON")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 0 {
				return usagef("key create", "unexpected argument %q", args[0])
			}
			if *org == "" {
				return usagef("key create", "--org is required")
			}
			if *expires < 0 {
				return usagef("key create", "--expires %s is negative; give a duration such as 720h", *expires)
			}
			req := apitypes.CreateKeyRequest{Name: *name, Admin: *admin, E2B: *e2b}
			if *expires > 0 {
				t := time.Now().Add(*expires).UTC()
				req.ExpiresAt = &t
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			res, err := c.CreateKey(ctx, *org, req)
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

var keyListCmd = &command{
	name:    "key ls",
	args:    "--org <org-id> [--json]",
	summary: "list an org's API keys (admin key only), revoked and expired ones too; never their secrets",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		org := fs.String("org", "", "the `org id` whose keys to list (required)")
		asJSON := fs.Bool("json", false, "print a JSON array")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 0 {
				return usagef("key ls", "unexpected argument %q", args[0])
			}
			if *org == "" {
				return usagef("key ls", "--org is required")
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			keys, err := c.ListKeys(ctx, *org)
			if err != nil {
				return fmt.Errorf("list keys of %s: %w", *org, err)
			}
			if *asJSON {
				return printJSON(r.stdout, keys)
			}
			tw := tabwriter.NewWriter(r.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tPREFIX\tADMIN\tCREATED\tSTATUS")
			now := time.Now()
			for _, k := range keys {
				status := "active"
				switch {
				case k.RevokedAt != nil:
					status = "revoked " + k.RevokedAt.Format(time.RFC3339)
				case k.ExpiresAt != nil && !now.Before(*k.ExpiresAt):
					status = "expired " + k.ExpiresAt.Format(time.RFC3339)
				case k.ExpiresAt != nil:
					status = "expires " + k.ExpiresAt.Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s…\t%v\t%s\t%s\n", k.ID, k.Name, k.Prefix, k.Admin, ago(k.CreatedAt), status)
			}
			return tw.Flush()
		}
	},
}

var keyRemoveCmd = &command{
	name:    "key rm",
	args:    "--org <org-id> <key-id>...",
	summary: "revoke API keys (admin key only): every server refuses them from their next request on",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		org := fs.String("org", "", "the `org id` the keys belong to (required)")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) == 0 {
				return usagef("key rm", "want at least one key id (see airlock key ls --org %s)", *org)
			}
			if *org == "" {
				return usagef("key rm", "--org is required")
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			for _, id := range args {
				k, err := c.RevokeKey(ctx, *org, id)
				if err != nil {
					return fmt.Errorf("revoke key %s of %s: %w", id, *org, err)
				}
				fmt.Fprintf(r.stdout, "%s revoked at %s\n", k.ID, k.RevokedAt.Format(time.RFC3339))
			}
			return nil
		}
	},
}
