package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/model"
)

// soakReport is what TestChurnSoak writes to $AIRLOCK_SOAK_REPORT.
type soakReport struct {
	Date         string         `json:"date"`
	Trials       int            `json:"trials"`
	Kills        map[string]int `json:"kills"`        // victim → SIGKILLs
	KillsDuring  map[string]int `json:"kills_during"` // action in flight → SIGKILLs
	Actions      map[string]int `json:"actions"`      // action → trials that ran it
	OpsSucceeded int            `json:"operations_succeeded"`
	OpsFailed    int            `json:"operations_failed"`
	OpsFailedWhy map[string]int `json:"operations_failed_reasons,omitempty"`
	Acknowledged int            `json:"sandboxes_acknowledged"` // create/fork operations that succeeded
	Lost         int            `json:"sandboxes_lost"`         // acknowledged, never deleted on request, yet failed, gone or changed
	LostWhy      []string       `json:"lost,omitempty"`
	FilesChecked int            `json:"files_checked"`
	Leaked       []string       `json:"leaked"`
	WorkerFDs    int            `json:"worker_fds_at_end"`
	DurationS    float64        `json:"duration_s"`
}

// soakSandbox is what the soak knows a sandbox must hold.
type soakSandbox struct {
	id    string
	files map[string]string // name → sha256 of every acknowledged write
	cp    int               // checkpoints made
}

// TestChurnSoak drives random lifecycle churn — create, exec, write,
// suspend, wake, checkpoint + fork, delete — in its own org, and SIGKILLs
// the worker or the server at a random point of about half the trials,
// restarting it on the same data. At the end:
//
//   - every sandbox whose create or fork was acknowledged and that was not
//     deleted on request is present and usable, with every acknowledged
//     file intact (sha256), or it counts as lost;
//   - every operation the soak started is done (succeeded or failed with a
//     reason), and the org has no sandbox left after its deletes;
//   - nothing of any sandbox it ever made remains on the host: no process,
//     mount, cgroup, network namespace, run or snapshot directory.
//
// AIRLOCK_SOAK_TRIALS sets the number of trials (default 8, the CI run);
// AIRLOCK_SOAK_REPORT names a JSON report to write (see docs/benchmarks/).
func TestChurnSoak(t *testing.T) {
	s := need(t)
	trials := 8
	if v, err := strconv.Atoi(os.Getenv("AIRLOCK_SOAK_TRIALS")); err == nil && v > 0 {
		trials = v
	}
	ctx := ctxT(t, time.Duration(trials)*2*time.Minute+10*time.Minute)
	start := time.Now()
	admin := s.client()
	org, err := admin.CreateOrg(ctx, fmt.Sprintf("soak-%d", time.Now().UnixNano()))
	if err != nil {
		t.Fatal(err)
	}
	fs := []string{model.FeatureSnapshots}
	if _, err := admin.UpdateOrg(ctx, org.ID, client.UpdateOrgRequest{Features: &fs}); err != nil {
		t.Fatal(err)
	}
	k, err := admin.CreateKey(ctx, org.ID, client.CreateKeyRequest{Name: "soak"})
	if err != nil {
		t.Fatal(err)
	}
	c := client.New(s.url(), k.Secret)
	// The soak is one busy key: it waits out the per-key rate limit (429
	// with Retry-After) rather than failing on it.
	c.HTTPClient = &http.Client{Transport: retry429{http.DefaultTransport}}
	rep := soakReport{Date: time.Now().UTC().Format(time.RFC3339), Trials: trials,
		Kills: map[string]int{}, KillsDuring: map[string]int{}, Actions: map[string]int{}, OpsFailedWhy: map[string]int{}}
	rng := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 1))
	t.Logf("soak seed time %s", rep.Date)

	var (
		live    = map[string]*soakSandbox{} // acknowledged and not deleted
		ever    = map[string]bool{}         // every sandbox id the soak made
		ops     []string                    // every operation it started
		deleted = map[string]bool{}         // deleted on request
	)
	lose := func(id, why string) {
		rep.Lost++
		rep.LostWhy = append(rep.LostWhy, id+": "+why)
		t.Errorf("lost sandbox %s: %s", id, why)
		delete(live, id)
		deleteSandbox(t, ctx, c, id) // a lost sandbox must still delete cleanly
		deleted[id] = true
	}
	// settle waits until op is done (or a while after a kill) and the
	// sandbox is in a state that can take the next request.
	settle := func(opID, id string) model.Operation {
		wctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
		defer cancel()
		op, err := c.WaitOperation(wctx, opID)
		if err != nil && !errors.Is(err, model.ErrConflict) && op.State == "" {
			op, _ = c.GetOperation(ctx, opID)
		}
		if op.State == model.OpSucceeded {
			rep.OpsSucceeded++
		} else {
			rep.OpsFailed++
			why := op.Reason
			if i := strings.IndexAny(why, ":("); i > 0 {
				why = why[:i]
			}
			rep.OpsFailedWhy[string(op.Kind)+": "+why]++
		}
		for id != "" {
			sb, err := c.GetSandbox(ctx, id)
			if errors.Is(err, model.ErrNotFound) {
				break
			}
			if err != nil {
				t.Fatalf("get %s: %v", id, err)
			}
			switch sb.State {
			case model.StateRunning, model.StateSuspended, model.StatePaused, model.StateFailed, model.StateDeleted:
				return op
			}
			if ctx.Err() != nil {
				t.Fatalf("sandbox %s stuck in %s", id, sb.State)
			}
			time.Sleep(200 * time.Millisecond)
		}
		return op
	}
	// maybeKill SIGKILLs the worker or the server at a random point of an
	// operation in flight, and starts it again on the same data.
	action := ""
	maybeKill := func() {
		if rng.IntN(2) == 0 {
			return
		}
		rep.KillsDuring[action]++
		time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond)
		if rng.IntN(2) == 0 {
			rep.Kills["worker"]++
			kill(s.worker, syscall.SIGKILL)
			if err := s.startWorker(); err != nil {
				t.Fatal(err)
			}
			return
		}
		rep.Kills["server"]++
		kill(s.server, syscall.SIGKILL)
		if err := s.startServer(); err != nil {
			t.Fatal(err)
		}
		if err := s.waitHealthy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pick := func() *soakSandbox {
		ids := make([]string, 0, len(live))
		for id := range live {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		if len(ids) == 0 {
			return nil
		}
		return live[ids[rng.IntN(len(ids))]]
	}
	// ensureRunning wakes sb if it is suspended or paused; a failed sandbox
	// is lost.
	ensureRunning := func(sb *soakSandbox) bool {
		got, err := c.GetSandbox(ctx, sb.id)
		if err != nil {
			lose(sb.id, "get: "+err.Error())
			return false
		}
		switch got.State {
		case model.StateFailed:
			lose(sb.id, "failed: "+got.Reason)
			return false
		case model.StateSuspended:
			op, err := c.WakeSandbox(ctx, sb.id)
			if err != nil {
				t.Fatalf("wake %s: %v", sb.id, err)
			}
			ops = append(ops, op.ID)
			settle(op.ID, sb.id)
		case model.StatePaused:
			op, err := c.ResumeSandbox(ctx, sb.id)
			if err != nil {
				t.Fatalf("resume %s: %v", sb.id, err)
			}
			ops = append(ops, op.ID)
			settle(op.ID, sb.id)
		}
		if got, _ := c.GetSandbox(ctx, sb.id); got.State != model.StateRunning {
			lose(sb.id, fmt.Sprintf("not running after wake: %s %q", got.State, got.Reason))
			return false
		}
		waitUsable(t, c, sb.id)
		return true
	}
	// verifyFiles checks every acknowledged file of sb (woken first); a
	// missing or changed one loses the sandbox.
	verifyFiles := func(sb *soakSandbox) {
		if len(sb.files) == 0 || !ensureRunning(sb) {
			return
		}
		fc, err := c.Files(ctx, sb.id)
		if err != nil {
			t.Fatal(err)
		}
		for name, sum := range sb.files {
			rc, err := fc.Read(ctx, name)
			if err != nil {
				lose(sb.id, fmt.Sprintf("read %s: %v", name, err))
				return
			}
			h := sha256.New()
			_, err = io.Copy(h, rc)
			rc.Close()
			rep.FilesChecked++
			if err != nil || hex.EncodeToString(h.Sum(nil)) != sum {
				lose(sb.id, fmt.Sprintf("%s differs (err %v)", name, err))
				return
			}
		}
	}
	create := func(req client.CreateSandboxRequest) {
		sb, op, err := c.CreateSandbox(ctx, req, "")
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		ever[sb.ID] = true
		ops = append(ops, op.ID)
		maybeKill()
		if done := settle(op.ID, sb.ID); done.State == model.OpSucceeded {
			rep.Acknowledged++
			live[sb.ID] = &soakSandbox{id: sb.ID, files: map[string]string{}}
		} else {
			deleteSandbox(t, ctx, c, sb.ID) // never acknowledged: clean up
			deleted[sb.ID] = true
		}
	}

	// failedNow counts a sandbox that failed during a trial as lost: the
	// soak never asks for a sandbox to fail.
	failedNow := func(sb *soakSandbox) {
		if sb == nil || live[sb.id] == nil {
			return
		}
		if got, err := c.GetSandbox(ctx, sb.id); err == nil && got.State == model.StateFailed {
			lose(sb.id, "failed: "+got.Reason)
		} else if errors.Is(err, model.ErrNotFound) {
			lose(sb.id, "gone without a delete")
		}
	}
	for i := range trials {
		if i > 0 {
			failedNow(pick()) // a random survivor, beside the one acted on below
		}
		action = []string{"create", "exec", "write", "suspend", "wake", "fork", "delete"}[rng.IntN(7)]
		if len(live) == 0 || (action == "delete" && len(live) < 2) {
			action = "create"
		}
		if action == "create" && len(live) >= 4 {
			action = "write"
		}
		rep.Actions[action]++
		sb := pick()
		t.Logf("trial %d: %s %v", i, action, func() string {
			if sb == nil || action == "create" {
				return ""
			}
			return sb.id
		}())
		switch action {
		case "create":
			create(client.CreateSandboxRequest{})
		case "exec", "write":
			if !ensureRunning(sb) {
				continue
			}
			name := fmt.Sprintf("soak-%03d.bin", i)
			fc, err := c.Files(ctx, sb.id)
			if err != nil {
				t.Fatalf("files session: %v", err)
			}
			var seed [32]byte
			copy(seed[:], name+sb.id)
			h := sha256.New()
			done := make(chan error, 1)
			go func() {
				var err error
				if action == "write" {
					_, err = fc.Write(ctx, name, io.TeeReader(io.LimitReader(mrand.NewChaCha8(seed), int64(rng.IntN(256<<10)+1)), h), "", "")
				} else {
					var cmd client.Command
					if cmd, err = c.CreateCommand(ctx, sb.id, client.CreateCommandRequest{Argv: []string{"sh", "-c", "echo " + name + " > " + name}}); err == nil {
						var exit agentapi.Exit
						if exit, err = client.RunCommand(ctx, cmd.AttachURL, cmd.Token, nil, io.Discard, io.Discard); err == nil && exit.ExitCode != 0 {
							err = fmt.Errorf("exit %d", exit.ExitCode)
						}
						h.Write([]byte(name + "\n"))
					}
				}
				done <- err
			}()
			maybeKill()
			if err := <-done; err == nil {
				sb.files[name] = hex.EncodeToString(h.Sum(nil))
			} else {
				t.Logf("trial %d: %s not acknowledged: %v", i, action, err)
			}
		case "suspend", "wake", "delete":
			do := map[string]func(context.Context, string) (model.Operation, error){
				"suspend": c.SuspendSandbox, "wake": c.WakeSandbox, "delete": c.DeleteSandbox}[action]
			if action == "delete" {
				verifyFiles(sb) // every acknowledged write is checked before its sandbox goes
				if live[sb.id] == nil {
					continue // lost (and deleted) by the check
				}
			}
			if action == "wake" {
				got, _ := c.GetSandbox(ctx, sb.id)
				if got.State != model.StateSuspended {
					do = c.SuspendSandbox // suspend first so the next wake has something to do
				}
			}
			op, err := do(ctx, sb.id)
			if err != nil {
				if errors.Is(err, model.ErrConflict) || errors.Is(err, model.ErrUnprocessable) {
					t.Logf("trial %d: %s refused: %v", i, action, err)
					continue
				}
				t.Fatalf("trial %d: %s: %v", i, action, err)
			}
			ops = append(ops, op.ID)
			maybeKill()
			done := settle(op.ID, sb.id)
			if action != "delete" {
				failedNow(sb)
			}
			if action == "delete" {
				if done.State != model.OpSucceeded {
					deleteSandbox(t, ctx, c, sb.id) // the request stands; wait it out
				}
				deleted[sb.id] = true
				delete(live, sb.id)
			}
		case "fork":
			if !ensureRunning(sb) {
				continue
			}
			sb.cp++
			name := fmt.Sprintf("cp%d", sb.cp)
			op, err := c.CreateCheckpoint(ctx, sb.id, name)
			if err != nil {
				t.Fatalf("checkpoint: %v", err)
			}
			ops = append(ops, op.ID)
			maybeKill()
			if done := settle(op.ID, sb.id); done.State != model.OpSucceeded {
				t.Logf("trial %d: checkpoint not acknowledged: %s", i, done.Reason)
				continue
			}
			if len(live) >= 4 {
				continue
			}
			forks, err := c.ForkSandbox(ctx, client.CreateSandboxRequest{FromCheckpoint: &client.CheckpointRef{SandboxID: sb.id, Checkpoint: name}}, "")
			if err != nil {
				t.Fatalf("fork: %v", err)
			}
			for _, f := range forks {
				ever[f.Sandbox.ID] = true
				ops = append(ops, f.Operation.ID)
				if done := settle(f.Operation.ID, f.Sandbox.ID); done.State == model.OpSucceeded {
					rep.Acknowledged++
					files := map[string]string{}
					for k, v := range sb.files { // the checkpoint holds what was written before it
						files[k] = v
					}
					live[f.Sandbox.ID] = &soakSandbox{id: f.Sandbox.ID, files: files}
				} else {
					deleteSandbox(t, ctx, c, f.Sandbox.ID)
					deleted[f.Sandbox.ID] = true
				}
			}
		}
	}

	// Every acknowledged sandbox holds every acknowledged file.
	for _, sb := range live {
		verifyFiles(sb)
	}
	for id := range live {
		deleteSandbox(t, ctx, c, id)
	}
	for _, id := range ops {
		op, err := c.GetOperation(ctx, id)
		if err != nil || !op.State.Done() {
			t.Errorf("operation %s not done at the end: %s (%v)", id, op.State, err)
		}
	}
	if page, err := c.ListSandboxes(ctx, client.SandboxFilter{Limit: 1000}); err != nil {
		t.Fatal(err)
	} else {
		for _, sb := range page.Sandboxes {
			if sb.State != model.StateDeleted {
				rep.Leaked = append(rep.Leaked, "row: sandbox "+sb.ID+" "+string(sb.State))
			}
		}
	}
	for id := range ever {
		rep.Leaked = append(rep.Leaked, hostLeftovers(s.workerDir, id)...)
	}
	rep.WorkerFDs = countFDs(s.worker.Process.Pid)
	rep.DurationS = time.Since(start).Seconds()
	for _, l := range rep.Leaked {
		t.Errorf("leaked: %s", l)
	}
	if rep.Leaked == nil {
		rep.Leaked = []string{}
	}
	b, _ := json.MarshalIndent(rep, "", "  ")
	t.Logf("soak report:\n%s", b)
	if p := os.Getenv("AIRLOCK_SOAK_REPORT"); p != "" {
		if err := os.WriteFile(p, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// deleteSandbox deletes id and waits until it is gone.
func deleteSandbox(t *testing.T, ctx context.Context, c *client.Client, id string) {
	t.Helper()
	for {
		op, err := c.DeleteSandbox(ctx, id)
		if errors.Is(err, model.ErrNotFound) {
			return
		}
		if err == nil {
			if done, err := c.WaitOperation(ctx, op.ID); err == nil || done.State.Done() {
				if sb, err := c.GetSandbox(ctx, id); errors.Is(err, model.ErrNotFound) || sb.State == model.StateDeleted {
					return
				}
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("delete %s: %v", id, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// hostLeftovers is leftoversIn plus what it does not look at: cgroups in
// any hierarchy and at any depth, network namespaces, and snapshot and other
// directories under the worker's data dir at any depth.
func hostLeftovers(dir, id string) []string {
	found := leftoversIn(dir, id)
	seen := map[string]bool{}
	for _, f := range found {
		seen[f] = true
	}
	add := func(s string) {
		if !seen[s] {
			seen[s] = true
			found = append(found, s)
		}
	}
	walk := func(root, what string, maxDepth int) {
		base := strings.Count(root, string(os.PathSeparator))
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			if strings.Count(p, string(os.PathSeparator))-base > maxDepth {
				return filepath.SkipDir
			}
			if strings.Contains(filepath.Base(p), id) {
				add(what + " " + p)
				return filepath.SkipDir
			}
			return nil
		})
	}
	walk("/sys/fs/cgroup", "cgroup", 4)
	walk(dir, "dir", 4)
	if ns, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range ns {
			if strings.Contains(e.Name(), id) {
				add("netns /run/netns/" + e.Name())
			}
		}
	}
	return found
}

func countFDs(pid int) int {
	es, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(es)
}

// retry429 resends a request the server refused with 429 and a Retry-After
// (rate limited, so not performed; a quota refusal has none) after that
// time, when the body can be replayed.
type retry429 struct{ next http.RoundTripper }

func (r retry429) RoundTrip(req *http.Request) (*http.Response, error) {
	for attempt := 0; ; attempt++ {
		resp, err := r.next.RoundTrip(req)
		if err != nil || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" ||
			attempt == 50 || (req.Body != nil && req.GetBody == nil) {
			return resp, err
		}
		wait := 200 * time.Millisecond
		if n, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && n > 0 {
			wait = time.Duration(n) * time.Second
		}
		resp.Body.Close()
		select {
		case <-req.Context().Done():
			return nil, req.Context().Err()
		case <-time.After(wait):
		}
		if req.GetBody != nil {
			body, err := req.GetBody()
			if err != nil {
				return nil, err
			}
			req = req.Clone(req.Context())
			req.Body = body
		}
	}
}
