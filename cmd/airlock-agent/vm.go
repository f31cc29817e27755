package main

import (
	"log/slog"
	"os"

	"github.com/airlock/airlock/internal/agent"
)

// vmMode handles the agent's VM init mode (qemu runtime). As the
// initramfs's /init (PID 1, airlock.vm=1 on the kernel command line) it
// sets up the guest and execs the template's agent, never returning; as
// that re-executed agent it returns the virtio-serial dialer to serve on.
// Anywhere else it returns ok=false and the agent dials its unix socket.
func vmMode(log *slog.Logger) (dial agent.Dialer, ok bool) {
	if os.Getpid() != 1 {
		return nil, false
	}
	if os.Getenv(agent.VMStageEnv) != "" {
		os.Unsetenv(agent.VMStageEnv)
		dial, err := agent.VMDialer(log)
		if err != nil {
			log.Error("vm channel", "err", err)
			agent.VMPowerOff()
		}
		agent.VMClockSync(log)
		return dial, true
	}
	p, ok := agent.VMInitParams()
	if !ok {
		return nil, false
	}
	err := agent.VMBoot(p, log)
	log.Error("vm init failed; powering off", "err", err)
	agent.VMPowerOff()
	return nil, false
}
