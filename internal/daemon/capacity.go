package daemon

import (
	"flag"
	"fmt"

	"github.com/airlock/airlock/internal/worker"
)

// capacityFlags are a worker's capacity settings (docs/operations.md).
type capacityFlags struct {
	cpu, mem *float64
	reserve  *int
}

func addCapacityFlags(fs *flag.FlagSet) capacityFlags {
	return capacityFlags{
		cpu: fs.Float64("cpu-overcommit", worker.DefaultCPUOvercommit,
			"vCPUs of sandbox limits the worker offers per core (paused sandboxes' vCPUs do not count; a sandbox's vCPUs stay a hard cap)"),
		mem: fs.Float64("memory-overcommit", worker.DefaultMemoryOvercommit,
			"MiB of sandbox memory limits the worker offers per MiB of its memory less the reserve; a sandbox still starts only where its host has the memory free (measured)"),
		reserve: fs.Int("memory-reserve", -1,
			"MiB of the host's memory kept from sandboxes, for the host itself (-1: 5% of it, 512 MiB to 4 GiB)"),
	}
}

// capacity is the worker's offer: its vCPUs and MiB after overcommit, the
// reserve, and the measurement of free memory it reports.
type capacity struct {
	vcpus, mib, reserveMiB int
	free                   func() (int, bool)
}

func (f capacityFlags) resolve() (capacity, error) {
	cores, mem, err := worker.HostMemory()
	if err != nil {
		return capacity{}, fmt.Errorf("worker capacity: %w", err)
	}
	reserve := *f.reserve
	if reserve < 0 {
		reserve = worker.DefaultReserveMiB(mem)
	}
	vcpus, mib, err := worker.Capacity(cores, mem, reserve, *f.cpu, *f.mem)
	if err != nil {
		return capacity{}, fmt.Errorf("--cpu-overcommit, --memory-overcommit, --memory-reserve: %w", err)
	}
	return capacity{vcpus: vcpus, mib: mib, reserveMiB: reserve, free: worker.HostFreeMiB(reserve)}, nil
}
