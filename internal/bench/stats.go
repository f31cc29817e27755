package bench

import (
	"math"
	"slices"
	"time"
)

// Stats summarises samples of one measurement.
type Stats struct {
	Unit string  `json:"unit"` // "ms" or "MB/s" (MB = 10^6 bytes)
	N    int     `json:"n"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Mean float64 `json:"mean"`
	Min  float64 `json:"min"`
	Max  float64 `json:"max"`
}

// Summarize computes the statistics of samples (which it does not modify).
// Percentiles interpolate linearly between the two nearest ranks (the
// "linear" method of NumPy and R type 7), so P50 of an even count is the
// mean of the middle two.
func Summarize(unit string, samples []float64) Stats {
	s := Stats{Unit: unit, N: len(samples)}
	if len(samples) == 0 {
		return s
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	var sum float64
	for _, v := range sorted {
		sum += v
	}
	s.Mean = round3(sum / float64(len(sorted)))
	s.Min, s.Max = round3(sorted[0]), round3(sorted[len(sorted)-1])
	s.P50 = round3(Percentile(sorted, 50))
	s.P90 = round3(Percentile(sorted, 90))
	s.P99 = round3(Percentile(sorted, 99))
	return s
}

// Percentile returns the p-th percentile (0–100) of sorted, which must be
// sorted ascending, interpolating linearly between closest ranks. It
// returns NaN for no samples.
func Percentile(sorted []float64, p float64) float64 {
	switch {
	case len(sorted) == 0:
		return math.NaN()
	case p <= 0:
		return sorted[0]
	case p >= 100:
		return sorted[len(sorted)-1]
	}
	rank := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(rank))
	hi := int(math.Ceil(rank))
	frac := rank - float64(lo)
	return sorted[lo] + (sorted[hi]-sorted[lo])*frac
}

// Millis converts durations to milliseconds.
func Millis(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d) / float64(time.Millisecond)
	}
	return out
}

// MBps is the throughput of moving n bytes in d, in MB (10^6 bytes) per second.
func MBps(n int64, d time.Duration) float64 {
	if d <= 0 {
		return math.Inf(1)
	}
	return float64(n) / 1e6 / d.Seconds()
}

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

// Ratio is a/b rounded to three decimals; ok is false when either is not a
// positive finite number.
func Ratio(a, b float64) (float64, bool) {
	if !(a > 0) || !(b > 0) || math.IsInf(a, 0) || math.IsInf(b, 0) {
		return 0, false
	}
	return round3(a / b), true
}
