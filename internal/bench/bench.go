// Package bench measures an Airlock installation through its public API, the
// way a user experiences it, and reports the numbers as JSON: create →
// first-exec latency (sequential, concurrent and from a warm pool), exec
// round trip, file write/read throughput, pause/resume latency,
// suspend/wake latency with dirtied memory, scaling curves (GroupScale:
// create bursts, idle sandboxes' memory, API latency and reconcile time,
// with PNG plots, plot.go), and the raw `runsc do true`
// baseline measured in the same run so the overhead of the platform over
// the runtime is visible.
// Every sandbox it creates is deleted before Run returns, also on error or
// cancellation.
package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
)

// Config says what to measure and against what.
type Config struct {
	Client  *client.Client
	APIURL  string // recorded in the report
	Runtime string // sandbox runtime ("" for the server default)
	// Template for every sandbox ("" for "base").
	Template string
	// Sandboxes is how many sandboxes each create→first-exec measurement
	// creates (default 20); also the number of `runsc do true` runs.
	Sandboxes int
	// Concurrency is how many sandboxes the concurrent measurement creates
	// at once (default 10).
	Concurrency int
	// ExecIterations is how many `true` round trips to time (default 200).
	ExecIterations int
	// FileBytes is the size of the throughput file (default 64 MiB) and
	// FileRuns how often it is written and read (default 5 each).
	FileBytes int64
	FileRuns  int
	// Runsc is the runsc binary for the baseline ("": not found; RunscWhy
	// says why).
	Runsc    string
	RunscWhy string
	// LifecycleRuns is how many pause and resume round trips to time
	// (default 20).
	LifecycleRuns int
	// SuspendRuns is how many suspend and wake round trips to time per
	// dirtied size (default 5); SuspendMiB are the sizes (default 16, 256).
	SuspendRuns int
	SuspendMiB  []int
	// PoolSize is the warm pool the warm-create measurement configures
	// (default 3, at least 3) and PoolRuns how many claims it times
	// (default 10). It needs an operator key.
	PoolSize int
	PoolRuns int
	// ForkRuns is how many checkpoint + fork rounds GroupFork times
	// (default 5) and ForkCount how many sandboxes each round forks
	// (default 10, at most apitypes.MaxForks).
	ForkRuns  int
	ForkCount int
	// TemplatesRuns is how many template imports and cached rebuilds of
	// the base recipe GroupTemplates times (default 5); TemplatesBoots how
	// many start-command template variants it boots (default 10; the
	// samples from the template image are Sandboxes); TemplatesCold
	// whether it times one --no-cache build of the base recipe (minutes).
	TemplatesRuns  int
	TemplatesBoots int
	TemplatesCold  bool
	// Airlock is the airlock binary GroupTemplates runs `airlock template
	// import` with and DataDir the worker's data directory it imports
	// into ("": the import is skipped).
	Airlock string
	DataDir string
	// ScaleBurst is how many sandboxes each create burst of GroupScale
	// creates (default 100; at concurrency 1 at most 20), ScaleConcurrency
	// the burst's requests in flight (default 1, 10, 50, 100) and ScaleIdle
	// the numbers of idle running sandboxes it measures at (default 10,
	// 100, 500, 1000). MetricsURL is the server's Prometheus endpoint the
	// reconcile time is read from ("": not measured).
	ScaleBurst       int
	ScaleConcurrency []int
	ScaleIdle        []int
	MetricsURL       string
	// Only restricts the run to these groups (see Groups; nil: all but
	// GroupEgress, which measures this machine rather than the API,
	// GroupTemplates, which builds for minutes and imports into DataDir,
	// and GroupScale, which runs up to a thousand sandboxes).
	Only []string
	// EgressRun runs GroupEgress (nil: the group is skipped, with the
	// reason in the report) and EgressConfig says how much it measures.
	EgressRun    EgressFunc
	EgressConfig EgressConfig
	// Progress receives one line per step (nil: discarded).
	Progress io.Writer
}

// wants reports whether group g is to be measured.
func (c *Config) wants(g string) bool {
	if len(c.Only) == 0 {
		return g != GroupEgress && g != GroupTemplates && g != GroupScale
	}
	return slices.Contains(c.Only, g)
}

func (c *Config) defaults() {
	if c.Sandboxes <= 0 {
		c.Sandboxes = 20
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 10
	}
	if c.ExecIterations <= 0 {
		c.ExecIterations = 200
	}
	if c.FileBytes <= 0 {
		c.FileBytes = 64 << 20
	}
	if c.FileRuns <= 0 {
		c.FileRuns = 5
	}
	if c.Template == "" {
		c.Template = "base"
	}
	if c.LifecycleRuns <= 0 {
		c.LifecycleRuns = 20
	}
	if c.SuspendRuns <= 0 {
		c.SuspendRuns = 5
	}
	if len(c.SuspendMiB) == 0 {
		c.SuspendMiB = []int{16, 256}
	}
	c.PoolSize = max(c.PoolSize, 3)
	if c.PoolRuns <= 0 {
		c.PoolRuns = 10
	}
	if c.ForkRuns <= 0 {
		c.ForkRuns = 5
	}
	if c.ForkCount <= 0 {
		c.ForkCount = 10
	}
	if c.TemplatesRuns <= 0 {
		c.TemplatesRuns = 5
	}
	if c.TemplatesBoots <= 0 {
		c.TemplatesBoots = 10
	}
	if c.ScaleBurst <= 0 {
		c.ScaleBurst = 100
	}
	if len(c.ScaleConcurrency) == 0 {
		c.ScaleConcurrency = []int{1, 10, 50, 100}
	}
	if len(c.ScaleIdle) == 0 {
		c.ScaleIdle = []int{10, 100, 500, 1000}
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
}

// Report is what Run produces.
type Report struct {
	Environment  Environment            `json:"environment"`
	Parameters   Parameters             `json:"parameters"`
	Measurements map[string]Measurement `json:"measurements"`
	// Ratios are derived from measurements, e.g.
	// "create_to_first_exec_p50_over_runsc_do_p50".
	Ratios map[string]float64 `json:"ratios"`
	// Egress is GroupEgress's report (absent when not asked for).
	Egress *EgressReport `json:"egress,omitempty"`
	// Templates is GroupTemplates's report (absent when not asked for).
	Templates *TemplatesReport `json:"templates,omitempty"`
	// Scale is GroupScale's curves (absent when not asked for).
	Scale *ScaleReport `json:"scale,omitempty"`
	// Errors lists the measurements that failed, also inside Measurements.
	Errors []string `json:"errors,omitempty"`
}

// Environment records where the numbers were taken.
type Environment struct {
	Host      string `json:"host"`
	Cores     int    `json:"cores"`
	Kernel    string `json:"kernel"`
	GoVersion string `json:"go_version"`
	OS        string `json:"os"`
	Arch      string `json:"arch"`
	Runtime   string `json:"runtime"`
	// RuntimeUsed is the runtime the server gave the bench's sandboxes
	// (from the sandboxes themselves).
	RuntimeUsed string `json:"runtime_used,omitempty"`
	APIURL      string `json:"api_url,omitempty"`
	Date        string `json:"date"` // RFC 3339, UTC
}

// Parameters echo the configuration.
type Parameters struct {
	Sandboxes      int      `json:"sandboxes"`
	Concurrency    int      `json:"concurrency"`
	ExecIterations int      `json:"exec_iterations"`
	FileBytes      int64    `json:"file_bytes"`
	FileRuns       int      `json:"file_runs"`
	LifecycleRuns  int      `json:"lifecycle_runs"`
	SuspendRuns    int      `json:"suspend_runs"`
	SuspendMiB     []int    `json:"suspend_mib"`
	PoolSize       int      `json:"pool_size"`
	PoolRuns       int      `json:"pool_runs"`
	ForkRuns       int      `json:"fork_runs,omitempty"`
	ForkCount      int      `json:"fork_count,omitempty"`
	Groups         []string `json:"groups"`
	// GroupEgress's, when it runs.
	EgressRequests      int   `json:"egress_requests,omitempty"`
	EgressDownloadBytes int64 `json:"egress_download_bytes,omitempty"`
	EgressDownloadRuns  int   `json:"egress_download_runs,omitempty"`
	// GroupTemplates's, when it runs.
	TemplatesRuns  int  `json:"templates_runs,omitempty"`
	TemplatesBoots int  `json:"templates_boots,omitempty"`
	TemplatesCold  bool `json:"templates_cold,omitempty"`
	// GroupScale's, when it runs.
	ScaleBurst       int    `json:"scale_burst,omitempty"`
	ScaleConcurrency []int  `json:"scale_concurrency,omitempty"`
	ScaleIdle        []int  `json:"scale_idle,omitempty"`
	MetricsURL       string `json:"metrics_url,omitempty"`
}

// Measurement is one measured quantity: statistics, or why it is absent.
type Measurement struct {
	*Stats
	Description string `json:"description"`
	Command     string `json:"command,omitempty"` // for the runsc baseline
	Missing     bool   `json:"missing,omitempty"`
	Error       string `json:"error,omitempty"`
	Note        string `json:"note,omitempty"`
}

// Measurement names in Report.Measurements.
const (
	MCreateSequential = "create_to_first_exec_sequential"
	MCreateConcurrent = "create_to_first_exec_concurrent"
	MExecRoundTrip    = "exec_round_trip"
	MWriteThroughput  = "file_write_throughput"
	MReadThroughput   = "file_read_throughput"
	MRunscDo          = "runsc_do_true"
	// MExecInGuest is the floor under exec_round_trip: posix_spawn +
	// waitpid of `true` inside the sandbox, no API, no agent.
	MExecInGuest = "exec_in_guest_spawn"
	// MDiskPrefix + "<S>mib": writing the last suspend snapshot's size to
	// the worker's data dir with fsync, the floor under a durable suspend.
	MDiskPrefix = "disk_write_fsync_"
)

// inGuestSpawn times n posix_spawn + waitpid of /bin/true inside a
// sandbox and prints one line of milliseconds per spawn.
const inGuestSpawn = `import os,sys,time
for _ in range(int(sys.argv[1])):
    t=time.perf_counter()
    os.waitpid(os.posix_spawn("/bin/true",["true"],os.environ),0)
    print("%.4f" % ((time.perf_counter()-t)*1000))
`

// FileSandboxMiB is the memory of the sandbox the file throughput is
// measured in: a file in the guest's /tmp is held in its memory, and a
// rewrite keeps the old file until the new one is renamed over it.
func FileSandboxMiB(fileBytes int64) int { return max(512, int(2*(fileBytes>>20))+256) }

// Run measures everything and returns the report. Failing measurements are
// recorded in the report (Errors) and do not stop the others; the returned
// error is non-nil when any failed or ctx was cancelled.
func Run(ctx context.Context, cfg Config) (Report, error) {
	cfg.defaults()
	b := &bencher{cfg: cfg, live: map[string]bool{}}
	groups := slices.DeleteFunc(slices.Clone(Groups), func(g string) bool { return !cfg.wants(g) })
	rep := Report{
		Environment: environment(cfg),
		Parameters: Parameters{Sandboxes: cfg.Sandboxes, Concurrency: cfg.Concurrency,
			ExecIterations: cfg.ExecIterations, FileBytes: cfg.FileBytes, FileRuns: cfg.FileRuns,
			LifecycleRuns: cfg.LifecycleRuns, SuspendRuns: cfg.SuspendRuns, SuspendMiB: cfg.SuspendMiB,
			PoolSize: cfg.PoolSize, PoolRuns: cfg.PoolRuns, Groups: groups},
		Measurements: map[string]Measurement{},
		Ratios:       map[string]float64{},
	}
	if cfg.wants(GroupEgress) {
		e := cfg.EgressConfig
		e.Defaults()
		rep.Parameters.EgressRequests, rep.Parameters.EgressDownloadBytes, rep.Parameters.EgressDownloadRuns = e.Requests, e.DownloadBytes, e.DownloadRuns
	}
	if cfg.wants(GroupTemplates) {
		rep.Parameters.TemplatesRuns, rep.Parameters.TemplatesBoots, rep.Parameters.TemplatesCold = cfg.TemplatesRuns, cfg.TemplatesBoots, cfg.TemplatesCold
	}
	if cfg.wants(GroupFork) {
		rep.Parameters.ForkRuns, rep.Parameters.ForkCount = cfg.ForkRuns, cfg.ForkCount
	}
	if cfg.wants(GroupScale) {
		rep.Parameters.ScaleBurst, rep.Parameters.ScaleConcurrency, rep.Parameters.ScaleIdle, rep.Parameters.MetricsURL = cfg.ScaleBurst, cfg.ScaleConcurrency, cfg.ScaleIdle, cfg.MetricsURL
	}
	defer b.cleanup(ctx)

	record := func(name, desc string, st *Stats, err error) {
		m := Measurement{Stats: st, Description: desc}
		var skip errSkip
		switch {
		case errors.As(err, &skip):
			m.Stats, m.Missing, m.Error = nil, true, skip.why
		case err != nil:
			m.Stats = nil
			m.Error = err.Error()
			rep.Errors = append(rep.Errors, name+": "+err.Error())
		}
		rep.Measurements[name] = m
	}

	// The baseline first, while the machine is quiet.
	if cfg.wants(GroupRunsc) {
		rep.Measurements[MRunscDo] = b.runscDo(ctx)
	}

	if cfg.wants(GroupCreate) {
		st, err := b.createToFirstExec(ctx, 1)
		record(MCreateSequential, fmt.Sprintf("create a sandbox, wait for its create operation, run `true` in it; %d sandboxes one after another (ms)", cfg.Sandboxes), st, err)
		if ctx.Err() == nil {
			st, err = b.createToFirstExec(ctx, cfg.Concurrency)
			record(MCreateConcurrent, fmt.Sprintf("as sequential, %d sandboxes in rounds of %d started at once (ms)", cfg.Sandboxes, cfg.Concurrency), st, err)
		}
	}
	if ctx.Err() == nil && cfg.wants(GroupExec) {
		execSt, wSt, rSt, gSt, errs := b.inOneSandbox(ctx)
		record(MExecRoundTrip, fmt.Sprintf("create + attach + exit of `true` in a running sandbox, %d times (ms)", cfg.ExecIterations), execSt, errs[0])
		record(MExecInGuest, fmt.Sprintf("floor of the round trip: posix_spawn + waitpid of /bin/true inside the same sandbox (python3), %d times; no API, no agent (ms)", cfg.ExecIterations), gSt, errs[3])
		record(MWriteThroughput, fmt.Sprintf("write a %d-byte file into /tmp of a sandbox with %d MiB of memory, %d times (MB/s, MB = 10^6 bytes)", cfg.FileBytes, FileSandboxMiB(cfg.FileBytes), cfg.FileRuns), wSt, errs[1])
		record(MReadThroughput, fmt.Sprintf("read the %d-byte file back, %d times (MB/s)", cfg.FileBytes, cfg.FileRuns), rSt, errs[2])
	}
	if ctx.Err() == nil && cfg.wants(GroupLifecycle) {
		p, r, err := b.pauseResume(ctx)
		record(MPause, fmt.Sprintf("pause a running sandbox and wait for its operation, %d times (ms)", cfg.LifecycleRuns), p, err)
		record(MResume, fmt.Sprintf("resume the paused sandbox and wait for its operation, %d times (ms)", cfg.LifecycleRuns), r, err)
	}
	if cfg.wants(GroupSuspend) {
		for _, mib := range cfg.SuspendMiB {
			if ctx.Err() != nil {
				break
			}
			s, w, snap, err := b.suspendWake(ctx, mib)
			sfx := fmt.Sprintf("%dmib", mib)
			if snap > 0 {
				d, derr := b.diskFloor(snap)
				record(MDiskPrefix+sfx, fmt.Sprintf("floor of the suspend: write the last snapshot's size (%d bytes) of random data into the worker's data dir with fsync, %d times (ms)", snap, cfg.SuspendRuns), d, derr)
			}
			record(MSuspendPrefix+sfx, fmt.Sprintf("suspend a sandbox (%d MiB memory) in which a process dirtied %d MiB and wait for its operation, %d times (ms)", SuspendMemoryMiB(mib), mib, cfg.SuspendRuns), s, err)
			record(MWakePrefix+sfx, fmt.Sprintf("wake it and wait for its operation, %d times; the process's RSS is checked after each wake (ms)", cfg.SuspendRuns), w, err)
			if snap > 0 {
				for _, n := range []string{MSuspendPrefix + sfx, MWakePrefix + sfx} {
					m := rep.Measurements[n]
					m.Note = fmt.Sprintf("last snapshot: %d bytes", snap)
					rep.Measurements[n] = m
				}
			}
		}
	}
	if ctx.Err() == nil && cfg.wants(GroupPool) {
		st, claimed, err := b.warmPool(ctx)
		record(MWarmCreate, fmt.Sprintf("with a warm pool of %d for the template, full before each run: create, run `true`; %d times (ms)", cfg.PoolSize, cfg.PoolRuns), st, err)
		if st != nil {
			m := rep.Measurements[MWarmCreate]
			m.Note = fmt.Sprintf("%d of %d creates were served from the pool", claimed, cfg.PoolRuns)
			rep.Measurements[MWarmCreate] = m
		}
	}
	if ctx.Err() == nil && cfg.wants(GroupTemplate) {
		st, n, err := b.templateImage(ctx)
		record(MImageCreate, fmt.Sprintf("create a sandbox the worker starts from a template image (no pool), wait for its create operation, run `true`; %d sandboxes one after another (ms)", cfg.Sandboxes), st, err)
		if st != nil {
			m := rep.Measurements[MImageCreate]
			m.Note = fmt.Sprintf("%d of %d creates were started from the template image", n, cfg.Sandboxes)
			rep.Measurements[MImageCreate] = m
		}
	}
	if ctx.Err() == nil && cfg.wants(GroupFork) {
		t, c, f, err := b.forks(ctx)
		record(MForkTotal, fmt.Sprintf("checkpoint a running sandbox, fork %d sandboxes from it in one request, run `true` in each; %d times (ms)", cfg.ForkCount, cfg.ForkRuns), t, err)
		record(MForkCheckpoint, "the checkpoint of the running sandbox alone (it keeps running) (ms)", c, err)
		record(MForkForks, fmt.Sprintf("the fork request until every one of the %d forks ran `true` (ms)", cfg.ForkCount), f, err)
	}
	if ctx.Err() == nil && cfg.wants(GroupTemplates) {
		b.runTemplates(ctx, &rep, record)
	}
	if ctx.Err() == nil && cfg.wants(GroupScale) {
		b.runScale(ctx, &rep, record)
	}
	if ctx.Err() == nil && cfg.wants(GroupEgress) {
		b.runEgress(ctx, &rep)
	}
	b.mu.Lock()
	rep.Environment.RuntimeUsed = b.runtimeUsed
	b.mu.Unlock()

	if rt, g := rep.Measurements[MExecRoundTrip], rep.Measurements[MExecInGuest]; rt.Stats != nil && g.Stats != nil {
		if r, ok := Ratio(rt.P50, g.P50); ok {
			rep.Ratios["exec_round_trip_p50_over_exec_in_guest_spawn_p50"] = r
		}
	}
	if seq, base := rep.Measurements[MCreateSequential], rep.Measurements[MRunscDo]; seq.Stats != nil && base.Stats != nil && base.P50 > 0 {
		rep.Ratios["create_to_first_exec_p50_over_runsc_do_p50"] = round3(seq.P50 / base.P50)
	}
	if conc, base := rep.Measurements[MCreateConcurrent], rep.Measurements[MRunscDo]; conc.Stats != nil && base.Stats != nil && base.P50 > 0 {
		rep.Ratios["create_to_first_exec_concurrent_p50_over_runsc_do_p50"] = round3(conc.P50 / base.P50)
	}
	if warm, cold := rep.Measurements[MWarmCreate], rep.Measurements[MCreateSequential]; warm.Stats != nil && cold.Stats != nil {
		if r, ok := Ratio(warm.P50, cold.P50); ok {
			rep.Ratios["create_to_first_exec_warm_pool_p50_over_sequential_p50"] = r
		}
	}
	if img, cold := rep.Measurements[MImageCreate], rep.Measurements[MCreateSequential]; img.Stats != nil && cold.Stats != nil {
		if r, ok := Ratio(img.P50, cold.P50); ok {
			rep.Ratios["create_to_first_exec_template_image_p50_over_sequential_p50"] = r
		}
	}
	if ctx.Err() != nil {
		return rep, fmt.Errorf("bench interrupted: %w", ctx.Err())
	}
	if len(rep.Errors) > 0 {
		return rep, fmt.Errorf("bench: %d measurement(s) failed: %s", len(rep.Errors), strings.Join(rep.Errors, "; "))
	}
	return rep, nil
}

func environment(cfg Config) Environment {
	host, _ := os.Hostname()
	kernel := "unknown"
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = strings.TrimSpace(string(b))
	}
	rt := cfg.Runtime
	if rt == "" {
		rt = "server default"
	}
	return Environment{
		Host: host, Cores: goruntime.NumCPU(), Kernel: kernel, GoVersion: goruntime.Version(),
		OS: goruntime.GOOS, Arch: goruntime.GOARCH, Runtime: rt, APIURL: cfg.APIURL,
		Date: time.Now().UTC().Format(time.RFC3339),
	}
}

// bencher holds the sandboxes alive so cleanup can delete them.
type bencher struct {
	cfg         Config
	mu          sync.Mutex
	live        map[string]bool
	runtimeUsed string
}

// request is the create request of every sandbox the bench makes.
func (b *bencher) request() apitypes.CreateSandboxRequest {
	return apitypes.CreateSandboxRequest{Template: b.cfg.Template, Runtime: b.cfg.Runtime}
}

// track remembers a created sandbox for cleanup and its runtime for the
// report.
func (b *bencher) track(sb model.Sandbox) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.live[sb.ID] = true
	if sb.Runtime != "" && !strings.Contains(b.runtimeUsed, sb.Runtime) {
		if b.runtimeUsed != "" {
			b.runtimeUsed += ","
		}
		b.runtimeUsed += sb.Runtime
	}
}

func (b *bencher) deleteLogged(ctx context.Context, id string) {
	if err := b.delete(ctx, id); err != nil {
		b.progress("%v", err)
	}
}

func (b *bencher) progress(format string, args ...any) {
	fmt.Fprintf(b.cfg.Progress, "bench: "+format+"\n", args...)
}

// create creates a sandbox and waits until it runs.
func (b *bencher) create(ctx context.Context, req apitypes.CreateSandboxRequest) (string, error) {
	sb, op, err := b.cfg.Client.CreateSandbox(ctx, req, "")
	if sb.ID != "" {
		b.track(sb)
	}
	if err != nil {
		return "", fmt.Errorf("create sandbox: %w", err)
	}
	if !op.State.Done() {
		if op, err = b.cfg.Client.WaitOperation(ctx, op.ID); err != nil {
			return sb.ID, fmt.Errorf("wait for create of %s: %w", sb.ID, err)
		}
	}
	if op.State != model.OpSucceeded {
		return sb.ID, fmt.Errorf("create of %s %s: %s", sb.ID, op.State, op.Reason)
	}
	return sb.ID, nil
}

// delete deletes a sandbox and waits until it is gone.
func (b *bencher) delete(ctx context.Context, id string) error {
	op, err := b.cfg.Client.DeleteSandbox(ctx, id)
	for err != nil {
		// The key's request rate (a cleanup of hundreds of sandboxes
		// meets it): wait as told and ask again.
		d, limited := rateLimited(err)
		if !limited {
			break
		}
		t := time.NewTimer(max(d, 100*time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("delete %s: %w", id, err)
		case <-t.C:
		}
		op, err = b.cfg.Client.DeleteSandbox(ctx, id)
	}
	if err != nil {
		var apiErr *client.APIError
		if errors.As(err, &apiErr) && apiErr.Status == 404 {
			b.forget(id)
			return nil
		}
		return fmt.Errorf("delete %s: %w", id, err)
	}
	if !op.State.Done() {
		if op, err = b.cfg.Client.WaitOperation(ctx, op.ID); err != nil {
			return fmt.Errorf("wait for delete of %s: %w", id, err)
		}
	}
	if op.State != model.OpSucceeded {
		return fmt.Errorf("delete of %s %s: %s", id, op.State, op.Reason)
	}
	b.forget(id)
	return nil
}

func (b *bencher) forget(id string) {
	b.mu.Lock()
	delete(b.live, id)
	b.mu.Unlock()
}

// cleanupParallel is how many deletes cleanup has in flight.
const cleanupParallel = 16

// cleanup deletes every sandbox still alive, even when ctx is cancelled
// (rate-limited deletes are retried after Retry-After).
func (b *bencher) cleanup(ctx context.Context) {
	b.mu.Lock()
	ids := make([]string, 0, len(b.live))
	for id := range b.live {
		ids = append(ids, id)
	}
	b.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
	defer cancel()
	b.progress("deleting %d sandbox(es)", len(ids))
	work := make(chan string)
	var wg sync.WaitGroup
	for range min(len(ids), cleanupParallel) {
		wg.Go(func() {
			for id := range work {
				if err := b.delete(ctx, id); err != nil {
					b.progress("cleanup: %v (delete it with `airlock sandbox rm %s`)", err, id)
				}
			}
		})
	}
	for _, id := range ids {
		work <- id
	}
	close(work)
	wg.Wait()
}

// runTrue runs `true` in the sandbox and checks it exited 0.
func (b *bencher) runTrue(ctx context.Context, id string) error {
	cmd, err := b.cfg.Client.CreateCommand(ctx, id, apitypes.CreateCommandRequest{Argv: []string{"true"}})
	if err != nil {
		return fmt.Errorf("create command in %s: %w", id, err)
	}
	var out bytes.Buffer
	exit, err := client.RunCommand(ctx, cmd.AttachURL, cmd.Token, nil, &out, &out)
	if err != nil {
		return fmt.Errorf("run true in %s: %w", id, err)
	}
	if exit.ExitCode != 0 || exit.Error != "" || exit.Signal != "" {
		return fmt.Errorf("true in %s exited %d (signal %q, error %q): %s", id, exit.ExitCode, exit.Signal, exit.Error, out.String())
	}
	return nil
}

// createToFirstExec times create → running → first `true` for
// cfg.Sandboxes sandboxes, `parallel` at a time; each round's sandboxes are
// deleted (untimed) before the next round starts.
func (b *bencher) createToFirstExec(ctx context.Context, parallel int) (*Stats, error) {
	var samples []time.Duration
	for done := 0; done < b.cfg.Sandboxes; {
		n := min(parallel, b.cfg.Sandboxes-done)
		durs := make([]time.Duration, n)
		ids := make([]string, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				t0 := time.Now()
				id, err := b.create(ctx, b.request())
				ids[i] = id
				if err == nil {
					err = b.runTrue(ctx, id)
				}
				durs[i], errs[i] = time.Since(t0), err
			})
		}
		wg.Wait()
		var dels sync.WaitGroup
		delErrs := make([]error, n)
		for i, id := range ids {
			if id != "" {
				dels.Go(func() { delErrs[i] = b.delete(ctx, id) })
			}
		}
		dels.Wait()
		if err := errors.Join(append(errs, delErrs...)...); err != nil {
			return nil, err
		}
		samples = append(samples, durs...)
		done += n
		b.progress("create→first-exec (%d at a time): %d/%d", parallel, done, b.cfg.Sandboxes)
	}
	st := Summarize("ms", Millis(samples))
	return &st, nil
}

// inOneSandbox measures exec round trips and file throughput in one sandbox.
func (b *bencher) inOneSandbox(ctx context.Context) (execSt, writeSt, readSt, guestSt *Stats, errs [4]error) {
	req := b.request()
	req.Resources.MemoryMiB = FileSandboxMiB(b.cfg.FileBytes)
	id, err := b.create(ctx, req)
	if err != nil {
		errs = [4]error{err, err, err, err}
		return
	}
	defer func() {
		if err := b.delete(ctx, id); err != nil {
			b.progress("%v", err)
		}
	}()

	var durs []time.Duration
	for i := range b.cfg.ExecIterations {
		t0 := time.Now()
		if err := b.runTrue(ctx, id); err != nil {
			errs[0] = err
			break
		}
		durs = append(durs, time.Since(t0))
		if (i+1)%50 == 0 {
			b.progress("exec round trip: %d/%d", i+1, b.cfg.ExecIterations)
		}
	}
	if errs[0] == nil {
		st := Summarize("ms", Millis(durs))
		execSt = &st
	}

	guestSt, errs[3] = b.inGuestSpawn(ctx, id)
	writeSt, readSt, errs[1], errs[2] = b.throughput(ctx, id)
	return
}

// inGuestSpawn measures MExecInGuest in sandbox id.
func (b *bencher) inGuestSpawn(ctx context.Context, id string) (*Stats, error) {
	out, err := b.output(ctx, id, "python3", "-c", inGuestSpawn, strconv.Itoa(b.cfg.ExecIterations))
	if err != nil {
		return nil, err
	}
	var ms []float64
	for _, l := range strings.Fields(out) {
		v, err := strconv.ParseFloat(l, 64)
		if err != nil {
			return nil, fmt.Errorf("in-guest spawn timing: %q: %w", l, err)
		}
		ms = append(ms, v)
	}
	if len(ms) != b.cfg.ExecIterations {
		return nil, fmt.Errorf("in-guest spawn timing: %d samples, want %d", len(ms), b.cfg.ExecIterations)
	}
	st := Summarize("ms", ms)
	return &st, nil
}

func (b *bencher) throughput(ctx context.Context, id string) (w, r *Stats, werr, rerr error) {
	sess, err := b.cfg.Client.FilesSession(ctx, id)
	if err != nil {
		err = fmt.Errorf("files session on %s: %w", id, err)
		return nil, nil, err, err
	}
	fc := &client.FilesClient{URL: sess.URL, SandboxID: id, Token: sess.Token}
	data := make([]byte, b.cfg.FileBytes)
	rand.Read(data)
	const path = "/tmp/airlock-bench.bin"
	var ws, rs []float64
	for i := range b.cfg.FileRuns {
		t0 := time.Now()
		if _, err := fc.Write(ctx, path, bytes.NewReader(data), "0644", ""); err != nil {
			werr = fmt.Errorf("write %s:%s: %w", id, path, err)
			break
		}
		ws = append(ws, MBps(b.cfg.FileBytes, time.Since(t0)))
		b.progress("write %d/%d: %.1f MB/s", i+1, b.cfg.FileRuns, ws[len(ws)-1])
	}
	if werr != nil {
		rerr = fmt.Errorf("no file to read: %w", werr)
		return nil, nil, werr, rerr
	}
	st := Summarize("MB/s", ws)
	w = &st
	for i := range b.cfg.FileRuns {
		t0 := time.Now()
		body, err := fc.Read(ctx, path)
		if err != nil {
			rerr = fmt.Errorf("read %s:%s: %w", id, path, err)
			break
		}
		n, err := io.Copy(io.Discard, body)
		body.Close()
		d := time.Since(t0)
		if err == nil && n != b.cfg.FileBytes {
			err = fmt.Errorf("got %d bytes, want %d", n, b.cfg.FileBytes)
		}
		if err != nil {
			rerr = fmt.Errorf("read %s:%s: %w", id, path, err)
			break
		}
		rs = append(rs, MBps(n, d))
		b.progress("read %d/%d: %.1f MB/s", i+1, b.cfg.FileRuns, rs[len(rs)-1])
	}
	if rerr == nil {
		st := Summarize("MB/s", rs)
		r = &st
	}
	return w, r, nil, rerr
}

// FindRunsc locates runsc: $AIRLOCK_RUNSC, <dataDir>/bin/runsc, then PATH.
// It returns "" and the reason when none is usable.
func FindRunsc(getenv func(string) string, dataDir string) (string, string) {
	if p := getenv("AIRLOCK_RUNSC"); p != "" {
		if isExecutable(p) {
			return p, ""
		}
		return "", fmt.Sprintf("$AIRLOCK_RUNSC=%s is not an executable file", p)
	}
	if p := filepath.Join(dataDir, "bin", "runsc"); isExecutable(p) {
		return p, ""
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		return p, ""
	}
	return "", fmt.Sprintf("runsc not found ($AIRLOCK_RUNSC unset, no %s, none in PATH)", filepath.Join(dataDir, "bin", "runsc"))
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0
}

// runscDo times `runsc --network=none --platform=systrap do true`, with a
// private state directory so it cannot collide with a worker's.
func (b *bencher) runscDo(ctx context.Context) Measurement {
	m := Measurement{Description: fmt.Sprintf("raw gVisor baseline: `runsc do true`, %d times (ms)", b.cfg.Sandboxes)}
	if b.cfg.Runsc == "" {
		m.Missing, m.Error = true, b.cfg.RunscWhy
		return m
	}
	root, err := os.MkdirTemp("", "airlock-bench-runsc-")
	if err != nil {
		m.Missing, m.Error = true, fmt.Sprintf("make runsc state dir: %v", err)
		return m
	}
	defer RemoveRunscRoot(root)
	args := runscDoArgs(root)
	m.Command = b.cfg.Runsc + " " + strings.Join(args, " ")
	var durs []time.Duration
	for i := range b.cfg.Sandboxes {
		cmd := exec.CommandContext(ctx, b.cfg.Runsc, args...)
		t0 := time.Now()
		out, err := cmd.CombinedOutput()
		d := time.Since(t0)
		if err != nil {
			m.Missing = i == 0
			m.Error = fmt.Sprintf("run %d: %v: %s", i+1, err, strings.TrimSpace(lastLines(string(out), 3)))
			return m
		}
		durs = append(durs, d)
	}
	st := Summarize("ms", Millis(durs))
	m.Stats = &st
	b.progress("runsc do true: p50 %.1f ms", st.P50)
	return m
}

// runscDoArgs are the arguments of the raw baseline, with root as its
// private state directory.
func runscDoArgs(root string) []string {
	return []string{"--root", root, "--network=none", "--platform=systrap", "do", "true"}
}

// RemoveRunscRoot removes a private runsc state directory: runsc binds a
// network namespace at null-netns in it, which must be unmounted first
// (os.RemoveAll alone fails there and leaves the namespace bound).
func RemoveRunscRoot(root string) error {
	if err := unix.Unmount(filepath.Join(root, "null-netns"), unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s/null-netns: %w", root, err)
	}
	return os.RemoveAll(root)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
