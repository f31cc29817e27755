package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/model"
)

// GroupFork measures forking a running sandbox (checkpoint + fork into
// Config.ForkCount, each running `true`). The org needs the feature gate
// "snapshots" (`airlock org set <org> --features snapshots`); without it
// the measurements are recorded as missing with that reason.
const GroupFork = "fork"

// Fork measurement names.
const (
	MForkTotal      = "fork_total"            // checkpoint request → every fork ran `true`
	MForkCheckpoint = "fork_checkpoint"       // the checkpoint of the running sandbox
	MForkForks      = "fork_after_checkpoint" // fork request → every fork ran `true`
)

// forks times cfg.ForkRuns rounds of: checkpoint a running sandbox (it
// keeps running), fork cfg.ForkCount sandboxes from the checkpoint in one
// request, wait for every fork's operation and run `true` in each. The
// forks of a round are deleted (untimed) before the next.
func (b *bencher) forks(ctx context.Context) (total, ckpt, fork *Stats, err error) {
	id, err := b.create(ctx, b.request())
	if err != nil {
		return nil, nil, nil, err
	}
	defer b.deleteLogged(ctx, id)
	if err := b.runTrue(ctx, id); err != nil {
		return nil, nil, nil, err
	}
	var ts, cs, fs []time.Duration
	for i := range b.cfg.ForkRuns {
		name := fmt.Sprintf("bench-fork-%d", i)
		t0 := time.Now()
		op, err := b.cfg.Client.CreateCheckpoint(ctx, id, name)
		if err := b.succeeded(ctx, op, err); err != nil {
			if i == 0 && (isStatus(err, http.StatusForbidden) || unsupported(err) || isStatus(err, http.StatusConflict)) {
				return nil, nil, nil, skipf("the server cannot checkpoint this sandbox (forks need the org's feature gate %q: airlock org set <org> --features %s, and the gvisor runtime): %v",
					model.FeatureSnapshots, model.FeatureSnapshots, err)
			}
			return nil, nil, nil, fmt.Errorf("checkpoint %s: %w", id, err)
		}
		t1 := time.Now()
		forks, err := b.cfg.Client.ForkSandbox(ctx, client.CreateSandboxRequest{
			FromCheckpoint: &client.CheckpointRef{SandboxID: id, Checkpoint: name}, Count: b.cfg.ForkCount}, "")
		for _, f := range forks {
			if f.Sandbox.ID != "" {
				b.track(f.Sandbox)
			}
		}
		if err != nil {
			return nil, nil, nil, fmt.Errorf("fork %s into %d: %w", id, b.cfg.ForkCount, err)
		}
		errs := make([]error, len(forks))
		var wg sync.WaitGroup
		for j, f := range forks {
			wg.Go(func() {
				err := b.succeeded(ctx, f.Operation, nil)
				if err != nil {
					err = fmt.Errorf("fork %s: %w", f.Sandbox.ID, err)
				} else {
					err = b.runTrue(ctx, f.Sandbox.ID)
				}
				errs[j] = err
			})
		}
		wg.Wait()
		t2 := time.Now()
		ids := make([]string, len(forks))
		for j, f := range forks {
			ids[j] = f.Sandbox.ID
		}
		if err := errors.Join(append(errs, b.deleteAll(ctx, ids))...); err != nil {
			return nil, nil, nil, err
		}
		if len(forks) != b.cfg.ForkCount {
			return nil, nil, nil, fmt.Errorf("fork %s into %d: the server made %d", id, b.cfg.ForkCount, len(forks))
		}
		ts, cs, fs = append(ts, t2.Sub(t0)), append(cs, t1.Sub(t0)), append(fs, t2.Sub(t1))
		b.progress("fork into %d: %d/%d (checkpoint %.0f ms, forks %.0f ms)", b.cfg.ForkCount, i+1, b.cfg.ForkRuns,
			float64(t1.Sub(t0))/1e6, float64(t2.Sub(t1))/1e6)
	}
	t, c, f := Summarize("ms", Millis(ts)), Summarize("ms", Millis(cs)), Summarize("ms", Millis(fs))
	return &t, &c, &f, nil
}
