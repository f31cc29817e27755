package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/testenv"
)

func TestEgressDeriveAndJudge(t *testing.T) {
	ms := func(p50, p99, mean float64) *Stats { return &Stats{Unit: "ms", N: 10, P50: p50, P99: p99, Mean: mean} }
	mbs := func(p50, mean float64) *Stats { return &Stats{Unit: "MB/s", N: 5, P50: p50, Mean: mean} }
	cases := []EgressCase{
		{Name: "lat", Direct: ms(1, 2, 1.2), Gateway: ms(1.4, 3.5, 1.5)},
		{Name: "slow", Direct: ms(1, 2, 1), Gateway: ms(2.5, 3, 2.5)},
		{Name: "tput", Direct: mbs(1000, 900), Gateway: mbs(850, 810)},
		{Name: "intercept", Skipped: "interception not available"},
		{Name: "broken", Error: "connection reset"},
	}
	for i := range cases {
		cases[i].Derive()
	}
	if c := cases[0]; c.AddedP50 == nil || *c.AddedP50 != 0.4 || *c.AddedP99 != 1.5 || *c.AddedMean != 0.3 || c.RatioP50 != nil {
		t.Errorf("latency derive: %+v", c)
	}
	if c := cases[2]; c.RatioP50 == nil || *c.RatioP50 != 0.85 || *c.RatioMean != 0.9 || c.AddedP50 != nil {
		t.Errorf("throughput derive: %+v", c)
	}
	if cases[3].AddedP50 != nil || cases[4].AddedP50 != nil {
		t.Error("derived something for a case without stats")
	}
	for _, tc := range []struct {
		t    EgressTarget
		want string
	}{
		{EgressTarget{Case: "lat", Metric: "added_p50_ms", Limit: 1}, "met"},
		{EgressTarget{Case: "slow", Metric: "added_p50_ms", Limit: 1}, "not met"},
		{EgressTarget{Case: "tput", Metric: "ratio_p50", Limit: 0.8}, "met"},
		{EgressTarget{Case: "tput", Metric: "ratio_p50", Limit: 0.9}, "not met"},
		{EgressTarget{Case: "intercept", Metric: "added_p50_ms", Limit: 5}, "not measured: skipped: interception not available"},
		{EgressTarget{Case: "broken", Metric: "added_p50_ms", Limit: 5}, "not measured: connection reset"},
		{EgressTarget{Case: "absent", Metric: "added_p50_ms", Limit: 5}, "not measured: no such case"},
	} {
		tc.t.Judge(cases)
		if tc.t.Status != tc.want {
			t.Errorf("%s %s %v: status %q, want %q", tc.t.Case, tc.t.Metric, tc.t.Limit, tc.t.Status, tc.want)
		}
		if (tc.t.Value != nil) != (tc.want == "met" || tc.want == "not met") {
			t.Errorf("%s: value %v with status %q", tc.t.Case, tc.t.Value, tc.t.Status)
		}
	}

	var b bytes.Buffer
	FormatEgress(&b, EgressReport{Cases: cases, Targets: []EgressTarget{{Text: "intercept ≤ +5 ms", Status: "not measured: skipped: interception not available"}}})
	out := b.String()
	for _, want := range []string{"lat ", "+0.400", "×0.850", "intercept: skipped: interception not available", "broken: error: connection reset", "target intercept ≤ +5 ms: not measured"} {
		if !strings.Contains(out, want) {
			t.Errorf("text output lacks %q:\n%s", want, out)
		}
	}
}

// TestEgressGroupWithoutRunner: a bench without the egress implementation
// (this package alone, as the CLI links it) reports the group as skipped,
// loudly, and needs no API.
func TestEgressGroupWithoutRunner(t *testing.T) {
	var progress bytes.Buffer
	rep, err := Run(context.Background(), Config{Only: []string{GroupEgress}, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Egress == nil || !strings.Contains(rep.Egress.Skipped, "no egress bench") {
		t.Fatalf("egress report %+v", rep.Egress)
	}
	if !strings.Contains(progress.String(), "egress: SKIPPED") {
		t.Errorf("progress does not say it was skipped: %q", progress.String())
	}
	if len(rep.Measurements) != 0 || rep.Parameters.EgressRequests != 200 {
		t.Errorf("measurements %v, parameters %+v", rep.Measurements, rep.Parameters)
	}
}

// TestRemoveRunscRoot: a private runsc root goes away whole, with the
// network namespace runsc --network=sandbox binds at null-netns in it (a
// bind mount of a namespace, as runsc makes; os.RemoveAll alone fails on
// it with EBUSY).
func TestRemoveRunscRoot(t *testing.T) {
	testenv.RequireRoot(t, "bind-mounts a network namespace")
	root := filepath.Join(t.TempDir(), "runsc")
	nullNetns := filepath.Join(root, "null-netns")
	if err := os.MkdirAll(root, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(nullNetns, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("/proc/self/ns/net", nullNetns, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(nullNetns, unix.MNT_DETACH) })
	if err := RemoveRunscRoot(root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Errorf("%s still there: %v", root, err)
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), root) {
		t.Errorf("a mount under %s is left", root)
	}
	if err := RemoveRunscRoot(root); err != nil {
		t.Errorf("again: %v", err)
	}
}
