package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Plot files WritePlots writes into its directory.
const (
	PlotScaleCreate    = "scale-create.png"
	PlotScaleMemory    = "scale-idle-memory.png"
	PlotScaleAPI       = "scale-api.png"
	PlotScaleReconcile = "scale-reconcile.png"
)

// ReadReport reads a report Run wrote as JSON (airlock bench --out).
func ReadReport(path string) (Report, error) {
	var rep Report
	b, err := os.ReadFile(path)
	if err != nil {
		return rep, fmt.Errorf("read report: %w", err)
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		return rep, fmt.Errorf("read report %s: %w", path, err)
	}
	return rep, nil
}

// Curve is one line of a plot: (X, Y) points in ascending X, the points
// without a value left out.
type Curve struct {
	Name string
	XY   plotter.XYs
}

// CreateCurves assembles the create plot's curves: p50 and p99 latency
// (ms) and throughput (sandboxes/s) against concurrency.
func CreateCurves(s *ScaleReport) (p50, p99, perSecond Curve) {
	p50, p99, perSecond = Curve{Name: "p50"}, Curve{Name: "p99"}, Curve{Name: "sandboxes/s"}
	for _, p := range s.Create {
		add(&p50, float64(p.Concurrency), p.P50MS)
		add(&p99, float64(p.Concurrency), p.P99MS)
		add(&perSecond, float64(p.Concurrency), p.PerSecond)
	}
	return
}

// IdleCurve assembles one idle curve: get's value of each level against
// its number of sandboxes.
func IdleCurve(s *ScaleReport, name string, get func(ScaleIdlePoint) *float64) Curve {
	c := Curve{Name: name}
	for _, p := range s.Idle {
		add(&c, float64(p.Sandboxes), get(p))
	}
	return c
}

func add(c *Curve, x float64, y *float64) {
	if y == nil || math.IsNaN(*y) || math.IsInf(*y, 0) {
		return
	}
	c.XY = append(c.XY, plotter.XY{X: x, Y: *y})
}

// baseline is a horizontal reference line (the runsc baseline).
type baseline struct {
	name string
	y    *float64
}

// WritePlots writes the scale group's PNGs into dir (created) and returns
// their paths. A plot whose curves have no point is drawn empty, its title
// saying so.
func WritePlots(rep Report, dir string) ([]string, error) {
	s := rep.Scale
	if s == nil {
		return nil, errors.New("the report has no scale group (run airlock bench --only scale)")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("plots: %w", err)
	}
	var paths []string
	save := func(name string, render func(string) error) error {
		path := filepath.Join(dir, name)
		if err := render(path); err != nil {
			return fmt.Errorf("plot %s: %w", path, err)
		}
		paths = append(paths, path)
		return nil
	}

	p50, p99, thr := CreateCurves(s)
	cli := Curve{Name: "CLI p50 (c=1)"}
	add(&cli, 1, s.CLIP50MS)
	if err := save(PlotScaleCreate, func(path string) error {
		lat, err := linePlot(fmt.Sprintf("create → first exec, bursts of %d", s.Burst), "requests in flight", "latency (ms)",
			[]Curve{p50, p99}, []Curve{cli}, []baseline{{"runsc do true p50", s.RunscDoP50MS}})
		if err != nil {
			return err
		}
		raw := Curve{Name: "runsc do true / s (raw)"}
		for _, p := range s.RunscBurst {
			add(&raw, float64(p.Concurrency), p.PerSecond)
		}
		tp, err := linePlot("", "requests in flight", "sandboxes per second", []Curve{thr, raw}, nil, nil)
		if err != nil {
			return err
		}
		return savePlots(path, 8*vg.Inch, lat, tp)
	}); err != nil {
		return paths, err
	}

	mem := []Curve{
		IdleCurve(s, "PSS of runsc processes", func(p ScaleIdlePoint) *float64 { return p.PSSMiB }),
		IdleCurve(s, "MemAvailable drop", func(p ScaleIdlePoint) *float64 { return p.AvailDropMiB }),
	}
	if err := save(PlotScaleMemory, func(path string) error {
		p, err := linePlot("memory per idle running sandbox", "idle sandboxes", "MiB per sandbox", mem, nil, nil)
		if err != nil {
			return err
		}
		return savePlots(path, 5*vg.Inch, p)
	}); err != nil {
		return paths, err
	}

	api := []Curve{
		IdleCurve(s, "GET /v1/sandboxes/{id} p99", func(p ScaleIdlePoint) *float64 { return p.GetP99MS }),
		IdleCurve(s, "list p99", func(p ScaleIdlePoint) *float64 { return p.ListP99MS }),
		IdleCurve(s, "GET p50", func(p ScaleIdlePoint) *float64 { return p.GetP50MS }),
		IdleCurve(s, "list p50", func(p ScaleIdlePoint) *float64 { return p.ListP50MS }),
	}
	if err := save(PlotScaleAPI, func(path string) error {
		p, err := linePlot("API latency with idle running sandboxes", "idle sandboxes", "latency (ms)", api, nil, nil)
		if err != nil {
			return err
		}
		return savePlots(path, 5*vg.Inch, p)
	}); err != nil {
		return paths, err
	}

	rc := []Curve{IdleCurve(s, "reconcile round", func(p ScaleIdlePoint) *float64 { return p.ReconcileMS })}
	if err := save(PlotScaleReconcile, func(path string) error {
		p, err := linePlot("controller reconcile round", "idle sandboxes", "reconcile (ms)", rc, nil, nil)
		if err != nil {
			return err
		}
		return savePlots(path, 5*vg.Inch, p)
	}); err != nil {
		return paths, err
	}
	return paths, nil
}

// palette is distinguishable on white and in grey.
var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
}

// linePlot draws curves as lines with points, points as points only, and
// baselines as dashed horizontal lines; X is logarithmic when it has
// points (the levels grow by factors).
func linePlot(title, xlabel, ylabel string, curves, points []Curve, bases []baseline) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = title, xlabel, ylabel
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	xmin, xmax, ymax, n := math.Inf(1), math.Inf(-1), 0.0, 0
	for i, c := range append(append([]Curve{}, curves...), points...) {
		if len(c.XY) == 0 {
			continue
		}
		n++
		for _, xy := range c.XY {
			xmin, xmax, ymax = min(xmin, xy.X), max(xmax, xy.X), max(ymax, xy.Y)
		}
		col := palette[i%len(palette)]
		if i < len(curves) {
			l, s, err := plotter.NewLinePoints(c.XY)
			if err != nil {
				return nil, err
			}
			l.Color, s.Color = col, col
			l.Width = vg.Points(1.5)
			s.Shape = draw.CircleGlyph{}
			p.Add(l, s)
			p.Legend.Add(c.Name, l, s)
		} else {
			s, err := plotter.NewScatter(c.XY)
			if err != nil {
				return nil, err
			}
			s.Color, s.Shape, s.Radius = col, draw.BoxGlyph{}, vg.Points(4)
			p.Add(s)
			p.Legend.Add(c.Name, s)
		}
	}
	for _, b := range bases {
		if b.y == nil {
			continue
		}
		v := *b.y
		f := plotter.NewFunction(func(float64) float64 { return v })
		f.Color, f.Dashes, f.Width = color.Gray{Y: 0x60}, []vg.Length{vg.Points(4), vg.Points(3)}, vg.Points(1.2)
		p.Add(f)
		p.Legend.Add(fmt.Sprintf("%s (%.0f ms)", b.name, v), f)
		ymax = max(ymax, v)
	}
	if n == 0 {
		p.Title.Text += " (no data)"
		p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = 0, 1, 0, 1
		return p, nil
	}
	p.Y.Min, p.Y.Max = 0, ymax*1.15
	if xmin > 0 && xmax > xmin {
		p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, levelTicks{}
		p.X.Min, p.X.Max = xmin/1.3, xmax*1.3
	} else {
		p.X.Min, p.X.Max = xmin-1, xmax+1
	}
	return p, nil
}

// levelTicks marks 1, 2, 5 times the powers of ten within the range.
type levelTicks struct{}

func (levelTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for e := math.Floor(math.Log10(lo)); math.Pow(10, e) <= hi; e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v >= lo && v <= hi {
				ts = append(ts, plot.Tick{Value: v, Label: fmt.Sprintf("%g", v)})
			}
		}
	}
	return ts
}

// savePlots draws plots one above the other, X axes aligned, into a PNG
// 8 inches wide and h high.
func savePlots(path string, h vg.Length, plots ...*plot.Plot) error {
	const w = 8 * vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	rows := make([][]*plot.Plot, len(plots))
	for i, p := range plots {
		rows[i] = []*plot.Plot{p}
	}
	t := draw.Tiles{Rows: len(plots), Cols: 1, PadX: vg.Millimeter, PadY: 4 * vg.Millimeter,
		PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 2 * vg.Millimeter}
	canvases := plot.Align(rows, t, dc)
	for i, p := range plots {
		p.Draw(canvases[i][0])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
