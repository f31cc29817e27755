package bench

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/model"
)

func TestRatio(t *testing.T) {
	for _, tc := range []struct {
		a, b float64
		want float64
		ok   bool
	}{
		{30, 1000, 0.03, true},
		{2, 3, 0.667, true},
		{0, 3, 0, false},
		{3, 0, 0, false},
		{-1, 3, 0, false},
		{math.NaN(), 3, 0, false},
		{math.Inf(1), 3, 0, false},
	} {
		got, ok := Ratio(tc.a, tc.b)
		if ok != tc.ok || got != tc.want {
			t.Errorf("Ratio(%v, %v) = %v, %v; want %v, %v", tc.a, tc.b, got, ok, tc.want, tc.ok)
		}
	}
}

func TestSuspendMemoryMiB(t *testing.T) {
	for _, tc := range []struct{ mib, want int }{{16, 512}, {128, 512}, {256, 768}, {1024, 2304}} {
		if got := SuspendMemoryMiB(tc.mib); got != tc.want {
			t.Errorf("SuspendMemoryMiB(%d) = %d, want %d", tc.mib, got, tc.want)
		}
	}
}

func TestConfigDefaultsAndGroups(t *testing.T) {
	var c Config
	c.defaults()
	if c.LifecycleRuns != 20 || c.SuspendRuns != 5 || !slices.Equal(c.SuspendMiB, []int{16, 256}) || c.PoolSize != 3 || c.PoolRuns != 10 {
		t.Fatalf("defaults: %+v", c)
	}
	for _, g := range Groups {
		if c.wants(g) != (g != GroupEgress && g != GroupTemplates && g != GroupScale) {
			t.Errorf("empty Only: wants %s = %v (every group but egress, templates and scale)", g, c.wants(g))
		}
	}
	c = Config{PoolSize: 1, Only: []string{GroupPool}}
	c.defaults()
	if c.PoolSize != 3 {
		t.Errorf("PoolSize 1 became %d, want at least 3", c.PoolSize)
	}
	if !c.wants(GroupPool) || c.wants(GroupCreate) {
		t.Errorf("Only [pool]: wants pool %v, create %v", c.wants(GroupPool), c.wants(GroupCreate))
	}
}

func TestUnsupported(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&client.APIError{Status: 404}, true},
		{&client.APIError{Status: 405}, true},
		{&client.APIError{Status: 422}, true},
		{&client.APIError{Status: 501}, true},
		{fmt.Errorf("suspend x: %w", &client.OperationError{Operation: model.Operation{State: model.OpFailed}}), true},
		{&client.APIError{Status: 409}, false},
		{&client.APIError{Status: 500}, false},
		{errors.New("connection refused"), false},
	} {
		if got := unsupported(tc.err); got != tc.want {
			t.Errorf("unsupported(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestFileSandboxMiB(t *testing.T) {
	for _, c := range []struct {
		bytes int64
		want  int
	}{{64 << 20, 512}, {128 << 20, 512}, {256 << 20, 768}, {1 << 30, 2304}} {
		if got := FileSandboxMiB(c.bytes); got != c.want {
			t.Errorf("FileSandboxMiB(%d MiB) = %d, want %d", c.bytes>>20, got, c.want)
		}
	}
}

func TestDiskFloorWritesAndRemoves(t *testing.T) {
	dir := t.TempDir()
	b := &bencher{cfg: Config{DataDir: dir, SuspendRuns: 2}}
	st, err := b.diskFloor(5<<20 + 3)
	if err != nil || st == nil || st.N != 2 {
		t.Fatalf("diskFloor: %+v %v", st, err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("left %d files behind", len(left))
	}
	b.cfg.DataDir = filepath.Join(dir, "absent")
	var skip errSkip
	if _, err := b.diskFloor(1); !errors.As(err, &skip) {
		t.Errorf("absent data dir: %v, want a skip", err)
	}
}
