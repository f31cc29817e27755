package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
)

// Lifecycle measurement names in Report.Measurements. The suspend and wake
// names get the dirtied size appended, e.g. "suspend_latency_16mib".
const (
	MPause         = "pause_latency"
	MResume        = "resume_latency"
	MSuspendPrefix = "suspend_latency_"
	MWakePrefix    = "wake_latency_"
	MWarmCreate    = "create_to_first_exec_warm_pool"
	MImageCreate   = "create_to_first_exec_template_image"
)

// Measurement groups Config.Only selects from.
const (
	GroupRunsc     = "runsc"     // runsc_do_true
	GroupCreate    = "create"    // create_to_first_exec_{sequential,concurrent}
	GroupExec      = "exec"      // exec round trip and file throughput
	GroupLifecycle = "lifecycle" // pause and resume
	GroupSuspend   = "suspend"   // suspend and wake with dirtied memory
	GroupPool      = "pool"      // create → first exec from a warm pool
	GroupTemplate  = "template"  // create → first exec from a template image
	// GroupFork (forks.go): checkpoint + fork of a running sandbox.
	// GroupEgress (egress.go), GroupTemplates (templates.go) and
	// GroupScale (scale.go) are not in the default set.
)

// Groups lists every measurement group, in the order Run measures them.
// An empty Config.Only means all of them but GroupEgress, GroupTemplates
// and GroupScale.
var Groups = []string{GroupRunsc, GroupCreate, GroupExec, GroupLifecycle, GroupSuspend, GroupPool, GroupTemplate, GroupFork, GroupTemplates, GroupScale, GroupEgress}

// errSkip marks a measurement the server cannot take (no lifecycle, a
// runtime without snapshots, no operator key): it is recorded as missing
// with the reason, not as a failure.
type errSkip struct{ why string }

func (e errSkip) Error() string { return e.why }

func skipf(format string, args ...any) error { return errSkip{fmt.Sprintf(format, args...)} }

// unsupported reports whether err from the first lifecycle request says the
// server or the runtime cannot do it at all (rather than a failure).
func unsupported(err error) bool {
	var ae *client.APIError
	if errors.As(err, &ae) {
		switch ae.Status {
		case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusNotImplemented, http.StatusUnprocessableEntity:
			return true
		}
	}
	var oe *client.OperationError
	return errors.As(err, &oe)
}

// lifecycleOp asks for one lifecycle change and waits until its operation
// succeeds; it returns the round trip.
func (b *bencher) lifecycleOp(ctx context.Context, verb string, id string) (time.Duration, error) {
	call := map[string]func(context.Context, string) (model.Operation, error){
		"pause": b.cfg.Client.PauseSandbox, "resume": b.cfg.Client.ResumeSandbox,
		"suspend": b.cfg.Client.SuspendSandbox, "wake": b.cfg.Client.WakeSandbox,
	}[verb]
	t0 := time.Now()
	op, err := call(ctx, id)
	if err := b.succeeded(ctx, op, err); err != nil {
		return 0, fmt.Errorf("%s %s: %w", verb, id, err)
	}
	return time.Since(t0), nil
}

// succeeded waits for op, as a request that returned (op, err) started
// it, until it is done: nil once it succeeded, a *client.OperationError
// when it ended otherwise.
func (b *bencher) succeeded(ctx context.Context, op model.Operation, err error) error {
	if err == nil && !op.State.Done() {
		op, err = b.cfg.Client.WaitOperation(ctx, op.ID)
	}
	if err == nil && op.State != model.OpSucceeded {
		err = &client.OperationError{Operation: op}
	}
	return err
}

// pauseResume times cfg.LifecycleRuns pause → running-paused and resume →
// running round trips in one sandbox.
func (b *bencher) pauseResume(ctx context.Context) (pause, resume *Stats, err error) {
	id, err := b.create(ctx, b.request())
	if err != nil {
		return nil, nil, err
	}
	defer b.deleteLogged(ctx, id)
	if err := b.runTrue(ctx, id); err != nil {
		return nil, nil, err
	}
	var ps, rs []time.Duration
	for i := range b.cfg.LifecycleRuns {
		d, err := b.lifecycleOp(ctx, "pause", id)
		if err != nil {
			if i == 0 && unsupported(err) {
				return nil, nil, skipf("the server cannot pause this sandbox: %v", err)
			}
			return nil, nil, err
		}
		ps = append(ps, d)
		if d, err = b.lifecycleOp(ctx, "resume", id); err != nil {
			return nil, nil, err
		}
		rs = append(rs, d)
		if (i+1)%5 == 0 {
			b.progress("pause/resume: %d/%d", i+1, b.cfg.LifecycleRuns)
		}
	}
	if err := b.runTrue(ctx, id); err != nil {
		return nil, nil, fmt.Errorf("after pause/resume: %w", err)
	}
	p, r := Summarize("ms", Millis(ps)), Summarize("ms", Millis(rs))
	return &p, &r, nil
}

// dirtyMarker is in the argv of the memory-dirtying process so that the
// RSS probe can find it (the probe builds the string at run time so that
// it does not match itself).
const dirtyMarker = "airlock-bench-dirty"

const rssProbe = `import os
m = b'airlock-bench-' + b'dirty'
best = 0
for p in os.listdir('/proc'):
    if not p.isdigit():
        continue
    try:
        if m not in open('/proc/%s/cmdline' % p, 'rb').read():
            continue
        for l in open('/proc/%s/status' % p):
            if l.startswith('VmRSS:'):
                best = max(best, int(l.split()[1]))
    except Exception:
        pass
print(best)
`

// SuspendMemoryMiB is the sandbox memory for dirtying mib MiB: the
// bytearray(os.urandom(n)) copy needs twice n at its peak, plus Python.
func SuspendMemoryMiB(mib int) int { return max(512, 2*mib+256) }

// suspendWake starts a process that dirties mib MiB in a fresh sandbox,
// waits until its RSS shows it, then times cfg.SuspendRuns suspend and
// wake round trips, checking after each wake that the process still holds
// its memory.
func (b *bencher) suspendWake(ctx context.Context, mib int) (suspend, wake *Stats, snapshotBytes int64, err error) {
	req := b.request()
	req.Resources.MemoryMiB = SuspendMemoryMiB(mib)
	id, err := b.create(ctx, req)
	if err != nil {
		return nil, nil, 0, err
	}
	defer b.deleteLogged(ctx, id)
	code := fmt.Sprintf("import os,time; b=bytearray(os.urandom(%d)); time.sleep(1e9)", mib<<20)
	cmd, err := b.cfg.Client.CreateCommand(ctx, id, apitypes.CreateCommandRequest{Argv: []string{"python3", "-c", code, dirtyMarker}})
	if err != nil {
		return nil, nil, 0, fmt.Errorf("start memory dirtier in %s: %w", id, err)
	}
	sess, err := client.AttachCommand(ctx, cmd.AttachURL, cmd.Token, 0)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("attach memory dirtier in %s: %w", id, err)
	}
	kind, payload, err := sess.Next()
	sess.Close() // detached from here on
	if err != nil || kind != agentapi.FrameStarted {
		return nil, nil, 0, fmt.Errorf("start memory dirtier in %s: frame %d %q: %v", id, kind, payload, err)
	}
	wantKiB := int64(mib) << 10 * 95 / 100
	if err := b.waitRSS(ctx, id, wantKiB, 5*time.Minute); err != nil {
		return nil, nil, 0, err
	}
	var ss, ws []time.Duration
	for i := range b.cfg.SuspendRuns {
		d, err := b.lifecycleOp(ctx, "suspend", id)
		if err != nil {
			if i == 0 && unsupported(err) {
				return nil, nil, 0, skipf("the server cannot suspend this sandbox: %v", err)
			}
			return nil, nil, 0, err
		}
		ss = append(ss, d)
		if sb, err := b.cfg.Client.GetSandbox(ctx, id); err == nil {
			snapshotBytes = sb.SnapshotBytes
		}
		if d, err = b.lifecycleOp(ctx, "wake", id); err != nil {
			return nil, nil, 0, err
		}
		ws = append(ws, d)
		if err := b.waitRSS(ctx, id, wantKiB, time.Minute); err != nil {
			return nil, nil, 0, fmt.Errorf("after wake %d: %w", i+1, err)
		}
		b.progress("suspend/wake with %d MiB dirty: %d/%d (suspend %.0f ms, wake %.0f ms)", mib, i+1, b.cfg.SuspendRuns,
			float64(ss[i])/1e6, float64(ws[i])/1e6)
	}
	s, w := Summarize("ms", Millis(ss)), Summarize("ms", Millis(ws))
	return &s, &w, snapshotBytes, nil
}

// waitRSS polls the dirtying process's RSS until it reaches wantKiB.
func (b *bencher) waitRSS(ctx context.Context, id string, wantKiB int64, within time.Duration) error {
	deadline := time.Now().Add(within)
	var last string
	for {
		out, err := b.output(ctx, id, "python3", "-c", rssProbe)
		if err == nil {
			last = strings.TrimSpace(out)
			if kib, err := strconv.ParseInt(last, 10, 64); err == nil && kib >= wantKiB {
				return nil
			}
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the memory dirtier in %s never reached %d KiB RSS within %s (last probe: %s)", id, wantKiB, within, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// output runs argv in the sandbox and returns its stdout; a non-zero exit
// is an error.
func (b *bencher) output(ctx context.Context, id string, argv ...string) (string, error) {
	cmd, err := b.cfg.Client.CreateCommand(ctx, id, apitypes.CreateCommandRequest{Argv: argv})
	if err != nil {
		return "", fmt.Errorf("create command in %s: %w", id, err)
	}
	var out, errOut bytes.Buffer
	exit, err := client.RunCommand(ctx, cmd.AttachURL, cmd.Token, nil, &out, &errOut)
	if err != nil {
		return "", fmt.Errorf("run %s in %s: %w", argv[0], id, err)
	}
	if exit.ExitCode != 0 || exit.Error != "" || exit.Signal != "" {
		return out.String(), fmt.Errorf("%s in %s exited %d (signal %q, error %q): %s", argv[0], id, exit.ExitCode, exit.Signal, exit.Error, lastLines(errOut.String(), 3))
	}
	return out.String(), nil
}

// warmPool configures a warm pool for the bench's template (size
// cfg.PoolSize, default resources), waits until it is full, then times
// cfg.PoolRuns creates → first exec, waiting for the pool to refill before
// each. The pool configuration that was there before is restored. claimed
// counts the creates that were served from the pool.
func (b *bencher) warmPool(ctx context.Context) (st *Stats, claimed int, err error) {
	if rt := b.cfg.Runtime; rt != "" && rt != "gvisor" {
		return nil, 0, skipf("warm pools hold sandboxes of the default runtime (gvisor) only; --runtime is %s", rt)
	}
	c := b.cfg.Client
	before, err := c.ListPools(ctx)
	if err != nil {
		if unsupported(err) || isStatus(err, http.StatusForbidden) {
			return nil, 0, skipf("cannot configure warm pools: %v", err)
		}
		return nil, 0, fmt.Errorf("list pools: %w", err)
	}
	set, err := c.SetPool(ctx, b.cfg.Template, apitypes.SetPoolRequest{Size: b.cfg.PoolSize})
	if err != nil {
		return nil, 0, fmt.Errorf("configure the warm pool of %s: %w", b.cfg.Template, err)
	}
	var prev *client.Pool
	for i := range before {
		if before[i].Digest == set.Digest {
			prev = &before[i]
		}
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		var rerr error
		if prev != nil {
			_, rerr = c.SetPool(rctx, prev.Template, apitypes.SetPoolRequest{Size: prev.Size, Resources: prev.Resources})
		} else {
			rerr = c.DeletePool(rctx, set.Digest)
		}
		if rerr != nil {
			b.progress("restore the warm pool of %s: %v", b.cfg.Template, rerr)
			err = errors.Join(err, fmt.Errorf("restore the warm pool of %s: %w", b.cfg.Template, rerr))
		}
	}()
	var durs []time.Duration
	for i := range b.cfg.PoolRuns {
		if err := b.waitPoolFull(ctx, set.Digest, b.cfg.PoolSize, 10*time.Minute); err != nil {
			return nil, claimed, err
		}
		t0 := time.Now()
		sb, op, err := c.CreateSandbox(ctx, b.request(), "")
		if sb.ID != "" {
			b.track(sb)
		}
		if err != nil {
			return nil, claimed, fmt.Errorf("create sandbox: %w", err)
		}
		if op.State == model.OpSucceeded {
			claimed++
		} else if op, err = c.WaitOperation(ctx, op.ID); err != nil {
			return nil, claimed, fmt.Errorf("wait for create of %s: %w", sb.ID, err)
		}
		if err := b.runTrue(ctx, sb.ID); err != nil {
			return nil, claimed, err
		}
		durs = append(durs, time.Since(t0))
		if err := b.delete(ctx, sb.ID); err != nil {
			return nil, claimed, err
		}
		b.progress("warm create→first-exec: %d/%d (%.0f ms, claimed %d)", i+1, b.cfg.PoolRuns, float64(durs[i])/1e6, claimed)
	}
	s := Summarize("ms", Millis(durs))
	return &s, claimed, nil
}

// waitPoolFull polls until the pool of digest has size ready members.
func (b *bencher) waitPoolFull(ctx context.Context, digest string, size int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		pools, err := b.cfg.Client.ListPools(ctx)
		if err != nil {
			return fmt.Errorf("list pools: %w", err)
		}
		ready := -1
		for _, p := range pools {
			if p.Digest == digest {
				ready = p.Ready
			}
		}
		if ready >= size {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the warm pool of %s has %d of %d members ready after %s", b.cfg.Template, ready, size, within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func isStatus(err error, status int) bool {
	var ae *client.APIError
	return errors.As(err, &ae) && ae.Status == status
}

// templateImage times create → first exec for sandboxes the worker starts
// from a template image (a started-and-checkpointed template, see
// internal/worker/templates.go). It first creates sandboxes until one
// reports started_from=template_image (the first create of a template
// builds the image in the background), for at most a minute; a server that
// never does (the runtime does not use images: `airlock up
// --template-images`) is a skip. Samples not started from the image are
// counted and reported.
func (b *bencher) templateImage(ctx context.Context) (st *Stats, fromImage int, err error) {
	deadline := time.Now().Add(time.Minute)
	for {
		id, err := b.create(ctx, b.request())
		if err != nil {
			return nil, 0, err
		}
		sb, gerr := b.cfg.Client.GetSandbox(ctx, id)
		if derr := b.delete(ctx, id); derr != nil {
			return nil, 0, derr
		}
		if gerr != nil {
			return nil, 0, gerr
		}
		if sb.StartedFrom == model.StartedTemplateImage {
			break
		}
		if time.Now().After(deadline) {
			return nil, 0, skipf("no sandbox of runtime %s started from a template image within a minute (started_from %q); start the server with --template-images naming the runtime", sb.Runtime, sb.StartedFrom)
		}
		b.progress("template image: waiting for the worker to build it")
		if err := sleepCtx(ctx, 2*time.Second); err != nil {
			return nil, 0, err
		}
	}
	var samples []time.Duration
	for i := range b.cfg.Sandboxes {
		t0 := time.Now()
		id, err := b.create(ctx, b.request())
		if err == nil {
			err = b.runTrue(ctx, id)
		}
		d := time.Since(t0)
		if id != "" {
			if sb, gerr := b.cfg.Client.GetSandbox(ctx, id); gerr == nil && sb.StartedFrom == model.StartedTemplateImage {
				fromImage++
			}
			if derr := b.delete(ctx, id); err == nil {
				err = derr
			}
		}
		if err != nil {
			return nil, fromImage, err
		}
		samples = append(samples, d)
		b.progress("create→first-exec from a template image: %d/%d", i+1, b.cfg.Sandboxes)
	}
	s := Summarize("ms", Millis(samples))
	return &s, fromImage, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// diskFloor writes n random bytes into a file in the worker's data dir
// (Config.DataDir) with fsync, cfg.SuspendRuns times, and removes it: what
// the disk alone needs for a durable snapshot of that size.
func (b *bencher) diskFloor(n int64) (*Stats, error) {
	if b.cfg.DataDir == "" {
		return nil, skipf("no data dir (--data-dir) to write into")
	}
	if st, err := os.Stat(b.cfg.DataDir); err != nil || !st.IsDir() {
		return nil, skipf("data dir %s: not a directory here (the bench is not on the worker's host?)", b.cfg.DataDir)
	}
	buf := make([]byte, 4<<20)
	rand.Read(buf)
	var durs []time.Duration
	for range b.cfg.SuspendRuns {
		f, err := os.CreateTemp(b.cfg.DataDir, ".bench-disk-")
		if err != nil {
			return nil, skipf("cannot write into %s: %v", b.cfg.DataDir, err)
		}
		t0 := time.Now()
		for left := n; left > 0 && err == nil; {
			k := min(left, int64(len(buf)))
			_, err = f.Write(buf[:k])
			left -= k
		}
		if err == nil {
			err = f.Sync()
		}
		d := time.Since(t0)
		f.Close()
		os.Remove(f.Name())
		if err != nil {
			return nil, fmt.Errorf("disk floor: %w", err)
		}
		durs = append(durs, d)
	}
	st := Summarize("ms", Millis(durs))
	return &st, nil
}
