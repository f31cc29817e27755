package bench

import (
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	tests := []struct {
		sorted []float64
		p      float64
		want   float64
	}{
		{[]float64{5}, 50, 5},
		{[]float64{5}, 99, 5},
		{[]float64{1, 2}, 50, 1.5},
		{[]float64{1, 2, 3, 4}, 50, 2.5},
		{[]float64{1, 2, 3, 4, 5}, 50, 3},
		{[]float64{1, 2, 3, 4, 5}, 90, 4.6},
		{[]float64{1, 2, 3, 4, 5}, 0, 1},
		{[]float64{1, 2, 3, 4, 5}, 100, 5},
		{[]float64{10, 20, 30, 40, 50, 60, 70, 80, 90, 100}, 90, 91},
		{[]float64{10, 20, 30, 40, 50, 60, 70, 80, 90, 100}, 99, 99.1},
	}
	for _, tt := range tests {
		if got := Percentile(tt.sorted, tt.p); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("Percentile(%v, %v) = %v, want %v", tt.sorted, tt.p, got, tt.want)
		}
	}
	if got := Percentile(nil, 50); !math.IsNaN(got) {
		t.Errorf("Percentile(nil) = %v, want NaN", got)
	}
}

func TestSummarize(t *testing.T) {
	// 1..100 shuffled: percentiles must not depend on the input order.
	samples := make([]float64, 100)
	for i := range samples {
		samples[i] = float64((i*37)%100 + 1)
	}
	orig := append([]float64(nil), samples...)
	got := Summarize("ms", samples)
	want := Stats{Unit: "ms", N: 100, P50: 50.5, P90: 90.1, P99: 99.01, Mean: 50.5, Min: 1, Max: 100}
	if got != want {
		t.Errorf("Summarize = %+v, want %+v", got, want)
	}
	for i := range samples {
		if samples[i] != orig[i] {
			t.Fatal("Summarize reordered its input")
		}
	}
	if empty := Summarize("ms", nil); empty.N != 0 || empty.P50 != 0 {
		t.Errorf("Summarize(nil) = %+v", empty)
	}
}

func TestUnits(t *testing.T) {
	ms := Millis([]time.Duration{1500 * time.Microsecond, 2 * time.Second})
	if ms[0] != 1.5 || ms[1] != 2000 {
		t.Errorf("Millis = %v", ms)
	}
	if got := MBps(64<<20, 2*time.Second); math.Abs(got-33.554432) > 1e-9 {
		t.Errorf("MBps(64 MiB, 2s) = %v", got)
	}
}

func TestFindRunsc(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin", "runsc")
	os.MkdirAll(filepath.Dir(bin), 0o755)
	os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755)
	notExec := filepath.Join(dir, "plain")
	os.WriteFile(notExec, nil, 0o644)
	t.Setenv("PATH", t.TempDir()) // an empty PATH: no runsc there

	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	tests := []struct {
		name    string
		env     map[string]string
		dataDir string
		want    string
		wantWhy bool
	}{
		{"env var", map[string]string{"AIRLOCK_RUNSC": bin}, t.TempDir(), bin, false},
		{"env var not executable", map[string]string{"AIRLOCK_RUNSC": notExec}, dir, "", true},
		{"data dir", nil, dir, bin, false},
		{"nowhere", nil, t.TempDir(), "", true},
	}
	for _, tt := range tests {
		got, why := FindRunsc(env(tt.env), tt.dataDir)
		if got != tt.want || (why != "") != tt.wantWhy {
			t.Errorf("%s: FindRunsc = %q, %q", tt.name, got, why)
		}
	}
}
