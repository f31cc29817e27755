package cli

import (
	"context"
	"flag"
	"fmt"
	"net"

	"github.com/airlock/airlock/internal/mcp"
)

var mcpCmd = &command{
	name:    "mcp",
	args:    "[--listen ADDR]",
	summary: "serve the Airlock tools to AI agents over MCP (stdio, or streamable HTTP at ADDR/mcp); see docs/mcp.md",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		listen := fs.String("listen", "", "serve MCP's streamable HTTP transport on `ADDR` (e.g. 127.0.0.1:7080) at /mcp instead of stdio")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 0 {
				return usagef("mcp", "unexpected argument %q", args[0])
			}
			cfg, err := LoadConfig(r.env.getenv, r.global.url, r.global.apiKey)
			if *listen == "" {
				if err != nil {
					return err
				}
				return mcp.ServeStdio(ctx, mcp.Config{URL: cfg.URL, APIKey: cfg.APIKey}, r.env.Stdin, r.stdout)
			}
			if err != nil {
				// Over HTTP every request may bring its own key.
				cfg, _ = LoadConfig(r.env.getenv, r.global.url, "-")
				cfg.APIKey = ""
				fmt.Fprintf(r.stderr, "airlock mcp: no default API key (%v); every request must send Authorization: Bearer <key>\n", err)
			}
			return mcp.ListenAndServe(ctx, mcp.Config{URL: cfg.URL, APIKey: cfg.APIKey}, *listen, func(a net.Addr) {
				fmt.Fprintf(r.stderr, "airlock mcp: serving MCP on http://%s%s for %s\n", a, mcp.Path, cfg.URL)
			})
		}
	},
}
