package cli

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/airlock/airlock/internal/api/apitypes"
)

// e2bEnvCmd prints what the unmodified E2B SDKs need to drive this
// installation: the API URL for the control plane, the same URL as the
// sandbox URL (the SDKs then send sandbox traffic, envd's and every port's
// such as the code interpreter's 49999, there with E2b-Sandbox-Id and
// E2b-Sandbox-Port headers: no wildcard DNS needed), and an E2B-shaped key.
var e2bEnvCmd = &command{
	name:    "e2b env",
	args:    "[--org ORG] [--key E2B_KEY] [--name N]",
	summary: "print the E2B_* environment the E2B SDKs need to use this server (creates an E2B key unless --key is given)",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		org := fs.String("org", "org-default", "the `org id` of the new key")
		key := fs.String("key", "", "use this E2B `key` (e2b_…) instead of creating one")
		name := fs.String("name", "e2b-env", "`name` of the new key")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 0 {
				return usagef("e2b env", "unexpected argument %q", args[0])
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			secret := *key
			if secret == "" {
				res, err := c.CreateKey(ctx, *org, apitypes.CreateKeyRequest{Name: *name, E2B: true})
				if err != nil {
					return fmt.Errorf("create an E2B key in %s (an admin key is needed; or pass --key): %w", *org, err)
				}
				secret = res.Secret
				fmt.Fprintf(r.stderr, "# key %s created in %s\n", res.Key.ID, res.Key.OrgID)
			}
			u := strings.TrimRight(c.BaseURL, "/")
			fmt.Fprintf(r.stdout, "export E2B_API_URL=%s\nexport E2B_SANDBOX_URL=%s\nexport E2B_API_KEY=%s\n", u, u, secret)
			return nil
		}
	},
}
