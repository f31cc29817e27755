package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	prommodel "github.com/prometheus/common/model"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/model"
)

// GroupScale measures scaling curves rather than points: create → first
// exec under bursts of rising concurrency, the same through the airlock
// binary, and, with rising numbers of idle running sandboxes, the memory
// each costs, the API's latency and the controller's reconcile time. It is
// not in the default set: it runs up to ScaleIdle's largest level of
// sandboxes at once.
const GroupScale = "scale"

// Scale measurement names in Report.Measurements; the level is appended,
// e.g. "scale_create_c10", "scale_idle_pss_mib_500".
const (
	MScaleCreatePrefix     = "scale_create_c"      // + concurrency (ms)
	MScaleThroughputSuffix = "_throughput"         // scale_create_c10_throughput (sandboxes/s)
	MScaleCLICreate        = "scale_cli_create"    // airlock sandbox create + airlock exec (ms)
	MScaleRunscBurstPrefix = "scale_runsc_burst_c" // + concurrency: `runsc do true` bursts (ms)
	MScaleIdlePSSPrefix    = "scale_idle_pss_mib_" // + count (MiB per sandbox)
	MScaleIdleAvailPrefix  = "scale_idle_memavailable_drop_mib_"
	MScaleIdleGetPrefix    = "scale_idle_get_"       // GET /v1/sandboxes/{id} (ms)
	MScaleIdleListPrefix   = "scale_idle_list_"      // GET /v1/sandboxes (ms)
	MScaleIdleReconPrefix  = "scale_idle_reconcile_" // controller reconcile round (ms)
)

// Prometheus names the reconcile measurement reads from Config.MetricsURL.
const (
	MetricReconcileSeconds   = "airlock_controller_reconcile_seconds"      // histogram
	MetricReconcileLast      = "airlock_controller_reconcile_last_seconds" // gauge
	MetricReconcileSandboxes = "airlock_controller_reconcile_sandboxes"    // gauge
)

// Scale group tunables that are not flags.
const (
	scaleCLISandboxes  = 20              // create → first exec through the binary
	scaleRampParallel  = 10              // creates in flight while ramping idle sandboxes
	scaleGets          = 200             // GET /v1/sandboxes/{id} per idle level
	scaleLists         = 20              // list calls per idle level
	scaleReconWindow   = 5 * time.Second // between the two metric scrapes
	scaleCreateTimeout = 5 * time.Minute // one idle create, at most
	scaleRefusePoll    = 3 * time.Second // how often a waiting create's sandbox is read
	scaleRetryFloor    = 200 * time.Millisecond
)

// ScaleReport holds GroupScale's curves: one point per level, in the order
// measured. Values a point could not measure are absent (null).
type ScaleReport struct {
	Burst       int   `json:"burst"`
	Concurrency []int `json:"concurrency"`
	IdleLevels  []int `json:"idle_levels"`
	// RunscDoP50MS and RunscDoP99MS are the same run's `runsc do true`
	// baseline, drawn in the latency plots.
	RunscDoP50MS *float64           `json:"runsc_do_p50_ms,omitempty"`
	RunscDoP99MS *float64           `json:"runsc_do_p99_ms,omitempty"`
	Create       []ScaleCreatePoint `json:"create"`
	// RunscBurst is the raw ceiling at each concurrency above 1: the
	// burst's number of `runsc do true` with as many in flight, measured
	// right after the burst (no API, no agent, no network namespaces).
	RunscBurst []ScaleCreatePoint `json:"runsc_burst,omitempty"`
	// CLIP50MS and CLIP99MS are create → first exec through the airlock
	// binary at concurrency 1.
	CLIP50MS *float64         `json:"cli_p50_ms,omitempty"`
	CLIP99MS *float64         `json:"cli_p99_ms,omitempty"`
	Idle     []ScaleIdlePoint `json:"idle"`
	// IdleStopped says why the idle ramp stopped before its last level
	// (the worker refused more sandboxes, say); empty when it did not.
	IdleStopped string `json:"idle_stopped,omitempty"`
}

// ScaleCreatePoint is one create burst.
type ScaleCreatePoint struct {
	Concurrency int      `json:"concurrency"`
	N           int      `json:"n"`
	P50MS       *float64 `json:"p50_ms,omitempty"`
	P99MS       *float64 `json:"p99_ms,omitempty"`
	WallS       float64  `json:"wall_s"`
	PerSecond   *float64 `json:"sandboxes_per_s,omitempty"`
	// RateLimited counts the 429 answers the burst's creates were retried
	// after (their wait is in the latencies).
	RateLimited int64  `json:"rate_limited"`
	Error       string `json:"error,omitempty"`
}

// ScaleIdlePoint is one level of idle running sandboxes.
type ScaleIdlePoint struct {
	Sandboxes int `json:"sandboxes"`
	// PSSMiB is the mean PSS per sandbox of the processes (runsc sandbox,
	// gofer) whose command line names one of the bench's sandboxes;
	// AvailDropMiB the fall of MemAvailable since before the first idle
	// sandbox, per sandbox. Both need the bench on the worker's host.
	PSSMiB       *float64 `json:"pss_mib_per_sandbox,omitempty"`
	AvailDropMiB *float64 `json:"memavailable_drop_mib_per_sandbox,omitempty"`
	Processes    int      `json:"processes,omitempty"`
	GetP50MS     *float64 `json:"get_p50_ms,omitempty"`
	GetP99MS     *float64 `json:"get_p99_ms,omitempty"`
	ListP50MS    *float64 `json:"list_p50_ms,omitempty"`
	ListP99MS    *float64 `json:"list_p99_ms,omitempty"`
	// ReconcileMS is the controller's reconcile round, from ReconcileFrom
	// ("histogram" mean over the window, or the "gauge" of the last
	// round); ReconcileSandboxes what the gauge says the round covered.
	ReconcileMS        *float64 `json:"reconcile_ms,omitempty"`
	ReconcileFrom      string   `json:"reconcile_from,omitempty"`
	ReconcileSandboxes *float64 `json:"reconcile_sandboxes,omitempty"`
}

func ptr(v float64) *float64 { return &v }

// newCreatePoint summarises one burst: latencies of the sandboxes that
// made it to their first exec, and n / wall as the throughput.
func newCreatePoint(concurrency int, durs []time.Duration, wall time.Duration, rateLimited int64) ScaleCreatePoint {
	p := ScaleCreatePoint{Concurrency: concurrency, N: len(durs), WallS: round3(wall.Seconds()), RateLimited: rateLimited}
	if len(durs) == 0 {
		return p
	}
	st := Summarize("ms", Millis(durs))
	p.P50MS, p.P99MS = ptr(st.P50), ptr(st.P99)
	if wall > 0 {
		p.PerSecond = ptr(round3(float64(len(durs)) / wall.Seconds()))
	}
	return p
}

// runScale runs GroupScale, recording into rep.
func (b *bencher) runScale(ctx context.Context, rep *Report, record func(string, string, *Stats, error)) {
	sr := &ScaleReport{Burst: b.cfg.ScaleBurst, Concurrency: b.cfg.ScaleConcurrency, IdleLevels: b.cfg.ScaleIdle}
	rep.Scale = sr
	defer b.cleanup(ctx)

	// The baseline, unless the runsc group measured it already.
	if _, ok := rep.Measurements[MRunscDo]; !ok {
		rep.Measurements[MRunscDo] = b.runscDo(ctx)
	}
	if base := rep.Measurements[MRunscDo]; base.Stats != nil {
		sr.RunscDoP50MS, sr.RunscDoP99MS = ptr(base.P50), ptr(base.P99)
	}

	// 1. create bursts.
	for _, c := range b.cfg.ScaleConcurrency {
		if ctx.Err() != nil {
			break
		}
		n := b.cfg.ScaleBurst
		if c == 1 {
			n = min(n, 20)
		}
		p, st, err := b.createBurst(ctx, c, n)
		if err != nil {
			p.Error = err.Error()
		}
		sr.Create = append(sr.Create, p)
		name := fmt.Sprintf("%s%d", MScaleCreatePrefix, c)
		recordBurst(record, name, p, st, err,
			fmt.Sprintf("create %d sandboxes with %d requests in flight, each timed from its create request (429s retried after Retry-After, the wait counted) through its create operation to the exit of `true` in it (ms)", n, c),
			fmt.Sprintf("the same burst: %d sandboxes / wall time from the first create request to the last exit (sandboxes per second)", n))
		for _, m := range []string{name, name + MScaleThroughputSuffix} {
			mm := rep.Measurements[m]
			mm.Note = fmt.Sprintf("%d answers 429 (rate limited) retried; wall %.3f s", p.RateLimited, p.WallS)
			rep.Measurements[m] = mm
		}
		b.progress("scale create c%d: p50 %s, %s sandboxes/s, %d×429", c, fmtPtr(p.P50MS), fmtPtr(p.PerSecond), p.RateLimited)

		// The same burst of raw gVisor starts: what the machine allows.
		if c > 1 && b.cfg.Runsc != "" && ctx.Err() == nil {
			rp, rst, err := b.runscBurst(ctx, c, n)
			if err != nil {
				rp.Error = err.Error()
			}
			sr.RunscBurst = append(sr.RunscBurst, rp)
			recordBurst(record, fmt.Sprintf("%s%d", MScaleRunscBurstPrefix, c), rp, rst, err,
				fmt.Sprintf("raw baseline: %d `runsc do true` with %d in flight, each timed from its start to its exit (ms)", n, c),
				fmt.Sprintf("the same: %d runs / wall time (runs per second)", n))
			b.progress("scale runsc burst c%d: p50 %s, %s runs/s", c, fmtPtr(rp.P50MS), fmtPtr(rp.PerSecond))
		}
	}

	// 2. the CLI path.
	if ctx.Err() == nil {
		st, err := b.cliCreate(ctx)
		if st != nil {
			sr.CLIP50MS, sr.CLIP99MS = ptr(st.P50), ptr(st.P99)
		}
		record(MScaleCLICreate, fmt.Sprintf("`airlock sandbox create` (waits for running, prints the id) then `airlock exec <id> -- true`, as processes, AIRLOCK_URL and AIRLOCK_API_KEY in their environment; %d sandboxes one after another (ms)", scaleCLISandboxes), st, err)
	}

	// 3. idle levels.
	if ctx.Err() == nil {
		b.idleLevels(ctx, rep, sr, record)
	}
	addScaleRatios(rep)
}

// recordBurst records a burst's latencies as name and its throughput as
// name+MScaleThroughputSuffix (one sample: the burst's per-second rate).
func recordBurst(record func(string, string, *Stats, error), name string, p ScaleCreatePoint, st *Stats, err error, latDesc, thrDesc string) {
	var thr *Stats
	if st != nil && p.PerSecond != nil {
		t := Summarize("sandboxes/s", []float64{*p.PerSecond})
		thr = &t
	}
	record(name, latDesc, st, err)
	record(name+MScaleThroughputSuffix, thrDesc, thr, err)
}

// runscBurst runs n `runsc do true` (as runscDo does), c at a time, each
// with its own state directory, and summarises them like a create burst.
func (b *bencher) runscBurst(ctx context.Context, c, n int) (ScaleCreatePoint, *Stats, error) {
	durs := make([]time.Duration, n)
	errs := make([]error, n)
	sem := make(chan struct{}, c)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			root, err := os.MkdirTemp("", "airlock-bench-runsc-")
			if err != nil {
				errs[i] = err
				return
			}
			defer RemoveRunscRoot(root)
			cmd := exec.CommandContext(ctx, b.cfg.Runsc, runscDoArgs(root)...)
			start := time.Now()
			out, err := cmd.CombinedOutput()
			durs[i] = time.Since(start)
			if err != nil {
				errs[i] = fmt.Errorf("runsc do true: %v: %s", err, strings.TrimSpace(lastLines(string(out), 3)))
			}
		})
	}
	wg.Wait()
	wall := time.Since(t0)
	if err := errors.Join(errs...); err != nil {
		return ScaleCreatePoint{Concurrency: c, WallS: round3(wall.Seconds())}, nil, err
	}
	p := newCreatePoint(c, durs, wall, 0)
	st := Summarize("ms", Millis(durs))
	return p, &st, nil
}

func fmtPtr(v *float64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatFloat(*v, 'f', 1, 64)
}

// addScaleRatios derives the group's ratios over the same run's baseline.
func addScaleRatios(rep *Report) {
	base, ok := rep.Measurements[MRunscDo]
	if !ok || base.Stats == nil {
		return
	}
	for name, m := range rep.Measurements {
		if m.Stats == nil || m.Unit != "ms" {
			continue
		}
		if strings.HasPrefix(name, MScaleCreatePrefix) || name == MScaleCLICreate {
			if r, ok := Ratio(m.P50, base.P50); ok {
				rep.Ratios[name+"_p50_over_runsc_do_p50"] = r
			}
		}
	}
	if rep.Scale != nil {
		for _, p := range rep.Scale.RunscBurst {
			thr := rep.Measurements[fmt.Sprintf("%s%d%s", MScaleCreatePrefix, p.Concurrency, MScaleThroughputSuffix)]
			if thr.Stats != nil && p.PerSecond != nil {
				if r, ok := Ratio(thr.P50, *p.PerSecond); ok {
					rep.Ratios[fmt.Sprintf("%s%d%s_over_runsc_burst", MScaleCreatePrefix, p.Concurrency, MScaleThroughputSuffix)] = r
				}
			}
		}
	}
	if cli, c1 := rep.Measurements[MScaleCLICreate], rep.Measurements[MScaleCreatePrefix+"1"]; cli.Stats != nil && c1.Stats != nil {
		if r, ok := Ratio(cli.P50, c1.P50); ok {
			rep.Ratios["scale_cli_create_p50_over_create_c1_p50"] = r
		}
	}
}

// rateLimited reports whether err is a 429 to retry (the create rate
// limit), not an exceeded quota, and how long to wait.
func rateLimited(err error) (time.Duration, bool) {
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusTooManyRequests || errors.Is(err, model.ErrQuotaExceeded) {
		return 0, false
	}
	return max(ae.RetryAfter, scaleRetryFloor), true
}

// createRetry is create, retried after the server's Retry-After while it
// answers 429 (rate limited); n429 counts those answers.
func (b *bencher) createRetry(ctx context.Context, n429 *atomic.Int64) (string, error) {
	for {
		id, err := b.create(ctx, b.request())
		if wait, ok := rateLimited(err); ok && id == "" {
			n429.Add(1)
			if err := sleepCtx(ctx, wait); err != nil {
				return "", err
			}
			continue
		}
		return id, err
	}
}

// timedRetry times call, retrying it after Retry-After while it answers
// 429 (counted in n429); only the call that is answered is timed, since
// the API's latency, not the key's rate limit, is measured.
func timedRetry(ctx context.Context, n429 *atomic.Int64, call func() error) (time.Duration, error) {
	for {
		t0 := time.Now()
		err := call()
		d := time.Since(t0)
		if wait, ok := rateLimited(err); ok {
			n429.Add(1)
			if err := sleepCtx(ctx, wait); err != nil {
				return 0, err
			}
			continue
		}
		return d, err
	}
}

// createBurst creates n sandboxes, c requests in flight, times each to its
// first exec, then deletes them all concurrently (untimed).
func (b *bencher) createBurst(ctx context.Context, c, n int) (ScaleCreatePoint, *Stats, error) {
	var n429 atomic.Int64
	durs := make([]time.Duration, n)
	ids := make([]string, n)
	errs := make([]error, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	t0 := time.Now()
	for range min(c, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				s := time.Now()
				id, err := b.createRetry(ctx, &n429)
				ids[i] = id
				if err == nil {
					err = b.runTrue(ctx, id)
				}
				durs[i], errs[i] = time.Since(s), err
			}
		})
	}
	wg.Wait()
	wall := time.Since(t0)
	delErr := b.deleteAll(ctx, ids)
	p := newCreatePoint(c, durs, wall, n429.Load())
	if err := errors.Join(append(errs, delErr, ctx.Err())...); err != nil {
		p.N, p.P50MS, p.P99MS, p.PerSecond = 0, nil, nil, nil
		return p, nil, err
	}
	st := Summarize("ms", Millis(durs))
	return p, &st, nil
}

// deleteAll deletes the sandboxes ("" entries skipped) concurrently.
func (b *bencher) deleteAll(ctx context.Context, ids []string) error {
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 20)
	for i, id := range ids {
		if id == "" {
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = b.delete(ctx, id)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// cliCreate times `airlock sandbox create` + `airlock exec <id> -- true`.
func (b *bencher) cliCreate(ctx context.Context) (*Stats, error) {
	if b.cfg.Airlock == "" {
		return nil, skipf("no airlock binary to run `airlock sandbox create` with")
	}
	env := append(os.Environ(), "AIRLOCK_URL="+b.cfg.Client.BaseURL, "AIRLOCK_API_KEY="+b.cfg.Client.APIKey)
	run := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, b.cfg.Airlock, args...)
		cmd.Env = env
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			return out.String(), fmt.Errorf("airlock %s: %v: %s", strings.Join(args, " "), err, lastLines(errb.String(), 3))
		}
		return out.String(), nil
	}
	createArgs := []string{"sandbox", "create", "--template", b.cfg.Template}
	if b.cfg.Runtime != "" {
		createArgs = append(createArgs, "--runtime", b.cfg.Runtime)
	}
	var durs []time.Duration
	for i := range scaleCLISandboxes {
		t0 := time.Now()
		out, err := run(createArgs...)
		id := strings.TrimSpace(lastLines(out, 1))
		if id != "" && !strings.ContainsAny(id, " \t") {
			b.mu.Lock()
			b.live[id] = true
			b.mu.Unlock()
		}
		if err == nil && id == "" {
			err = fmt.Errorf("airlock sandbox create printed no id")
		}
		if err == nil {
			_, err = run("exec", id, "--", "true")
		}
		d := time.Since(t0)
		if id != "" {
			if derr := b.delete(ctx, id); err == nil {
				err = derr
			}
		}
		if err != nil {
			return nil, err
		}
		durs = append(durs, d)
		if (i+1)%5 == 0 {
			b.progress("scale cli create: %d/%d", i+1, scaleCLISandboxes)
		}
	}
	st := Summarize("ms", Millis(durs))
	return &st, nil
}

// errRefused is a create the worker side does not carry out: the sandbox
// stays pending with a reason, or the org's quota is full.
type errRefused struct{ msg string }

func (e errRefused) Error() string { return e.msg }

// createIdle creates one sandbox for the idle ramp and waits until it
// runs; a sandbox left pending with a reason is errRefused.
func (b *bencher) createIdle(ctx context.Context, n429 *atomic.Int64) (string, error) {
	var (
		id  string
		op  model.Operation
		err error
	)
	// Idle, but running for the whole ramp: no auto-suspend.
	req := b.request()
	never := int64(0)
	req.IdleSuspendAfterS = &never
	for {
		var sb model.Sandbox
		sb, op, err = b.cfg.Client.CreateSandbox(ctx, req, "")
		if sb.ID != "" {
			b.track(sb)
			id = sb.ID
		}
		if wait, ok := rateLimited(err); ok && sb.ID == "" {
			n429.Add(1)
			if err := sleepCtx(ctx, wait); err != nil {
				return "", err
			}
			continue
		}
		break
	}
	if errors.Is(err, model.ErrQuotaExceeded) {
		return "", errRefused{fmt.Sprintf("create refused: %v", err)}
	}
	if err != nil {
		return "", fmt.Errorf("create sandbox: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, scaleCreateTimeout)
	defer cancel()
	var refused atomic.Pointer[string]
	go func() {
		seen := 0
		t := time.NewTicker(scaleRefusePoll)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
			sb, err := b.cfg.Client.GetSandbox(wctx, id)
			if err == nil && sb.State == model.StatePending && sb.Reason != "" {
				if seen++; seen >= 2 {
					r := fmt.Sprintf("sandbox %s stays pending: %s", id, sb.Reason)
					refused.Store(&r)
					cancel()
					return
				}
			} else {
				seen = 0
			}
		}
	}()
	if !op.State.Done() {
		op, err = b.cfg.Client.WaitOperation(wctx, op.ID)
	}
	if r := refused.Load(); r != nil {
		return id, errRefused{*r}
	}
	if err != nil {
		if ctx.Err() == nil && wctx.Err() != nil {
			return id, fmt.Errorf("create of %s not done after %s", id, scaleCreateTimeout)
		}
		return id, fmt.Errorf("wait for create of %s: %w", id, err)
	}
	if op.State != model.OpSucceeded {
		return id, errRefused{fmt.Sprintf("create of %s %s: %s", id, op.State, op.Reason)}
	}
	return id, nil
}

// idleLevels ramps idle running sandboxes through cfg.ScaleIdle and
// measures each level.
func (b *bencher) idleLevels(ctx context.Context, rep *Report, sr *ScaleReport, record func(string, string, *Stats, error)) {
	availBefore, availErr := memAvailableMiB()
	var idle []string
	var n429 atomic.Int64
	for li, level := range b.cfg.ScaleIdle {
		if ctx.Err() != nil {
			return
		}
		// Ramp up to level, scaleRampParallel at a time.
		missing := level - len(idle)
		ids := make([]string, missing)
		errs := make([]error, missing)
		var next atomic.Int64
		var wg sync.WaitGroup
		var stop atomic.Bool
		for range min(scaleRampParallel, missing) {
			wg.Go(func() {
				for !stop.Load() && ctx.Err() == nil {
					i := int(next.Add(1)) - 1
					if i >= missing {
						return
					}
					ids[i], errs[i] = b.createIdle(ctx, &n429)
					if errs[i] != nil {
						stop.Store(true)
					}
				}
			})
		}
		wg.Wait()
		for i, id := range ids {
			if id != "" && errs[i] == nil {
				idle = append(idle, id)
			}
		}
		// The first failure says why: the others are mostly the same
		// refusal met by the other creates in flight.
		if i := slices.IndexFunc(errs, func(e error) bool { return e != nil }); i >= 0 || ctx.Err() != nil {
			if i < 0 {
				return
			}
			err := errs[i]
			var ref errRefused
			var why error = err
			if errors.As(err, &ref) {
				why = skipf("not measured: the ramp stopped at %d running sandboxes: %s", len(idle), ref.msg)
			}
			sr.IdleStopped = fmt.Sprintf("at level %d (%d sandboxes running): %v", level, len(idle), err)
			for _, lv := range b.cfg.ScaleIdle[li:] {
				for _, p := range []string{MScaleIdlePSSPrefix, MScaleIdleAvailPrefix, MScaleIdleGetPrefix, MScaleIdleListPrefix, MScaleIdleReconPrefix} {
					record(fmt.Sprintf("%s%d", p, lv), fmt.Sprintf("idle level %d (not reached)", lv), nil, why)
				}
			}
			b.progress("scale idle: stopped: %s", sr.IdleStopped)
			return
		}
		b.progress("scale idle: %d sandboxes running (%d×429 so far)", len(idle), n429.Load())
		sr.Idle = append(sr.Idle, b.measureIdle(ctx, rep, idle, availBefore, availErr, record))
	}
}

// measureIdle measures one idle level of len(idle) sandboxes.
func (b *bencher) measureIdle(ctx context.Context, rep *Report, idle []string, availBefore float64, availErr error, record func(string, string, *Stats, error)) ScaleIdlePoint {
	n := len(idle)
	p := ScaleIdlePoint{Sandboxes: n}

	// (a) memory.
	perSB, procs, err := pssBySandbox(idle)
	p.Processes = procs
	var pssSt, availSt *Stats
	var availErr2 error
	switch {
	case err != nil:
		availErr2 = err
	case availErr != nil:
		availErr2 = skipf("read MemAvailable before the first sandbox: %v", availErr)
	}
	if err == nil {
		vals := make([]float64, 0, n)
		for _, id := range idle {
			vals = append(vals, perSB[id])
		}
		st := Summarize("MiB", vals)
		pssSt = &st
		p.PSSMiB = ptr(st.Mean)
		if availErr2 == nil {
			now, err := memAvailableMiB()
			if err != nil {
				availErr2 = skipf("read MemAvailable: %v", err)
			} else {
				st := Summarize("MiB", []float64{(availBefore - now) / float64(n)})
				availSt = &st
				p.AvailDropMiB = ptr(st.Mean)
			}
		}
	}
	record(fmt.Sprintf("%s%d", MScaleIdlePSSPrefix, n), fmt.Sprintf("with %d idle running sandboxes: PSS (/proc/PID/smaps_rollup) of the processes whose command line names one of them (runsc sandbox, gofer), per sandbox; mean is the sum / %d (MiB)", n, n), pssSt, err)
	record(fmt.Sprintf("%s%d", MScaleIdleAvailPrefix, n), fmt.Sprintf("with %d idle running sandboxes: the drop of MemAvailable since before the first, / %d (MiB; other work on the host counts too)", n, n), availSt, availErr2)

	// (b) API latency.
	var gets, lists []time.Duration
	var apiErr error
	var limited atomic.Int64
	for range scaleGets {
		id := idle[rand.IntN(n)]
		d, err := timedRetry(ctx, &limited, func() error { _, err := b.cfg.Client.GetSandbox(ctx, id); return err })
		if err != nil {
			apiErr = fmt.Errorf("get sandbox %s: %w", id, err)
			break
		}
		gets = append(gets, d)
	}
	var getSt, listSt *Stats
	if apiErr == nil {
		st := Summarize("ms", Millis(gets))
		getSt = &st
		p.GetP50MS, p.GetP99MS = ptr(st.P50), ptr(st.P99)
	}
	record(fmt.Sprintf("%s%d", MScaleIdleGetPrefix, n), fmt.Sprintf("with %d idle running sandboxes: GET /v1/sandboxes/{id} of a random one, %d times one after another (429s of the key's rate limit retried, untimed) (ms)", n, scaleGets), getSt, apiErr)
	var listErr error
	getLimited := limited.Swap(0)
	for range scaleLists {
		d, err := timedRetry(ctx, &limited, func() error { _, err := b.cfg.Client.ListSandboxes(ctx, client.SandboxFilter{}); return err })
		if err != nil {
			listErr = fmt.Errorf("list sandboxes: %w", err)
			break
		}
		lists = append(lists, d)
	}
	if listErr == nil {
		st := Summarize("ms", Millis(lists))
		listSt = &st
		p.ListP50MS, p.ListP99MS = ptr(st.P50), ptr(st.P99)
	}
	record(fmt.Sprintf("%s%d", MScaleIdleListPrefix, n), fmt.Sprintf("with %d idle running sandboxes: GET /v1/sandboxes (the first page, the server's default limit), %d times (ms)", n, scaleLists), listSt, listErr)
	for name, c := range map[string]int64{fmt.Sprintf("%s%d", MScaleIdleGetPrefix, n): getLimited, fmt.Sprintf("%s%d", MScaleIdleListPrefix, n): limited.Load()} {
		m := rep.Measurements[name]
		m.Note = fmt.Sprintf("%d answers 429 (the key's rate limit) retried after Retry-After; only the answered calls are timed", c)
		rep.Measurements[name] = m
	}

	// (c) reconcile.
	rc, err := b.reconcile(ctx)
	var rcSt *Stats
	if err == nil {
		st := Summarize("ms", []float64{rc.ms})
		rcSt = &st
		p.ReconcileMS, p.ReconcileFrom = ptr(round3(rc.ms)), rc.from
		if rc.sandboxes >= 0 {
			p.ReconcileSandboxes = ptr(rc.sandboxes)
		}
	}
	name := fmt.Sprintf("%s%d", MScaleIdleReconPrefix, n)
	record(name, fmt.Sprintf("with %d idle running sandboxes: the controller's reconcile round from the server's metrics: the mean of %s over %s (sum and count deltas), else the gauge %s (ms)", n, MetricReconcileSeconds, scaleReconWindow, MetricReconcileLast), rcSt, err)
	if err == nil {
		m := rep.Measurements[name]
		m.Note = "from the " + rc.from
		if rc.sandboxes >= 0 {
			m.Note += fmt.Sprintf("; %s %.0f", MetricReconcileSandboxes, rc.sandboxes)
		}
		rep.Measurements[name] = m
	}
	b.progress("scale idle %d: pss %s MiB/sandbox, get p99 %s ms, list p99 %s ms, reconcile %s ms", n, fmtPtr(p.PSSMiB), fmtPtr(p.GetP99MS), fmtPtr(p.ListP99MS), fmtPtr(p.ReconcileMS))
	return p
}

// reconcileReading is one reconcile measurement.
type reconcileReading struct {
	ms        float64
	from      string  // "histogram" or "gauge"
	sandboxes float64 // the gauge's covered sandboxes, -1 when absent
}

// reconcile scrapes cfg.MetricsURL twice, scaleReconWindow apart.
func (b *bencher) reconcile(ctx context.Context) (reconcileReading, error) {
	if b.cfg.MetricsURL == "" {
		return reconcileReading{}, skipf("no --metrics-url: the server's Prometheus endpoint (airlock up/server --metrics-addr) is needed to read %s", MetricReconcileSeconds)
	}
	first, err := b.scrape(ctx)
	if err != nil {
		return reconcileReading{}, err
	}
	if err := sleepCtx(ctx, scaleReconWindow); err != nil {
		return reconcileReading{}, err
	}
	second, err := b.scrape(ctx)
	if err != nil {
		return reconcileReading{}, err
	}
	return reconcileFrom(first, second)
}

func (b *bencher) scrape(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.cfg.MetricsURL, nil)
	if err != nil {
		return nil, fmt.Errorf("--metrics-url %s: %w", b.cfg.MetricsURL, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", b.cfg.MetricsURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: HTTP %d", b.cfg.MetricsURL, resp.StatusCode)
	}
	return ParseMetrics(resp.Body)
}

// ParseMetrics parses a Prometheus text exposition.
func ParseMetrics(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(prommodel.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	return fams, nil
}

// reconcileFrom reads the reconcile time from two scrapes: the histogram's
// mean over the window when a round ended in it, else the last-round
// gauge of the second scrape.
func reconcileFrom(first, second map[string]*dto.MetricFamily) (reconcileReading, error) {
	rd := reconcileReading{sandboxes: -1}
	if v, ok := gaugeValue(second, MetricReconcileSandboxes); ok {
		rd.sandboxes = v
	}
	s0, c0, ok0 := histogramSums(first, MetricReconcileSeconds)
	s1, c1, ok1 := histogramSums(second, MetricReconcileSeconds)
	if ok0 && ok1 && c1 > c0 {
		rd.ms, rd.from = (s1-s0)/float64(c1-c0)*1000, "histogram"
		return rd, nil
	}
	if v, ok := gaugeValue(second, MetricReconcileLast); ok {
		rd.ms, rd.from = v*1000, "gauge"
		return rd, nil
	}
	if ok1 {
		return rd, fmt.Errorf("%s counted no round in %s and there is no %s", MetricReconcileSeconds, scaleReconWindow, MetricReconcileLast)
	}
	return rd, skipf("the server exports neither %s nor %s", MetricReconcileSeconds, MetricReconcileLast)
}

// histogramSums adds up the sample sums and counts of every series of a
// histogram (or summary) family.
func histogramSums(fams map[string]*dto.MetricFamily, name string) (sum float64, count uint64, ok bool) {
	f := fams[name]
	if f == nil {
		return 0, 0, false
	}
	for _, m := range f.GetMetric() {
		switch {
		case m.GetHistogram() != nil:
			sum += m.GetHistogram().GetSampleSum()
			count += m.GetHistogram().GetSampleCount()
			ok = true
		case m.GetSummary() != nil:
			sum += m.GetSummary().GetSampleSum()
			count += m.GetSummary().GetSampleCount()
			ok = true
		}
	}
	return sum, count, ok
}

// gaugeValue is the value of a gauge's (first) series.
func gaugeValue(fams map[string]*dto.MetricFamily, name string) (float64, bool) {
	f := fams[name]
	if f == nil || len(f.GetMetric()) == 0 {
		return 0, false
	}
	m := f.GetMetric()[0]
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue(), true
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue(), true
	}
	return 0, false
}

// memAvailableMiB reads MemAvailable from /proc/meminfo.
func memAvailableMiB() (float64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return meminfoField(f, "MemAvailable:")
}

// meminfoField returns a "Key:   123 kB" field of meminfo or smaps_rollup
// in MiB.
func meminfoField(r io.Reader, key string) (float64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), key)
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			break
		}
		kb, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, fmt.Errorf("%s %q: %w", key, rest, err)
		}
		return kb / 1024, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no %s field", strings.TrimSuffix(key, ":"))
}

// pssBySandbox sums the PSS of the host's processes per sandbox id their
// command line contains. It is errSkip when no process names any of
// them: the bench does not run on the worker's host (or cannot see its
// processes).
func pssBySandbox(ids []string) (map[string]float64, int, error) {
	procs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil || len(procs) == 0 {
		return nil, 0, skipf("no /proc to read processes from")
	}
	self := strconv.Itoa(os.Getpid())
	out := map[string]float64{}
	n := 0
	for _, dir := range procs {
		if filepath.Base(dir) == self {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil || len(cmdline) == 0 {
			continue
		}
		id := idIn(string(cmdline), ids)
		if id == "" {
			continue
		}
		f, err := os.Open(filepath.Join(dir, "smaps_rollup"))
		if err != nil {
			continue // exited, or not ours to read
		}
		pss, err := meminfoField(f, "Pss:")
		f.Close()
		if err != nil {
			continue
		}
		out[id] += pss
		n++
	}
	if n == 0 {
		return nil, 0, skipf("no process on this host has a bench sandbox id in its command line: run the bench on the worker's host, as root, to measure memory")
	}
	return out, n, nil
}

// idIn returns the id of ids that s contains ("" for none).
func idIn(s string, ids []string) string {
	i := slices.IndexFunc(ids, func(id string) bool { return strings.Contains(s, id) })
	if i < 0 {
		return ""
	}
	return ids[i]
}
