package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/bench"
)

func TestBenchScaleUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--only", "scale", "--scale-concurrency", "1,x"}, "--scale-concurrency"},
		{[]string{"bench", "--only", "scale", "--scale-idle", "100,10"}, "must ascend"},
		{[]string{"bench", "--only", "scale", "--scale-idle", "0"}, "positive integers"},
		{[]string{"bench", "--only", "scale", "--scale-burst", "0"}, "--scale-burst must be positive"},
		{[]string{"bench", "--only", "scale", "--metrics-url", "localhost:9090"}, "http(s) URL"},
		{[]string{"bench", "--plots", "/tmp/x"}, "add scale to --only"},
		{[]string{"bench", "--only", "fork", "--fork-count", "33"}, "--fork-count must be 1 … 32"},
		{[]string{"bench", "--only", "fork", "--fork-runs", "0"}, "--fork-runs must be positive"},
		{[]string{"bench", "plot"}, "one report file"},
		{[]string{"bench", "plot", "r.json"}, "needs --plots"},
	} {
		code, _, errOut := runMain(t, tc.args...)
		if code != ExitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: code %d, stderr %q; want usage error with %q", tc.args, code, errOut, tc.want)
		}
	}
}

func TestBenchPlot(t *testing.T) {
	dir := t.TempDir()
	report := filepath.Join(dir, "scale.json")
	os.WriteFile(report, []byte(`{"scale":{"burst":10,"runsc_do_p50_ms":90,
		"create":[{"concurrency":1,"n":10,"p50_ms":200,"p99_ms":300,"sandboxes_per_s":5},{"concurrency":5,"n":10,"p50_ms":500,"p99_ms":900,"sandboxes_per_s":8}],
		"idle":[{"sandboxes":5,"pss_mib_per_sandbox":20,"get_p99_ms":2},{"sandboxes":10,"pss_mib_per_sandbox":17,"get_p99_ms":3}]}}`), 0o644)
	plots := filepath.Join(dir, "plots")
	code, out, errOut := runMain(t, "bench", "plot", report, "--plots", plots)
	if code != 0 {
		t.Fatalf("code %d, stderr %q", code, errOut)
	}
	for _, name := range []string{bench.PlotScaleCreate, bench.PlotScaleMemory, bench.PlotScaleAPI, bench.PlotScaleReconcile} {
		p := filepath.Join(plots, name)
		if st, err := os.Stat(p); err != nil || st.Size() == 0 || !strings.Contains(out, p) {
			t.Errorf("%s: %v (stdout %q)", p, err, out)
		}
	}
	if code, _, errOut := runMain(t, "bench", "plot", filepath.Join(dir, "none.json"), "--plots", plots); code == 0 || !strings.Contains(errOut, "read report") {
		t.Errorf("a missing report: code %d, stderr %q", code, errOut)
	}
}
