package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/bench"
)

var benchCmd = &command{
	name:    "bench",
	args:    "[--runtime gvisor] [--only GROUPS] [--iterations N] [--concurrency C] [--exec-iterations M] [--file-mib S] [--file-runs R] [--lifecycle-runs L] [--suspend-runs R] [--suspend-mib 16,256] [--pool-size P] [--pool-runs W] [--fork-runs F] [--fork-count K] [--egress-requests N] [--egress-mib S] [--egress-runs R] [--templates-runs N] [--templates-boots B] [--templates-cold=false] [--scale-burst N] [--scale-concurrency 1,10,50,100] [--scale-idle 10,100,500,1000] [--metrics-url URL] [--plots DIR] [--data-dir DIR] [--out FILE] | plot REPORT.json --plots DIR",
	summary: "measure create→first-exec (cold and from a warm pool), exec round trip, file throughput, pause/resume and suspend/wake against the API, (--only templates, as root) template import, build and start-command templates, (--only scale) scaling curves of create bursts and idle sandboxes with PNG plots (--plots; `bench plot` redraws them from a report), or (--only egress, as root) this machine's egress gateway data path; prints a JSON report",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		rt := fs.String("runtime", "", "sandbox `runtime` (default: the server's)")
		tmpl := fs.String("template", "base", "`template` for every sandbox")
		n := fs.Int("iterations", 20, "sandboxes per create→first-exec measurement, and `runsc do` runs")
		conc := fs.Int("concurrency", 10, "sandboxes created at once in the concurrent measurement")
		execN := fs.Int("exec-iterations", 200, "exec round trips of `true`")
		fileMiB := fs.Int("file-mib", 64, "size of the throughput file in `MiB`")
		fileRuns := fs.Int("file-runs", 5, "writes and reads of the throughput file")
		lifecycleRuns := fs.Int("lifecycle-runs", 20, "pause and resume round trips")
		suspendRuns := fs.Int("suspend-runs", 5, "suspend and wake round trips per dirtied size")
		suspendMiB := fs.String("suspend-mib", "16,256", "comma-separated `MiB` a process dirties before the suspend/wake measurements")
		poolSize := fs.Int("pool-size", 3, "size of the warm pool the warm-create measurement configures (at least 3; needs an operator key)")
		poolRuns := fs.Int("pool-runs", 10, "creates served from the warm pool")
		forkRuns := fs.Int("fork-runs", 5, "checkpoint + fork rounds (group fork; the org needs the feature gate snapshots)")
		forkCount := fs.Int("fork-count", 10, "sandboxes forked per round (group fork; at most "+strconv.Itoa(apitypes.MaxForks)+")")
		egressN := fs.Int("egress-requests", 200, "timed requests per egress latency case and path")
		egressMiB := fs.Int("egress-mib", 256, "size of the egress download and upload in `MiB`")
		egressRuns := fs.Int("egress-runs", 5, "timed egress downloads and uploads per path")
		templatesRuns := fs.Int("templates-runs", 5, "template imports and cached rebuilds of the base recipe (group templates)")
		templatesBoots := fs.Int("templates-boots", 10, "start-command template variants booted (group templates)")
		templatesCold := fs.Bool("templates-cold", true, "time one --no-cache build of the base recipe (group templates; minutes)")
		scaleBurst := fs.Int("scale-burst", 100, "sandboxes per create burst (group scale; at concurrency 1 at most 20)")
		scaleConc := fs.String("scale-concurrency", "1,10,50,100", "comma-separated create requests in flight, one burst each (group scale)")
		scaleIdle := fs.String("scale-idle", "10,100,500,1000", "comma-separated numbers of idle running sandboxes to measure at, ascending (group scale)")
		metricsURL := fs.String("metrics-url", "", "the server's Prometheus `URL` (airlock up --metrics-addr ADDR: http://ADDR/metrics) the reconcile time is read from (group scale)")
		plots := fs.String("plots", "", "write the scale group's PNG plots into `DIR`")
		dataDir := fs.String("data-dir", "", "the worker's data `directory`: runsc for the baseline, and where group templates imports (default $AIRLOCK_DATA_DIR, else ~/.local/share/airlock)")
		only := fs.String("only", "", "comma-separated measurement `groups` ("+strings.Join(bench.Groups, ", ")+"; default all but egress)")
		out := fs.String("out", "", "also write the report to `FILE`")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) > 0 && args[0] == "plot" {
				return benchPlot(r, args[1:], *plots)
			}
			if len(args) != 0 {
				return usagef("bench", "unexpected argument %q", args[0])
			}
			for name, v := range map[string]int{"iterations": *n, "concurrency": *conc, "exec-iterations": *execN, "file-mib": *fileMiB, "file-runs": *fileRuns,
				"lifecycle-runs": *lifecycleRuns, "suspend-runs": *suspendRuns, "pool-size": *poolSize, "pool-runs": *poolRuns, "fork-runs": *forkRuns, "fork-count": *forkCount,
				"egress-requests": *egressN, "egress-mib": *egressMiB, "egress-runs": *egressRuns,
				"templates-runs": *templatesRuns, "templates-boots": *templatesBoots, "scale-burst": *scaleBurst} {
				if v <= 0 {
					return usagef("bench", "--%s must be positive", name)
				}
			}
			if *forkCount > apitypes.MaxForks {
				return usagef("bench", "--fork-count must be 1 … %d", apitypes.MaxForks)
			}
			var sizes []int
			for _, f := range strings.Split(*suspendMiB, ",") {
				v, err := strconv.Atoi(strings.TrimSpace(f))
				if err != nil || v <= 0 {
					return usagef("bench", "--suspend-mib %q: want positive MiB values separated by commas", *suspendMiB)
				}
				sizes = append(sizes, v)
			}
			scaleC, err := positiveList("scale-concurrency", *scaleConc)
			if err != nil {
				return err
			}
			idle, err := positiveList("scale-idle", *scaleIdle)
			if err != nil {
				return err
			}
			if !slices.IsSorted(idle) || len(slices.Compact(slices.Clone(idle))) != len(idle) {
				return usagef("bench", "--scale-idle %q: the levels must ascend (each adds sandboxes to the ones before)", *scaleIdle)
			}
			if *metricsURL != "" {
				if u, err := url.Parse(*metricsURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
					return usagef("bench", "--metrics-url %q: want an http(s) URL such as http://127.0.0.1:9090/metrics", *metricsURL)
				}
			}
			var groups []string
			if *only != "" {
				for _, g := range strings.Split(*only, ",") {
					g = strings.TrimSpace(g)
					if !slices.Contains(bench.Groups, g) {
						return usagef("bench", "--only: unknown group %q; groups are %s", g, strings.Join(bench.Groups, ", "))
					}
					groups = append(groups, g)
				}
			}
			if *plots != "" && !slices.Contains(groups, bench.GroupScale) {
				return usagef("bench", "--plots draws the scale group: add scale to --only")
			}
			// The egress group measures this machine, not the API.
			var c *client.Client
			apiURL := ""
			if len(groups) == 0 || slices.ContainsFunc(groups, func(g string) bool { return g != bench.GroupEgress }) {
				cfg, err := LoadConfig(r.env.getenv, r.global.url, r.global.apiKey)
				if err != nil {
					return err
				}
				if c, err = r.client(); err != nil {
					return err
				}
				apiURL = cfg.URL
			}
			dd := *dataDir
			if dd == "" {
				dd = DataDir(r.env.getenv)
			}
			runsc, why := bench.FindRunsc(r.env.getenv, dd)
			self, _ := os.Executable() // "" skips the import measurement

			rep, runErr := bench.Run(ctx, bench.Config{
				Client: c, APIURL: apiURL, Runtime: *rt, Template: *tmpl,
				Sandboxes: *n, Concurrency: *conc, ExecIterations: *execN,
				FileBytes: int64(*fileMiB) << 20, FileRuns: *fileRuns,
				LifecycleRuns: *lifecycleRuns, SuspendRuns: *suspendRuns, SuspendMiB: sizes,
				PoolSize: *poolSize, PoolRuns: *poolRuns, Only: groups,
				ForkRuns: *forkRuns, ForkCount: *forkCount,
				TemplatesRuns: *templatesRuns, TemplatesBoots: *templatesBoots, TemplatesCold: *templatesCold,
				Airlock: self, DataDir: dd,
				ScaleBurst: *scaleBurst, ScaleConcurrency: scaleC, ScaleIdle: idle, MetricsURL: *metricsURL,
				Runsc: runsc, RunscWhy: why, Progress: r.stderr,
				EgressRun:    r.env.BenchEgress,
				EgressConfig: bench.EgressConfig{Requests: *egressN, DownloadBytes: int64(*egressMiB) << 20, DownloadRuns: *egressRuns, Runsc: runsc, RunscWhy: why},
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
			if *plots != "" && rep.Scale != nil {
				paths, err := bench.WritePlots(rep, *plots)
				for _, p := range paths {
					fmt.Fprintf(r.stderr, "bench: wrote %s\n", p)
				}
				if err != nil {
					return errors.Join(runErr, err)
				}
			}
			return runErr
		}
	},
}

// positiveList parses a flag of comma-separated positive integers.
func positiveList(flagName, v string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, usagef("bench", "--%s %q: want positive integers separated by commas", flagName, v)
		}
		out = append(out, n)
	}
	return out, nil
}

// benchPlot is `airlock bench plot REPORT.json --plots DIR`: the scale
// group's PNGs drawn again from a report written with --out.
func benchPlot(r *runner, args []string, dir string) error {
	if len(args) != 1 {
		return usagef("bench", "bench plot takes one report file: airlock bench plot REPORT.json --plots DIR")
	}
	if dir == "" {
		return usagef("bench", "bench plot needs --plots DIR, the directory to write the PNGs into")
	}
	rep, err := bench.ReadReport(args[0])
	if err != nil {
		return err
	}
	paths, err := bench.WritePlots(rep, dir)
	for _, p := range paths {
		fmt.Fprintln(r.stdout, p)
	}
	return err
}
