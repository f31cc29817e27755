package egressbench

import (
	"bytes"
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/bench"
	"github.com/airlock/airlock/internal/testenv"
)

// ourNamespaces lists the namespaces a run makes (direct, guest, gateway;
// the test internet's are egresstest's).
func ourNamespaces(t *testing.T) []string {
	es, err := os.ReadDir("/run/netns")
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		n := e.Name()
		if strings.HasPrefix(n, "airlockbench-") || strings.HasPrefix(n, "airlock-bench-") || strings.HasPrefix(n, "airlockgw-bench-") {
			out = append(out, n)
		}
	}
	return out
}

// TestRunOnce runs the whole group once, small, so that it cannot rot:
// every case but interception is measured on both paths, the targets are
// judged, and nothing is left behind.
func TestRunOnce(t *testing.T) {
	testenv.Short(t, "makes network namespaces, a gateway and a test internet")
	testenv.RequireRoot(t, "network namespaces, veths and nftables")
	before := ourNamespaces(t)
	var progress bytes.Buffer
	runsc, why := bench.FindRunsc(os.Getenv, os.Getenv("AIRLOCK_TEST_CACHE"))
	rep, err := Run(context.Background(), bench.EgressConfig{Requests: 5, DownloadBytes: 4 << 20, DownloadRuns: 2,
		Runsc: runsc, RunscWhy: why, Progress: &progress})
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, progress.String())
	}
	if rep.Skipped != "" {
		t.Fatalf("skipped as root: %s", rep.Skipped)
	}
	names := map[string]bool{}
	for _, c := range rep.Cases {
		names[c.Name] = true
		if strings.HasPrefix(c.Name, "curl_") && (strings.HasPrefix(c.Skipped, "no runsc") || c.Skipped == "curl is not installed") {
			t.Logf("%s: skipped: %s", c.Name, c.Skipped)
			continue
		}
		if c.Error != "" || c.Skipped != "" || c.Direct == nil || c.Gateway == nil {
			t.Errorf("%s: not measured: error %q skipped %q", c.Name, c.Error, c.Skipped)
			continue
		}
		want := 5
		if strings.HasPrefix(c.Name, "curl_") {
			want = curlBatches // one request a batch
		}
		if c.Throughput() {
			want = 2
			if c.RatioP50 == nil {
				t.Errorf("%s: no ratio", c.Name)
			}
		} else if c.AddedP50 == nil || c.AddedP99 == nil {
			t.Errorf("%s: no added latency", c.Name)
		}
		if c.Direct.N != want || c.Gateway.N != want || !(c.Direct.P50 > 0) || !(c.Gateway.P50 > 0) {
			t.Errorf("%s: direct %+v gateway %+v; want %d positive samples each", c.Name, c.Direct, c.Gateway, want)
		}
	}
	for _, n := range []string{"dns_query", "http_get_new_connection", "http_get_keepalive", "https_get_passthrough", "https_get_intercept", "download_4mib", "upload_4mib",
		"curl_http_get_netns", "curl_http_get_gvisor", "curl_https_get_gvisor"} {
		if !names[n] {
			t.Errorf("no case %s", n)
		}
	}
	if len(rep.Targets) != 5 {
		t.Errorf("%d targets, want 5", len(rep.Targets))
	}
	for _, tg := range rep.Targets {
		if tg.Status != "met" && tg.Status != "not met" && !(tg.Case == "https_get_intercept" && strings.HasPrefix(tg.Status, "not measured: skipped: interception not available")) {
			t.Errorf("target %s: status %q", tg.Text, tg.Status)
		}
	}
	var text bytes.Buffer
	bench.FormatEgress(&text, rep)
	t.Logf("\n%s", text.String())
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), "airlock-bench-curl-") {
		t.Error("a runsc mount of the curl sandboxes is left")
	}
	if after := ourNamespaces(t); len(after) > len(before) {
		t.Errorf("namespaces left behind: before %v, after %v", before, after)
	} else if !slices.Equal(before, after) {
		t.Logf("namespaces before %v, after %v (another run's?)", before, after)
	}
}

// BenchmarkTransfer downloads and uploads 64 MiB per iteration on each
// path: the throughput cases alone, for profiling the gateway's copy
// loops (go test -bench Transfer -cpuprofile cpu.out).
func BenchmarkTransfer(b *testing.B) {
	testenv.RequireRoot(b, "network namespaces, veths and nftables")
	const n = 64 << 20
	var progress bytes.Buffer
	e := &env{cfg: bench.EgressConfig{Progress: &progress}}
	e.cfg.Defaults()
	defer e.close()
	if skip, err := e.setup(context.Background()); skip != "" || err != nil {
		b.Fatalf("setup: %s %v\n%s", skip, err, progress.String())
	}
	e.cfg.DownloadBytes = n
	for _, c := range e.cases() {
		if !c.throughput {
			continue
		}
		for _, p := range []path{{"direct", e.direct}, {"gateway", e.guest}} {
			b.Run(strings.SplitN(c.name, "_", 2)[0]+"/"+p.name, func(b *testing.B) {
				cl := e.client(p, c.req)
				buf := make([]byte, 256<<10)
				b.SetBytes(n)
				for b.Loop() {
					if p.name == "gateway" {
						if err := e.fresh(context.Background(), c.dnsName, false); err != nil {
							b.Fatal(err)
						}
					}
					if _, err := e.do(context.Background(), cl, c.req, buf); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
