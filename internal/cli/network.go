package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
)

// Egress commands (docs/network.md): operators' network profiles, and a
// sandbox's policy.

// readPolicy reads a NetworkPolicyV1 file ("-": stdin).
func readPolicy(r *runner, path string) (json.RawMessage, error) {
	var b []byte
	var err error
	if path == "-" {
		b, err = io.ReadAll(io.LimitReader(r.env.Stdin, 1<<20))
	} else {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("read policy %s: %w", path, err)
	}
	if !json.Valid(b) {
		return nil, fmt.Errorf("policy %s is not JSON (a NetworkPolicyV1 document: docs/network.md)", path)
	}
	return b, nil
}

// networkRequest is --network-profile / --network-policy ("" both: nil).
func networkRequest(r *runner, cmd, profile, policyFile string) (*apitypes.NetworkRequest, error) {
	switch {
	case profile != "" && policyFile != "":
		return nil, usagef(cmd, "set a profile or a policy, not both")
	case profile != "":
		return &apitypes.NetworkRequest{Profile: profile}, nil
	case policyFile != "":
		p, err := readPolicy(r, policyFile)
		if err != nil {
			return nil, err
		}
		return &apitypes.NetworkRequest{Policy: p}, nil
	}
	return nil, nil
}

func printNetwork(r *runner, n *model.SandboxNetwork, asJSON bool) error {
	if asJSON {
		return printJSON(r.stdout, n)
	}
	if n == nil {
		fmt.Fprintln(r.stdout, "no policy recorded (the worker's default applies)")
		return nil
	}
	from := "inline policy"
	if n.Profile != "" {
		from = "profile " + n.Profile
	}
	fmt.Fprintf(r.stdout, "%s\n%s\n", from, n.Policy)
	return nil
}

var sandboxNetworkCmd = &command{
	name:    "sandbox network",
	args:    "get <sandbox-id> | set <sandbox-id> (--profile NAME | --policy FILE) | log <sandbox-id> [--after N] [--limit N] [--json]",
	summary: "show or replace a sandbox's egress policy (set: new connections follow it at once; open ones it denies are cut); log: its egress decisions",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		profile := fs.String("profile", "", "set: network profile `name` (see `airlock network-profile ls`)")
		policy := fs.String("policy", "", "set: NetworkPolicyV1 JSON `file` (- for stdin)")
		asJSON := fs.Bool("json", false, "print {profile, policy} (log: the page) as JSON")
		after := fs.Int64("after", 0, "log: entries after sequence number `N` (the next of an earlier page)")
		limit := fs.Int("limit", 0, "log: at most `N` entries (0: 1000)")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 2 || args[0] != "get" && args[0] != "set" && args[0] != "log" {
				return usagef("sandbox network", "want get <sandbox-id>, set <sandbox-id> or log <sandbox-id>")
			}
			if args[0] == "log" {
				if *profile != "" || *policy != "" {
					return usagef("sandbox network", "--profile and --policy are for set")
				}
				return networkLog(ctx, r, args[1], *after, *limit, *asJSON) // netlog.go
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			id := args[1]
			if args[0] == "get" {
				if *profile != "" || *policy != "" {
					return usagef("sandbox network", "--profile and --policy are for set")
				}
				n, err := c.SandboxNetwork(ctx, id)
				if err != nil {
					return fmt.Errorf("get network of %s: %w", id, err)
				}
				return printNetwork(r, n, *asJSON)
			}
			req, err := networkRequest(r, "sandbox network", *profile, *policy)
			if err != nil {
				return err
			}
			if req == nil {
				return usagef("sandbox network", "set needs --profile or --policy")
			}
			n, err := c.SetSandboxNetwork(ctx, id, *req)
			if err != nil {
				return fmt.Errorf("set network of %s: %w", id, err)
			}
			return printNetwork(r, n, *asJSON)
		}
	},
}

var networkProfileSetCmd = &command{
	name:    "network-profile set",
	args:    "<name> --policy FILE [--description TEXT] [--json]",
	summary: "create or replace a network profile (operator key)",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		policy := fs.String("policy", "", "NetworkPolicyV1 JSON `file` (- for stdin)")
		desc := fs.String("description", "", "what the profile is for")
		asJSON := fs.Bool("json", false, "print the profile as JSON")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 1 {
				return usagef("network-profile set", "want exactly one profile name, got %d arguments", len(args))
			}
			if *policy == "" {
				return usagef("network-profile set", "--policy FILE is required")
			}
			p, err := readPolicy(r, *policy)
			if err != nil {
				return err
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			prof, err := c.PutNetworkProfile(ctx, args[0], apitypes.NetworkProfileRequest{Description: *desc, Policy: p})
			if err != nil {
				return fmt.Errorf("set network profile %s: %w", args[0], err)
			}
			if *asJSON {
				return printJSON(r.stdout, prof)
			}
			fmt.Fprintf(r.stdout, "network profile %s set\n", prof.Name)
			return nil
		}
	},
}

var networkProfileListCmd = &command{
	name:    "network-profile ls",
	args:    "[--json]",
	summary: "list network profiles (built-in and operators')",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		asJSON := fs.Bool("json", false, "print a JSON array")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 0 {
				return usagef("network-profile ls", "unexpected argument %q", args[0])
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			ps, err := c.ListNetworkProfiles(ctx)
			if err != nil {
				return fmt.Errorf("list network profiles: %w", err)
			}
			if *asJSON {
				if ps == nil {
					ps = []model.NetworkProfile{}
				}
				return printJSON(r.stdout, ps)
			}
			tw := tabwriter.NewWriter(r.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tBUILT-IN\tDESCRIPTION")
			for _, p := range ps {
				fmt.Fprintf(tw, "%s\t%v\t%s\n", p.Name, p.Builtin, p.Description)
			}
			return tw.Flush()
		}
	},
}

var networkProfileRemoveCmd = &command{
	name:    "network-profile rm",
	args:    "<name>",
	summary: "remove a network profile; sandboxes keep the policy they were given (operator key)",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 1 {
				return usagef("network-profile rm", "want exactly one profile name, got %d arguments", len(args))
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			if err := c.DeleteNetworkProfile(ctx, args[0]); err != nil {
				return fmt.Errorf("remove network profile %s: %w", args[0], err)
			}
			return nil
		}
	},
}
