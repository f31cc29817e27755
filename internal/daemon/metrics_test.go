package daemon

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/airlock/airlock/client"
	amodel "github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime/fake"
	"github.com/airlock/airlock/internal/worker"
)

// scrape reads addr's /metrics into sample values keyed by series
// (name{label="value",…}), with the families seen.
func scrape(t *testing.T, addr string) (map[string]float64, map[string]bool) {
	t.Helper()
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	values, names := map[string]float64{}, map[string]bool{}
	for name, f := range fams {
		names[name] = true
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			key := name + "{" + strings.Join(labels, ",") + "}"
			switch {
			case m.GetCounter() != nil:
				values[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				values[key] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				values[key+"_count"] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return values, names
}

// TestMetricsFamiliesMove runs a sandbox through a fake stack with metrics
// on (server and worker in one registry, as `airlock up` has them) and
// checks that every family is on /metrics and that the counters a create,
// a command, a file round trip, a suspend and a wake drive have moved.
func TestMetricsFamiliesMove(t *testing.T) {
	m := newMetrics()
	s := startFakeStack(t, func(c *worker.Config) { c.Observer = m.workerObserver() })
	m.watchServer(s.srv)
	addr, err := serveMetrics(t.Context(), "127.0.0.1:0", m, newLogger("error"))
	if err != nil {
		t.Fatal(err)
	}
	before, _ := scrape(t, addr)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, op, err := s.c.CreateSandbox(ctx, client.CreateSandboxRequest{Runtime: fake.Name}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.WaitOperation(ctx, op.ID); err != nil {
		t.Fatal(err)
	}
	cmd, err := s.c.CreateCommand(ctx, sb.ID, client.CreateCommandRequest{Argv: []string{"echo", "hello metrics"}})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if _, err := client.RunCommand(ctx, cmd.AttachURL, cmd.Token, nil, &out, io.Discard); err != nil || !strings.Contains(out.String(), "hello metrics") {
		t.Fatalf("run: %q %v", out.String(), err)
	}
	files, err := s.c.Files(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := files.Write(ctx, "/tmp/m.txt", strings.NewReader("0123456789"), "", ""); err != nil {
		t.Fatal(err)
	}
	rc, err := files.Read(ctx, "/tmp/m.txt")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, rc)
	rc.Close()
	for _, call := range []func(context.Context, string) (client.Operation, error){s.c.SuspendSandbox, s.c.WakeSandbox} {
		op, err := call(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if done, err := s.c.WaitOperation(ctx, op.ID); err != nil || done.State != amodel.OpSucceeded {
			t.Fatalf("%s: %+v %v", op.Kind, done, err)
		}
	}
	if _, err := s.c.GetSandbox(ctx, "sb-nosuchsandbox"); err == nil {
		t.Fatal("get of an unknown sandbox succeeded")
	}
	// An E2B API request without a key: counted under its route pattern.
	if res, err := http.Get(s.url + "/v2/sandboxes"); err != nil || res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("E2B list without a key: %v %v; want 401", res, err)
	} else {
		res.Body.Close()
	}

	// The reconcile round after the wake sets the gauges.
	var after map[string]float64
	var names map[string]bool
	for deadline := time.Now().Add(30 * time.Second); ; {
		after, names = scrape(t, addr)
		// The operation histograms are observed from the event stream,
		// which may trail the wake's completion by a moment.
		wakes := "airlock_operation_duration_seconds{kind=wake,result=succeeded}_count"
		if after["airlock_sandboxes{state=running}"] == 1 && after[wakes] > before[wakes] || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, fam := range []string{
		"airlock_api_requests_total", "airlock_api_request_duration_seconds", "airlock_controller_leader",
		"airlock_operation_duration_seconds", "airlock_sandboxes", "airlock_operations_open", "airlock_reconcile_lag_seconds",
		"airlock_pool_claims_total", "airlock_controller_reconcile_seconds",
		"airlock_snapshot_bytes_total", "airlock_snapshot_duration_seconds", "airlock_dataplane_bytes_total",
		"airlock_egress_decisions_total", "go_goroutines", "process_cpu_seconds_total",
	} {
		if !names[fam] {
			t.Errorf("/metrics lacks the family %s", fam)
		}
	}
	moved := func(series string, atLeast float64) {
		t.Helper()
		if d := after[series] - before[series]; d < atLeast {
			t.Errorf("%s moved by %v, want at least %v (before %v, after %v)", series, d, atLeast, before[series], after[series])
		}
	}
	if after["airlock_controller_leader{}"] != 1 {
		t.Errorf("airlock_controller_leader = %v on the only server; want 1", after["airlock_controller_leader{}"])
	}
	moved("airlock_api_requests_total{method=POST,route=/v1/sandboxes,status=202}", 1)
	moved("airlock_api_requests_total{method=POST,route=/v1/sandboxes/{id}/commands,status=201}", 1)
	moved("airlock_api_requests_total{method=GET,route=/v1/sandboxes/{id},status=404}", 1)
	moved("airlock_api_requests_total{method=GET,route=/v2/sandboxes,status=401}", 1)
	moved("airlock_api_request_duration_seconds{method=POST,route=/v1/sandboxes/{id}/suspend}_count", 1)
	moved("airlock_operation_duration_seconds{kind=create,result=succeeded}_count", 1)
	moved("airlock_operation_duration_seconds{kind=suspend,result=succeeded}_count", 1)
	moved("airlock_operation_duration_seconds{kind=wake,result=succeeded}_count", 1)
	moved("airlock_snapshot_duration_seconds{kind=suspend,result=ok}_count", 1)
	moved("airlock_snapshot_duration_seconds{kind=restore,result=ok}_count", 1)
	moved("airlock_snapshot_bytes_total{kind=suspend}", 1)
	moved("airlock_dataplane_bytes_total{direction=out,kind=command}", float64(len("hello metrics")))
	moved("airlock_dataplane_bytes_total{direction=in,kind=file}", 10)
	moved("airlock_dataplane_bytes_total{direction=out,kind=file}", 10)
	if got := after["airlock_sandboxes{state="+string(amodel.StateRunning)+"}"]; got != 1 {
		t.Errorf("airlock_sandboxes{state=running} = %v, want 1", got)
	}
	if _, ok := after["airlock_pool_claims_total{result=miss}"]; !ok {
		t.Error("airlock_pool_claims_total{result=miss} is not exported at 0")
	}
}
