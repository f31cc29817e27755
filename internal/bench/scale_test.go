package bench

import (
	"errors"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"gonum.org/v1/plot/plotter"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/model"
)

func TestScaleIsNotDefault(t *testing.T) {
	var c Config
	c.defaults()
	if c.wants(GroupScale) {
		t.Error("the default set includes scale")
	}
	if c.ScaleBurst != 100 || !slices.Equal(c.ScaleConcurrency, []int{1, 10, 50, 100}) || !slices.Equal(c.ScaleIdle, []int{10, 100, 500, 1000}) {
		t.Errorf("scale defaults: burst %d, concurrency %v, idle %v", c.ScaleBurst, c.ScaleConcurrency, c.ScaleIdle)
	}
	c = Config{Only: []string{GroupScale}}
	if !c.wants(GroupScale) || !slices.Contains(Groups, GroupScale) {
		t.Errorf("--only scale is not measured or not a group: %v", Groups)
	}
}

func TestNewCreatePoint(t *testing.T) {
	durs := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond, 400 * time.Millisecond}
	p := newCreatePoint(2, durs, 2*time.Second, 3)
	if p.N != 4 || p.Concurrency != 2 || p.RateLimited != 3 || p.WallS != 2 {
		t.Fatalf("point %+v", p)
	}
	if p.P50MS == nil || *p.P50MS != 250 || p.P99MS == nil || *p.P99MS != 397 || p.PerSecond == nil || *p.PerSecond != 2 {
		t.Errorf("p50 %v p99 %v per second %v, want 250, 397, 2", fmtPtr(p.P50MS), fmtPtr(p.P99MS), fmtPtr(p.PerSecond))
	}
	if e := newCreatePoint(1, nil, time.Second, 0); e.P50MS != nil || e.PerSecond != nil {
		t.Errorf("no samples gave values: %+v", e)
	}
}

func TestCurves(t *testing.T) {
	s := &ScaleReport{
		Create: []ScaleCreatePoint{
			{Concurrency: 1, P50MS: ptr(90), P99MS: ptr(120), PerSecond: ptr(10)},
			{Concurrency: 10, Error: "boom"}, // no values: left out
			{Concurrency: 50, P50MS: ptr(400), P99MS: ptr(900), PerSecond: ptr(60)},
		},
		Idle: []ScaleIdlePoint{{Sandboxes: 10, PSSMiB: ptr(30)}, {Sandboxes: 100}, {Sandboxes: 500, PSSMiB: ptr(28)}},
	}
	p50, p99, thr := CreateCurves(s)
	want := func(c Curve, xy plotter.XYs) {
		t.Helper()
		if !slices.Equal(c.XY, xy) {
			t.Errorf("%s: %v, want %v", c.Name, c.XY, xy)
		}
	}
	want(p50, plotter.XYs{{X: 1, Y: 90}, {X: 50, Y: 400}})
	want(p99, plotter.XYs{{X: 1, Y: 120}, {X: 50, Y: 900}})
	want(thr, plotter.XYs{{X: 1, Y: 10}, {X: 50, Y: 60}})
	want(IdleCurve(s, "pss", func(p ScaleIdlePoint) *float64 { return p.PSSMiB }), plotter.XYs{{X: 10, Y: 30}, {X: 500, Y: 28}})
	want(IdleCurve(s, "get", func(p ScaleIdlePoint) *float64 { return p.GetP99MS }), nil)
}

// exposition is what a server with the reconcile metrics exports.
const exposition = `# HELP airlock_controller_reconcile_seconds Duration of a full reconcile round.
# TYPE airlock_controller_reconcile_seconds histogram
airlock_controller_reconcile_seconds_bucket{le="0.01"} 3
airlock_controller_reconcile_seconds_bucket{le="0.1"} 9
airlock_controller_reconcile_seconds_bucket{le="+Inf"} 10
airlock_controller_reconcile_seconds_sum %SUM%
airlock_controller_reconcile_seconds_count %COUNT%
# HELP airlock_controller_reconcile_last_seconds Duration of the last full reconcile round.
# TYPE airlock_controller_reconcile_last_seconds gauge
airlock_controller_reconcile_last_seconds 0.042
# HELP airlock_controller_reconcile_sandboxes Sandboxes the last round covered.
# TYPE airlock_controller_reconcile_sandboxes gauge
airlock_controller_reconcile_sandboxes 500
# TYPE go_goroutines gauge
go_goroutines 31
`

func parse(t *testing.T, text string) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := ParseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

func TestReconcileFromMetrics(t *testing.T) {
	at := func(sum, count string) string {
		return strings.NewReplacer("%SUM%", sum, "%COUNT%", count).Replace(exposition)
	}
	// Two rounds in the window, 0.5 s together: 250 ms each.
	rd, err := reconcileFrom(parse(t, at("1.5", "10")), parse(t, at("2.0", "12")))
	if err != nil || rd.from != "histogram" || rd.ms != 250 || rd.sandboxes != 500 {
		t.Errorf("histogram: %+v, %v; want 250 ms from the histogram, 500 sandboxes", rd, err)
	}
	// No round in the window: the last round's gauge.
	rd, err = reconcileFrom(parse(t, at("2.0", "12")), parse(t, at("2.0", "12")))
	if err != nil || rd.from != "gauge" || rd.ms != 42 {
		t.Errorf("gauge: %+v, %v; want 42 ms from the gauge", rd, err)
	}
	// A server without the metrics: missing, with the names.
	other := parse(t, "# TYPE go_goroutines gauge\ngo_goroutines 31\n")
	_, err = reconcileFrom(other, other)
	var skip errSkip
	if !errors.As(err, &skip) || !strings.Contains(err.Error(), MetricReconcileLast) {
		t.Errorf("no metrics: %v, want a skip naming %s", err, MetricReconcileLast)
	}
	if _, err := ParseMetrics(strings.NewReader("not { a metric\n")); err == nil {
		t.Error("garbage parsed")
	}
}

func TestMeminfoField(t *testing.T) {
	text := "Rss:              20480 kB\nPss:              10240 kB\nPss_Anon:          5120 kB\n"
	if v, err := meminfoField(strings.NewReader(text), "Pss:"); err != nil || v != 10 {
		t.Errorf("Pss: %v, %v; want 10 MiB", v, err)
	}
	if _, err := meminfoField(strings.NewReader(text), "MemAvailable:"); err == nil {
		t.Error("a missing field read")
	}
	if v, err := memAvailableMiB(); err != nil || v <= 0 {
		t.Errorf("MemAvailable of this host: %v, %v", v, err)
	}
}

func TestIdIn(t *testing.T) {
	ids := []string{"sb_aaa", "sb_bbb"}
	if got := idIn("runsc\x00--root\x00/x\x00boot\x00sb_bbb\x00", ids); got != "sb_bbb" {
		t.Errorf("got %q", got)
	}
	if got := idIn("bash\x00-c\x00true", ids); got != "" {
		t.Errorf("got %q for no id", got)
	}
}

func TestRateLimited(t *testing.T) {
	if d, ok := rateLimited(&client.APIError{Status: 429, Code: "rate_limited", RetryAfter: 2 * time.Second}); !ok || d != 2*time.Second {
		t.Errorf("rate limited: %v %v", d, ok)
	}
	if d, ok := rateLimited(&client.APIError{Status: 429, Code: "rate_limited"}); !ok || d != scaleRetryFloor {
		t.Errorf("no Retry-After: %v %v, want the floor", d, ok)
	}
	quota := &client.APIError{Status: 429, Code: "quota_exceeded"}
	if !errors.Is(quota, model.ErrQuotaExceeded) {
		t.Skip("the client no longer maps quota_exceeded")
	}
	if _, ok := rateLimited(quota); ok {
		t.Error("an exceeded quota is retried")
	}
	if _, ok := rateLimited(&client.APIError{Status: 500}); ok {
		t.Error("a 500 is retried")
	}
}

func TestScaleRatiosOverRunscBurst(t *testing.T) {
	thr := func(v float64) Measurement {
		st := Summarize("sandboxes/s", []float64{v})
		return Measurement{Stats: &st}
	}
	rep := Report{
		Measurements: map[string]Measurement{
			MScaleCreatePrefix + "10" + MScaleThroughputSuffix: thr(6),
			MScaleCreatePrefix + "50" + MScaleThroughputSuffix: thr(9),
		},
		Ratios: map[string]float64{},
		Scale:  &ScaleReport{RunscBurst: []ScaleCreatePoint{{Concurrency: 10, PerSecond: ptr(12)}, {Concurrency: 50}}},
	}
	rep.Measurements[MRunscDo] = thr(1) // any baseline: the ratios need one
	addScaleRatios(&rep)
	if got := rep.Ratios["scale_create_c10_throughput_over_runsc_burst"]; got != 0.5 {
		t.Errorf("c10 throughput over the raw burst: %v, want 0.5 (ratios %v)", got, rep.Ratios)
	}
	if _, ok := rep.Ratios["scale_create_c50_throughput_over_runsc_burst"]; ok {
		t.Error("a ratio over a raw burst that measured nothing")
	}
}

func TestForkIsDefault(t *testing.T) {
	var c Config
	c.defaults()
	if !c.wants(GroupFork) || !slices.Contains(Groups, GroupFork) || c.ForkRuns != 5 || c.ForkCount != 10 {
		t.Errorf("fork: wanted %v, groups %v, runs %d, count %d", c.wants(GroupFork), Groups, c.ForkRuns, c.ForkCount)
	}
}

func TestWritePlots(t *testing.T) {
	rep := Report{Scale: &ScaleReport{
		Burst: 100, RunscDoP50MS: ptr(80), CLIP50MS: ptr(300),
		Create: []ScaleCreatePoint{
			{Concurrency: 1, P50MS: ptr(150), P99MS: ptr(190), PerSecond: ptr(6)},
			{Concurrency: 10, P50MS: ptr(400), P99MS: ptr(700), PerSecond: ptr(20)},
			{Concurrency: 100, P50MS: ptr(3000), P99MS: ptr(5000), PerSecond: ptr(28)},
		},
		RunscBurst: []ScaleCreatePoint{{Concurrency: 10, PerSecond: ptr(12)}, {Concurrency: 100, PerSecond: ptr(11)}},
		Idle: []ScaleIdlePoint{
			{Sandboxes: 10, PSSMiB: ptr(31), AvailDropMiB: ptr(40), GetP99MS: ptr(2), ListP99MS: ptr(5), ReconcileMS: ptr(3)},
			{Sandboxes: 100, PSSMiB: ptr(29), AvailDropMiB: ptr(35), GetP99MS: ptr(3), ListP99MS: ptr(9), ReconcileMS: ptr(20)},
		},
	}}
	dir := t.TempDir()
	paths, err := WritePlots(rep, dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{PlotScaleCreate, PlotScaleMemory, PlotScaleAPI, PlotScaleReconcile}
	if len(paths) != len(want) {
		t.Fatalf("wrote %v, want %v", paths, want)
	}
	for i, name := range want {
		if paths[i] != filepath.Join(dir, name) {
			t.Errorf("path %d: %s, want %s", i, paths[i], name)
		}
		checkPNG(t, paths[i])
	}

	// Without any idle level (the ramp failed at once) the plots are
	// still drawn, empty.
	rep.Scale.Idle = nil
	if _, err := WritePlots(rep, dir); err != nil {
		t.Fatalf("no idle levels: %v", err)
	}
	checkPNG(t, filepath.Join(dir, PlotScaleReconcile))

	if _, err := WritePlots(Report{}, dir); err == nil {
		t.Error("a report without the scale group plotted")
	}
}

func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if b := img.Bounds(); b.Dx() < 100 || b.Dy() < 100 {
		t.Errorf("%s: %v, too small", path, b)
	}
}

func TestReadReport(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.json")
	os.WriteFile(path, []byte(`{"scale":{"burst":7,"create":[{"concurrency":5,"p50_ms":12.5}]}}`), 0o644)
	rep, err := ReadReport(path)
	if err != nil || rep.Scale == nil || rep.Scale.Burst != 7 || *rep.Scale.Create[0].P50MS != 12.5 {
		t.Fatalf("%+v, %v", rep.Scale, err)
	}
	os.WriteFile(path, []byte(`{"scale":`), 0o644)
	if _, err := ReadReport(path); err == nil {
		t.Error("a truncated report read")
	}
}
