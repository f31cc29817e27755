package worker

// Self-fencing. The server counts a worker lost once it has had no
// heartbeat for its loss grace (workerapi.RegisterResponse.WorkerLossGraceS,
// `airlock server --worker-loss-grace`), and may then restore the worker's
// sandboxes elsewhere (--on-worker-loss restore) or move a wake away. A
// worker cut off from every server cannot hear that, so it acts first:
// once no Sync has succeeded for FenceFraction of the grace, it pauses
// every running sandbox, so that a sandbox never runs on two workers at
// once. When a Sync succeeds again the plan takes over: an assigned
// sandbox desired running is paused here, so it is resumed (plan rule 4);
// one no longer assigned is deleted (rule 5) — before anything else of it
// runs. Long polls are kept below a quarter of the grace, so a healthy
// worker's syncs always return well before the fence.

import (
	"context"
	"sync"
	"time"

	"github.com/airlock/airlock/internal/model"
)

// FenceFraction of the server's loss grace without a successful Sync
// pauses a worker's running sandboxes.
const FenceFraction = 0.75

type fenceState struct {
	mu       sync.Mutex
	grace    time.Duration // the server's loss grace (0: not known: no fence)
	lastSync time.Time     // the last successful Sync (or registration)
	fenced   bool          // the running sandboxes were paused for it
}

func (f *fenceState) registered(grace time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.grace = grace
	f.lastSync = time.Now()
}

// synced records a successful Sync and reports whether a fence ends.
func (f *fenceState) synced() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastSync = time.Now()
	was := f.fenced
	f.fenced = false
	return was
}

// pollWait is the long poll to ask for: SyncWait, or less than a quarter
// of the grace.
func (f *fenceState) pollWait() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.grace > 0 {
		return min(SyncWait, f.grace/4)
	}
	return SyncWait
}

// due reports, once per fence, that the fence is due, with how long the
// worker has been cut off.
func (f *fenceState) due(now time.Time) (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.grace <= 0 || f.lastSync.IsZero() || f.fenced {
		return 0, false
	}
	off := now.Sub(f.lastSync)
	if off < time.Duration(float64(f.grace)*FenceFraction) {
		return 0, false
	}
	f.fenced = true
	return off, true
}

// fenceLoop pauses the running sandboxes when the fence is due.
func (w *Worker) fenceLoop(ctx context.Context) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		off, due := w.fence.due(time.Now())
		if !due {
			continue
		}
		w.mu.Lock()
		n := 0
		for _, sb := range w.sandboxes {
			if sb.state == model.StateRunning && !sb.busy {
				w.startPause(ctx, sb, true)
				n++
			}
		}
		w.mu.Unlock()
		w.log.Warn("cut off from every server: pausing the running sandboxes, which the server may restore elsewhere; they resume once a sync succeeds and still assigns them",
			"cut_off", off.Round(time.Second), "sandboxes", n)
	}
}
