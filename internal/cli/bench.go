package cli

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/airlock/airlock/internal/bench"
)

var benchCmd = &command{
	name:    "bench",
	args:    "[--runtime gvisor] [--iterations N] [--concurrency C] [--exec-iterations M] [--file-mib S] [--file-runs R] [--out FILE]",
	summary: "measure create→first-exec, exec round trip and file throughput against the API; prints a JSON report",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		rt := fs.String("runtime", "", "sandbox `runtime` (default: the server's)")
		tmpl := fs.String("template", "base", "`template` for every sandbox")
		n := fs.Int("iterations", 20, "sandboxes per create→first-exec measurement, and `runsc do` runs")
		conc := fs.Int("concurrency", 10, "sandboxes created at once in the concurrent measurement")
		execN := fs.Int("exec-iterations", 200, "exec round trips of `true`")
		fileMiB := fs.Int("file-mib", 64, "size of the throughput file in `MiB`")
		fileRuns := fs.Int("file-runs", 5, "writes and reads of the throughput file")
		out := fs.String("out", "", "also write the report to `FILE`")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 0 {
				return usagef("bench", "unexpected argument %q", args[0])
			}
			for name, v := range map[string]int{"iterations": *n, "concurrency": *conc, "exec-iterations": *execN, "file-mib": *fileMiB, "file-runs": *fileRuns} {
				if v <= 0 {
					return usagef("bench", "--%s must be positive", name)
				}
			}
			cfg, err := LoadConfig(r.env.getenv, r.global.url, r.global.apiKey)
			if err != nil {
				return err
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			runsc, why := bench.FindRunsc(r.env.getenv, DataDir(r.env.getenv))
			rep, runErr := bench.Run(ctx, bench.Config{
				Client: c, APIURL: cfg.URL, Runtime: *rt, Template: *tmpl,
				Sandboxes: *n, Concurrency: *conc, ExecIterations: *execN,
				FileBytes: int64(*fileMiB) << 20, FileRuns: *fileRuns,
				Runsc: runsc, RunscWhy: why, Progress: r.stderr,
			})
			if err := printJSON(r.stdout, rep); err != nil {
				return err
			}
			if *out != "" {
				f, err := os.Create(*out)
				if err != nil {
					return fmt.Errorf("write report: %w", err)
				}
				if err := printJSON(f, rep); err != nil {
					f.Close()
					return err
				}
				if err := f.Close(); err != nil {
					return fmt.Errorf("write report: %w", err)
				}
			}
			return runErr
		}
	},
}
