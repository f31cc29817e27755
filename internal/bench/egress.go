package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// GroupEgress measures the worker's egress gateway data path on this
// machine (not through the API): see EgressReport. It needs root and
// network namespaces, and it runs only when asked for (--only egress).
const GroupEgress = "egress"

// EgressFunc runs the egress group. The implementation
// (internal/bench/egressbench) links the gateway, the network namespaces
// and the test internet — worker code this package and the CLI do not
// link — so the airlock binary hands it in (Config.EgressRun).
type EgressFunc func(ctx context.Context, cfg EgressConfig) (EgressReport, error)

// EgressConfig says how much the egress group measures.
type EgressConfig struct {
	// Requests is how many timed requests each latency case sends on
	// each path (default 200), after a few untimed ones.
	Requests int
	// DownloadBytes is the size of the throughput transfer (default 256
	// MiB) and DownloadRuns how often it is timed on each path (default 5).
	DownloadBytes int64
	DownloadRuns  int
	// Runsc is the runsc binary for the curl-in-gVisor cases ("": they
	// are skipped, RunscWhy says why).
	Runsc    string
	RunscWhy string
	// Progress receives one line per step (nil: discarded).
	Progress io.Writer
}

// Defaults fills in the zero fields.
func (c *EgressConfig) Defaults() {
	if c.Requests <= 0 {
		c.Requests = 200
	}
	if c.DownloadBytes <= 0 {
		c.DownloadBytes = 256 << 20
	}
	if c.DownloadRuns <= 0 {
		c.DownloadRuns = 5
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
}

// EgressReport is the egress group's result: each case measured on two
// paths in the same run, interleaved so that noise hits both.
type EgressReport struct {
	// Skipped says why nothing was measured (no root, no network
	// namespaces, a binary without the group); empty when it ran.
	Skipped string `json:"skipped,omitempty"`
	// Paths describes the direct and the gateway data path.
	Paths map[string]string `json:"paths,omitempty"`
	// Policy is the NetworkPolicyV1 the gateway enforced.
	Policy  string         `json:"policy,omitempty"`
	Cases   []EgressCase   `json:"cases,omitempty"`
	Targets []EgressTarget `json:"targets,omitempty"`
}

// EgressCase is one row: the same request sent directly and through the
// gateway.
type EgressCase struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Rule is the policy rule that admits it ("" when none is needed).
	Rule    string `json:"rule,omitempty"`
	Direct  *Stats `json:"direct,omitempty"`
	Gateway *Stats `json:"gateway,omitempty"`
	// For latencies (ms): gateway minus direct.
	AddedP50  *float64 `json:"added_p50_ms,omitempty"`
	AddedP99  *float64 `json:"added_p99_ms,omitempty"`
	AddedMean *float64 `json:"added_mean_ms,omitempty"`
	// For throughputs (MB/s): gateway over direct, of p50 and mean.
	RatioP50  *float64 `json:"ratio_p50,omitempty"`
	RatioMean *float64 `json:"ratio_mean,omitempty"`
	// Skipped says why the case was not measured ("interception not
	// available"); Error why it failed.
	Skipped string `json:"skipped,omitempty"`
	Error   string `json:"error,omitempty"`
}

// Throughput reports whether the case is a throughput (MB/s) rather than
// a latency.
func (c *EgressCase) Throughput() bool {
	return (c.Direct != nil && c.Direct.Unit == "MB/s") || (c.Gateway != nil && c.Gateway.Unit == "MB/s")
}

// Derive fills in the added latencies or the ratios from Direct and
// Gateway.
func (c *EgressCase) Derive() {
	if c.Direct == nil || c.Gateway == nil || c.Direct.N == 0 || c.Gateway.N == 0 {
		return
	}
	if c.Throughput() {
		if r, ok := Ratio(c.Gateway.P50, c.Direct.P50); ok {
			c.RatioP50 = &r
		}
		if r, ok := Ratio(c.Gateway.Mean, c.Direct.Mean); ok {
			c.RatioMean = &r
		}
		return
	}
	d := func(g, dir float64) *float64 { v := round3(g - dir); return &v }
	c.AddedP50 = d(c.Gateway.P50, c.Direct.P50)
	c.AddedP99 = d(c.Gateway.P99, c.Direct.P99)
	c.AddedMean = d(c.Gateway.Mean, c.Direct.Mean)
}

// EgressTarget is one target and whether this run met it.
type EgressTarget struct {
	Case   string  `json:"case"`
	Metric string  `json:"metric"` // "added_p50_ms" (at most Limit) or "ratio_p50" (at least Limit)
	Limit  float64 `json:"limit"`
	Text   string  `json:"text"`
	// Value is the measured metric (absent when the case was not measured).
	Value  *float64 `json:"value,omitempty"`
	Status string   `json:"status"` // "met", "not met", "not measured: <why>"
}

// Judge sets Value and Status from the report's cases.
func (t *EgressTarget) Judge(cases []EgressCase) {
	for _, c := range cases {
		if c.Name != t.Case {
			continue
		}
		var v *float64
		switch t.Metric {
		case "added_p50_ms":
			v = c.AddedP50
		case "ratio_p50":
			v = c.RatioP50
		}
		switch {
		case v == nil && c.Skipped != "":
			t.Status = "not measured: skipped: " + c.Skipped
		case v == nil && c.Error != "":
			t.Status = "not measured: " + c.Error
		case v == nil:
			t.Status = "not measured"
		default:
			t.Value = v
			met := *v <= t.Limit
			if t.Metric == "ratio_p50" {
				met = *v >= t.Limit
			}
			t.Status = map[bool]string{true: "met", false: "not met"}[met]
		}
		return
	}
	t.Status = "not measured: no such case"
}

// FormatEgress writes the report as a text table.
func FormatEgress(w io.Writer, r EgressReport) {
	if r.Skipped != "" {
		fmt.Fprintf(w, "egress: SKIPPED: %s\n", r.Skipped)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "case\tunit\tn\tdirect p50\tp99\tmean\tgateway p50\tp99\tmean\tadded p50\tp99\tmean")
	num := func(v float64) string {
		if math.Abs(v) >= 100 {
			return fmt.Sprintf("%.0f", v)
		}
		return fmt.Sprintf("%.3f", v)
	}
	var notes []string
	for _, c := range r.Cases {
		switch {
		case c.Skipped != "":
			fmt.Fprintf(tw, "%s\tskipped%s\n", c.Name, strings.Repeat("\t", 10))
			notes = append(notes, fmt.Sprintf("%s: skipped: %s", c.Name, c.Skipped))
			continue
		case c.Direct == nil || c.Gateway == nil:
			fmt.Fprintf(tw, "%s\terror%s\n", c.Name, strings.Repeat("\t", 10))
			notes = append(notes, fmt.Sprintf("%s: error: %s", c.Name, oneLine(c.Error)))
			continue
		}
		d, g := c.Direct, c.Gateway
		row := []string{c.Name, d.Unit, fmt.Sprintf("%d+%d", d.N, g.N),
			num(d.P50), num(d.P99), num(d.Mean), num(g.P50), num(g.P99), num(g.Mean)}
		if c.Throughput() {
			ratio := func(p *float64) string {
				if p == nil {
					return "-"
				}
				return fmt.Sprintf("×%.3f", *p)
			}
			row = append(row, ratio(c.RatioP50), "", ratio(c.RatioMean))
		} else {
			signed := func(p *float64) string {
				if p == nil {
					return "-"
				}
				return fmt.Sprintf("%+.3f", *p)
			}
			row = append(row, signed(c.AddedP50), signed(c.AddedP99), signed(c.AddedMean))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	tw.Flush()
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
	for _, t := range r.Targets {
		v := ""
		if t.Value != nil {
			v = fmt.Sprintf(" (%s)", num(*t.Value))
		}
		fmt.Fprintf(w, "target %s: %s%s\n", t.Text, t.Status, v)
	}
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}

// runEgress runs the egress group and records it in rep.
func (b *bencher) runEgress(ctx context.Context, rep *Report) {
	cfg := b.cfg.EgressConfig
	cfg.Defaults()
	cfg.Progress = b.cfg.Progress
	var er EgressReport
	var err error
	if b.cfg.EgressRun == nil {
		er.Skipped = "this binary has no egress bench (bench.Config.EgressRun is nil; the airlock binary sets it)"
	} else {
		er, err = b.cfg.EgressRun(ctx, cfg)
	}
	if err != nil {
		rep.Errors = append(rep.Errors, GroupEgress+": "+err.Error())
	}
	for _, c := range er.Cases {
		if c.Error != "" {
			rep.Errors = append(rep.Errors, GroupEgress+" "+c.Name+": "+c.Error)
		}
	}
	if er.Skipped != "" {
		b.progress("egress: SKIPPED: %s", er.Skipped)
	}
	FormatEgress(b.cfg.Progress, er)
	rep.Egress = &er
}
