package worker

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	goruntime "runtime"

	"github.com/airlock/airlock/internal/workerapi"
)

// Capacity model (docs/operations.md). A sandbox's vCPUs and memory are
// limits, enforced inside the sandbox as hard caps (a cgroup's cpu.max and
// memory.max for gVisor, the VM's size for QEMU). Placement counts them
// against the worker's capacity, which is its cores and memory multiplied
// by the operator's overcommit: agent sandboxes sit idle most of the time,
// so counting every limit as taken would leave a machine nearly empty. What
// overcommit cannot promise, memory a sandbox really needs to start, is
// checked against measurement: the worker reports its host's free memory
// (HostFreeMiB) with every Sync, and placement admits a sandbox only where
// its start footprint fits (scheduler.StartFootprint).

// Overcommit defaults, for agent workloads: a 2-core, 24 GiB machine
// offers 256 vCPUs and about 182 GiB of sandbox limits, i.e. 256 running
// sandboxes of the default 1 vCPU / 512 MiB (more when some are paused),
// while an idle gVisor sandbox holds about 15 MiB. Oversubscribed CPU
// slows busy sandboxes down and never fails one; memory is guarded by
// measurement as well.
const (
	DefaultCPUOvercommit    = 128.0
	DefaultMemoryOvercommit = 8.0
)

// Capacity returns the vCPUs and MiB a worker with cores and memMiB offers
// at the overcommits given (at least 1 each), less reserveMiB of memory
// for the host (the worker, the server, page cache) before overcommit.
func Capacity(cores, memMiB, reserveMiB int, cpuOvercommit, memOvercommit float64) (vcpus, capMiB int, err error) {
	if cpuOvercommit < 1 || memOvercommit < 1 {
		return 0, 0, fmt.Errorf("overcommit must be at least 1 (got cpu %g, memory %g): 1 reserves every limit in full", cpuOvercommit, memOvercommit)
	}
	if reserveMiB < 0 || reserveMiB >= memMiB {
		return 0, 0, fmt.Errorf("memory reserve %d MiB: want at least 0 and less than the host's %d MiB", reserveMiB, memMiB)
	}
	return int(float64(cores) * cpuOvercommit), int(float64(memMiB-reserveMiB) * memOvercommit), nil
}

// DefaultReserveMiB is the memory a worker keeps for its host by default:
// 5% of it, at least 512 MiB and at most 4 GiB (never more than half).
func DefaultReserveMiB(memMiB int) int {
	return min(max(memMiB/20, 512), 4096, memMiB/2)
}

// HostMemory returns the host's cores and total memory in MiB.
func HostMemory() (cores, memMiB int, err error) {
	total, _, err := meminfo()
	return goruntime.NumCPU(), total, err
}

// HostFreeMiB returns a Config.FreeMiB for this host: MemAvailable less
// reserveMiB (0 at least), or false when /proc/meminfo cannot be read.
func HostFreeMiB(reserveMiB int) func() (int, bool) {
	return func() (int, bool) {
		_, avail, err := meminfo()
		if err != nil {
			return 0, false
		}
		return max(avail-reserveMiB, 0), true
	}
}

// meminfo reads MemTotal and MemAvailable (MiB) from /proc/meminfo.
func meminfo() (totalMiB, availMiB int, err error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0, err
	}
	var total, avail int64 = -1, -1
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var kb int64
		if _, e := fmt.Sscanf(sc.Text(), "MemTotal: %d kB", &kb); e == nil {
			total = kb
		} else if _, e := fmt.Sscanf(sc.Text(), "MemAvailable: %d kB", &kb); e == nil {
			avail = kb
		}
	}
	if total < 0 || avail < 0 {
		return 0, 0, fmt.Errorf("/proc/meminfo: no MemTotal or MemAvailable line")
	}
	return int(total / 1024), int(avail / 1024), nil
}

// freeMiB measures through Config.FreeMiB (nil: not measured).
func (w *Worker) freeMiB() *int {
	if w.cfg.FreeMiB == nil {
		return nil
	}
	n, ok := w.cfg.FreeMiB()
	if !ok {
		return nil
	}
	return &n
}

// checkFree syncs now when the host's free memory moved by
// workerapi.FreeReportStepMiB or more since the last report (it runs with
// the status round, every StatusInterval).
func (w *Worker) checkFree() {
	free := w.freeMiB()
	if free == nil {
		return
	}
	if d := int64(*free) - w.reportedFree.Load(); d >= workerapi.FreeReportStepMiB || -d >= workerapi.FreeReportStepMiB {
		w.kickSync() // cuts the long poll short
	}
}
