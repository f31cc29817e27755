package gvisor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/gvisor"
	"github.com/airlock/airlock/internal/runtime/runtimetest"
)

// startReady starts a sandbox, waits for its agent and deletes it when the
// test ends.
func startReady(t testing.TB, d *gvisor.Driver, rootfs string) (string, runtime.Sandbox, *agentclient.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id := runtimetest.NewID()
	sb, err := d.Start(ctx, runtime.Spec{ID: id, RootFS: rootfs, VCPUs: 1, MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Delete(context.Background(), id); err != nil {
			t.Errorf("Delete %s: %v", id, err)
		}
	})
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
	t.Cleanup(func() { c.Close(); sb.Close() })
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return id, sb, c
}

// runscCLI runs a runsc subcommand against d's state dir, bounded.
func runscCLI(t testing.TB, d *gvisor.Driver, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	path, global := gvisor.RunscCommand(d)
	out, err := exec.CommandContext(ctx, path, append(global, args...)...).CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("runsc %v timed out: %w", args, ctx.Err())
	}
	return string(out), err
}

// runscStatus is the status `runsc state` prints.
func runscStatus(t testing.TB, d *gvisor.Driver, id string) string {
	t.Helper()
	out, err := runscCLI(t, d, "state", id)
	if err != nil {
		t.Fatalf("runsc state: %v: %s", err, out)
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("runsc state: %v: %s", err, out)
	}
	return st.Status
}

func wantStatus(t testing.TB, d *gvisor.Driver, id string, want runtime.Status) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if st, err := d.Status(ctx, id); err != nil || st != want {
		t.Fatalf("Status = %q, %v; want %s", st, err, want)
	}
}

// TestPauseControlSocket pauses the driver's way (control.go: the sentry's
// control socket plus runsc's state file): runsc sees the sandbox paused,
// and pauses and resumes done by the runsc CLI and by the driver
// interoperate.
func TestPauseControlSocket(t *testing.T) {
	d, rootfs, _ := fixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	id, _, c := startReady(t, d, rootfs)
	if err := d.Pause(ctx, id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if err := d.Pause(ctx, id); err != nil {
		t.Errorf("second Pause: %v", err)
	}
	if st := runscStatus(t, d, id); st != "paused" {
		t.Errorf("runsc state after Pause = %q, want paused", st)
	}
	wantStatus(t, d, id, runtime.StatusPaused)
	if err := d.Resume(ctx, id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if err := d.Resume(ctx, id); err != nil {
		t.Errorf("second Resume: %v", err)
	}
	wantStatus(t, d, id, runtime.StatusRunning)
	if err := c.WaitReady(ctx); err != nil {
		t.Fatalf("agent after Resume: %v", err)
	}
	// Driver pause, CLI resume; CLI pause, driver resume.
	if err := d.Pause(ctx, id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if out, err := runscCLI(t, d, "resume", id); err != nil {
		t.Fatalf("runsc resume of a sandbox the driver paused: %v: %s", err, out)
	}
	if err := c.WaitReady(ctx); err != nil {
		t.Fatalf("agent after runsc resume: %v", err)
	}
	if out, err := runscCLI(t, d, "pause", id); err != nil {
		t.Fatalf("runsc pause: %v: %s", err, out)
	}
	wantStatus(t, d, id, runtime.StatusPaused)
	if err := d.Resume(ctx, id); err != nil {
		t.Fatalf("Resume of a sandbox runsc paused: %v", err)
	}
	if st := runscStatus(t, d, id); st != "running" {
		t.Errorf("runsc state after Resume = %q, want running", st)
	}
	if err := c.WaitReady(ctx); err != nil {
		t.Fatalf("agent after Resume: %v", err)
	}
}

// TestDeletePaused deletes a paused sandbox: nothing of it may remain.
func TestDeletePaused(t *testing.T) {
	d, rootfs, run := fixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	id, _, _ := startReady(t, d, rootfs)
	if err := d.Pause(ctx, id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	t0 := time.Now()
	if err := d.Delete(ctx, id); err != nil {
		t.Fatalf("Delete of a paused sandbox: %v", err)
	}
	t.Logf("Delete took %v", time.Since(t0))
	wantStatus(t, d, id, runtime.StatusGone)
	if _, err := os.Stat(filepath.Join(run, id)); !os.IsNotExist(err) {
		t.Errorf("run dir remains: %v", err)
	}
	if cgs, _ := filepath.Glob("/sys/fs/cgroup/*/airlock-test/" + id); len(cgs) > 0 {
		t.Errorf("cgroups remain: %v", cgs)
	}
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range cmdlines {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), id) {
			t.Errorf("process remains: %s: %s", p, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}

// BenchmarkPauseResume measures Pause and Resume of one idle sandbox (its
// agent and a guest loop waking every 20 ms) separately, the driver's way
// ("driver": the sentry's control socket and runsc's state file,
// control.go), and bare
// `runsc pause` / `runsc resume` ("runsc-cli", the baseline).
// Besides ns/op (the mean) each reports p50-ms and p90-ms.
//
//	sudo go test ./internal/runtime/gvisor -run '^$' -bench PauseResume -benchtime 50x
func BenchmarkPauseResume(b *testing.B) {
	d, rootfs, _ := fixture(b)
	ctx := context.Background()
	id, _, c := startReady(b, d, rootfs)
	if _, err := c.StartProcess(ctx, agentapi.ProcessSpec{ID: "ticker", Argv: []string{"bash", "-c",
		`while :; do echo $EPOCHREALTIME > /tmp/tick; sleep 0.02; done`}}); err != nil {
		b.Fatal(err)
	}
	runscOp := func(verb string) func(context.Context, string) error {
		return func(_ context.Context, id string) error {
			if out, err := runscCLI(b, d, verb, id); err != nil {
				return fmt.Errorf("runsc %s: %w: %s", verb, err, out)
			}
			return nil
		}
	}
	// pause and resume are timed; the driver's Pause and Resume (which
	// accept a sandbox already in the wanted state) set up each op.
	modes := []struct {
		name          string
		pause, resume func(context.Context, string) error
	}{
		{"driver", d.Pause, d.Resume},
		{"runsc-cli", runscOp("pause"), runscOp("resume")},
	}
	for _, m := range modes {
		// Timed op after the untimed setup op, b.N times.
		bench := func(name string, setup, op func(context.Context, string) error) {
			b.Run(m.name+"/"+name, func(b *testing.B) {
				var times []time.Duration
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					if err := setup(ctx, id); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					t0 := time.Now()
					if err := op(ctx, id); err != nil {
						b.Fatal(err)
					}
					times = append(times, time.Since(t0))
				}
				b.StopTimer()
				slices.Sort(times)
				ms := func(q float64) float64 {
					return float64(times[int(q*float64(len(times)-1))].Microseconds()) / 1000
				}
				b.ReportMetric(ms(0.5), "p50-ms")
				b.ReportMetric(ms(0.9), "p90-ms")
			})
		}
		bench("Pause", d.Resume, m.pause)
		bench("Resume", d.Pause, m.resume)
		if err := d.Resume(ctx, id); err != nil { // leave it running
			b.Fatal(err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.WaitReady(wctx); err != nil {
		b.Fatalf("agent after the benchmark: %v", err)
	}
}
