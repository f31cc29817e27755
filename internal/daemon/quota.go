package daemon

import (
	"flag"

	"github.com/airlock/airlock/internal/service"
)

// quotaFlags are the server's sandbox limits, shared by `airlock up` and
// `airlock server` (per-org quotas are set at run time: `airlock org set`).
type quotaFlags struct {
	maxDisk     *int
	createRate  *float64
	createBurst *int
}

func addQuotaFlags(fs *flag.FlagSet) *quotaFlags {
	return &quotaFlags{
		maxDisk:     fs.Int("max-disk-mib", service.DefaultMaxDiskMiB, "largest resources.disk_mib a sandbox may ask for (its writable filesystem; the default is 4096 or this, if smaller)"),
		createRate:  fs.Float64("create-rate", service.DefaultCreateRate, "sandboxes each org may create (create, fork, import requests) per second, sustained; a negative value disables the limit"),
		createBurst: fs.Int("create-burst", service.DefaultCreateBurst, "create requests each org may make at once before --create-rate applies"),
	}
}

// apply sets the limits in the service configuration c.
func (q *quotaFlags) apply(c *service.Config) {
	c.MaxDiskMiB, c.CreateRate, c.CreateBurst = *q.maxDisk, *q.createRate, *q.createBurst
}
