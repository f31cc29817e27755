package worker

import (
	"strings"
	"testing"
)

func TestCapacity(t *testing.T) {
	for _, c := range []struct {
		cores, mem, reserve int
		cpu, memOver        float64
		vcpus, mib          int
		err                 string
	}{
		{cores: 2, mem: 24576, reserve: 1228, cpu: DefaultCPUOvercommit, memOver: DefaultMemoryOvercommit, vcpus: 256, mib: 186784},
		{cores: 2, mem: 4096, reserve: 512, cpu: 1, memOver: 1, vcpus: 2, mib: 3584},
		{cores: 4, mem: 8192, reserve: 0, cpu: 1.5, memOver: 2.5, vcpus: 6, mib: 20480},
		{cores: 2, mem: 4096, cpu: 0.5, memOver: 1, err: "overcommit must be at least 1"},
		{cores: 2, mem: 4096, cpu: 1, memOver: 0, err: "overcommit must be at least 1"},
		{cores: 2, mem: 4096, reserve: 4096, cpu: 1, memOver: 1, err: "memory reserve 4096 MiB"},
		{cores: 2, mem: 4096, reserve: -1, cpu: 1, memOver: 1, err: "memory reserve -1 MiB"},
	} {
		vcpus, mib, err := Capacity(c.cores, c.mem, c.reserve, c.cpu, c.memOver)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("Capacity(%+v) err = %v, want %q", c, err, c.err)
			}
			continue
		}
		if err != nil || vcpus != c.vcpus || mib != c.mib {
			t.Errorf("Capacity(%+v) = %d vCPUs, %d MiB, %v; want %d, %d", c, vcpus, mib, err, c.vcpus, c.mib)
		}
	}
}

func TestDefaultReserveMiB(t *testing.T) {
	for mem, want := range map[int]int{24576: 1228, 4096: 512, 512: 256, 200000: 4096} {
		if got := DefaultReserveMiB(mem); got != want {
			t.Errorf("DefaultReserveMiB(%d) = %d, want %d", mem, got, want)
		}
	}
}

// TestHostFreeMiB reads this host's /proc/meminfo: free memory is reported,
// below the host's total, and the reserve comes off it.
func TestHostFreeMiB(t *testing.T) {
	_, total, err := HostMemory()
	if err != nil {
		t.Skipf("no /proc/meminfo here: %v", err)
	}
	free, ok := HostFreeMiB(0)()
	if !ok || free <= 0 || free > total {
		t.Fatalf("HostFreeMiB(0) = %d, %v; want 0 < free <= %d", free, ok, total)
	}
	if less, ok := HostFreeMiB(total)(); !ok || less != 0 {
		t.Errorf("HostFreeMiB(total) = %d, %v; want 0 (never negative)", less, ok)
	}
}
