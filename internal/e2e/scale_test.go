package e2e

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/worker"
)

// idleSandboxes is how many sandboxes TestIdleSandboxes runs at once on the
// one e2e worker (issue "Performance": 200 with default resources).
const idleSandboxes = 200

// TestIdleSandboxes creates 200 sandboxes with default resources (1 vCPU,
// 512 MiB each: 200 vCPUs and 100 GiB of limits on a 2-core machine) on
// the stack's one worker, as an agent platform's bursts do, and asserts
// that every one reaches running and answers a command: the worker's
// capacity is overcommitted (docs/operations.md) and only measured free
// memory could refuse one. Creates that hit the org's create rate (429)
// are retried after Retry-After, as a client should. It logs what the
// host's available memory fell by per sandbox. Not timed: speed is
// airlock bench's (group scale).
func TestIdleSandboxes(t *testing.T) {
	if testing.Short() {
		t.Skip("creates 200 sandboxes")
	}
	s := need(t)
	c := s.client()
	ctx := ctxT(t, 15*time.Minute)
	availBefore, _ := worker.HostFreeMiB(0)()

	ids := make([]string, idleSandboxes)
	ops := make([]string, idleSandboxes)
	var mu sync.Mutex
	var created []string
	t.Cleanup(func() { deleteAll(t, c, &mu, &created) })

	errs := make([]error, idleSandboxes)
	work := make(chan int)
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			for i := range work {
				for {
					sb, op, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Metadata: map[string]string{"suite": "scale"}}, fmt.Sprintf("idle-%d-%d", i, time.Now().UnixNano()))
					var ae *client.APIError
					if errors.As(err, &ae) && ae.Status == 429 && ctx.Err() == nil {
						time.Sleep(max(ae.RetryAfter, 100*time.Millisecond))
						continue
					}
					if err != nil {
						errs[i] = err
						break
					}
					mu.Lock()
					created = append(created, sb.ID)
					mu.Unlock()
					ids[i], ops[i] = sb.ID, op.ID
					if _, err := c.WaitOperation(ctx, op.ID); err != nil {
						errs[i] = fmt.Errorf("create %s: %w", sb.ID, err)
					}
					break
				}
			}
		})
	}
	for i := range idleSandboxes {
		work <- i
	}
	close(work)
	wg.Wait()
	failed := 0
	for i, err := range errs {
		if err != nil {
			failed++
			if failed <= 5 {
				t.Errorf("sandbox %d: %v", i, err)
			}
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d sandboxes did not start", failed, idleSandboxes)
	}
	running := 0
	for _, id := range ids {
		sb, err := c.GetSandbox(ctx, id)
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		if sb.State == model.StateRunning {
			running++
		} else {
			t.Errorf("sandbox %s is %s (%s), want running", id, sb.State, sb.Reason)
		}
	}
	if running != idleSandboxes {
		t.Fatalf("%d of %d sandboxes running", running, idleSandboxes)
	}
	// Every sandbox answers, the first and the last created alike.
	for _, id := range []string{ids[0], ids[idleSandboxes/2], ids[idleSandboxes-1]} {
		if r := sh(t, c, id, "echo ok"); r.stdout != "ok\n" || r.exit.ExitCode != 0 {
			t.Errorf("sandbox %s: %q exit %+v", id, r.stdout, r.exit)
		}
	}
	if availAfter, ok := worker.HostFreeMiB(0)(); ok {
		t.Logf("%d idle sandboxes running; host available memory fell by %d MiB (%.1f MiB per sandbox)",
			idleSandboxes, availBefore-availAfter, float64(availBefore-availAfter)/idleSandboxes)
	}
}

// deleteAll deletes the sandboxes in *ids and waits for every delete.
func deleteAll(t *testing.T, c *client.Client, mu *sync.Mutex, ids *[]string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	mu.Lock()
	all := append([]string(nil), (*ids)...)
	mu.Unlock()
	work := make(chan string)
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			for id := range work {
				op, err := c.DeleteSandbox(ctx, id)
				if err == nil {
					_, err = c.WaitOperation(ctx, op.ID)
				}
				if err != nil && !errors.Is(err, model.ErrNotFound) {
					t.Errorf("delete %s: %v", id, err)
				}
			}
		})
	}
	for _, id := range all {
		work <- id
	}
	close(work)
	wg.Wait()
}
