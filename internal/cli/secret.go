package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/airlock/airlock/internal/model"
)

// Secrets: named values of the org that the egress gateway injects into
// intercepted requests (docs/network.md, "Interception and secrets").
// The value is read from stdin, so it is in neither the shell's history
// nor the process list.

var secretSetCmd = &command{
	name:    "secret set",
	args:    "<name> < VALUE",
	summary: "create or replace a secret of the org from stdin (admin key); its value is never shown again",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 1 {
				return usagef("secret set", "want exactly one secret name, got %d arguments (the value is read from stdin)", len(args))
			}
			b, err := io.ReadAll(io.LimitReader(r.env.Stdin, 1<<20))
			if err != nil {
				return fmt.Errorf("read the value from stdin: %w", err)
			}
			value := strings.TrimRight(string(b), "\r\n") // echo and heredocs add one
			if value == "" {
				return usagef("secret set", "the value is empty: pipe it in, e.g. `printf %%s \"$TOKEN\" | airlock secret set NAME`")
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			s, err := c.PutSecret(ctx, args[0], value)
			if err != nil {
				return fmt.Errorf("set secret %s: %w", args[0], err)
			}
			fmt.Fprintf(r.stdout, "secret %s set\n", s.Name)
			return nil
		}
	},
}

var secretListCmd = &command{
	name:    "secret ls",
	args:    "[--json]",
	summary: "list the org's secrets (names and times, never values)",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		asJSON := fs.Bool("json", false, "print a JSON array")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 0 {
				return usagef("secret ls", "unexpected argument %q", args[0])
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			list, err := c.ListSecrets(ctx)
			if err != nil {
				return fmt.Errorf("list secrets: %w", err)
			}
			if *asJSON {
				if list == nil {
					list = []model.Secret{}
				}
				return printJSON(r.stdout, list)
			}
			tw := tabwriter.NewWriter(r.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tUPDATED")
			for _, s := range list {
				fmt.Fprintf(tw, "%s\t%s\n", s.Name, s.UpdatedAt.UTC().Format(time.RFC3339))
			}
			return tw.Flush()
		}
	},
}

var secretRemoveCmd = &command{
	name:    "secret rm",
	args:    "<name>",
	summary: "remove a secret of the org (admin key); requests that inject it are refused from then on",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 1 {
				return usagef("secret rm", "want exactly one secret name, got %d arguments", len(args))
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			if err := c.DeleteSecret(ctx, args[0]); err != nil {
				return fmt.Errorf("remove secret %s: %w", args[0], err)
			}
			return nil
		}
	},
}
