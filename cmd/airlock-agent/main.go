// Command airlock-agent is PID 1 inside every sandbox. It dials the host over
// the sandbox's private channel and serves the agentapi contract (HTTP/2
// without TLS) on every connection it dials; it never listens. The same
// connections carry E2B's envd API under /envd/, an HTTP proxy to ports
// inside the sandbox under /ports/{port}/, and CONNECT tunnels to them.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/airlock/airlock/internal/agent"
	"github.com/airlock/airlock/internal/agent/envd"
	"github.com/airlock/airlock/internal/agentapi"
)

func main() {
	channel := flag.String("channel", agentapi.ChannelDir+"/"+agentapi.ChannelSocket, "unix socket to dial on the host")
	spare := flag.Int("spare", 1, "unused connections to keep dialed")
	maxOutput := flag.Int64("max-output", agent.DefaultMaxOutput, "output bytes kept per process")
	verbose := flag.Bool("v", false, "log debug messages")
	flag.Parse()
	if *spare < 1 {
		fmt.Fprintln(os.Stderr, "airlock-agent: --spare must be at least 1")
		os.Exit(2)
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	ctx := context.Background()
	if os.Getpid() != 1 {
		// PID 1 never exits on a signal; elsewhere (tests, debugging) stop cleanly.
		var stop context.CancelFunc
		ctx, stop = signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
		defer stop()
	} else {
		// Catch (not ignore: children would inherit SIG_IGN) and drop them.
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
		go func() {
			for s := range ch {
				// Debug: guest root can send these at will, and the log is a host file.
				log.Debug("ignoring signal as PID 1", "signal", s)
			}
		}()
	}

	a := agent.New(agent.Config{Logger: log, MaxOutput: *maxOutput})
	a.Handle(agentapi.EnvdPrefix+"/", http.StripPrefix(agentapi.EnvdPrefix, envd.New(a, envd.Config{Logger: log})))
	a.Handle(agentapi.PortsPrefix, envd.Ports())
	var d net.Dialer
	var dial agent.Dialer = func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "unix", *channel) }
	if vmDial, ok := vmMode(log); ok { // qemu sandbox: serve on virtio-serial
		dial, *spare, *channel = vmDial, 1, "virtio-serial:"+agentapi.VMPortName
	}
	log.Info("airlock-agent starting", "channel", *channel, "pid", os.Getpid(), "version", agentapi.Version)
	if err := agent.Serve(ctx, dial, *spare, envd.Tunnel(a), log); err != nil {
		log.Error("serve", "err", err)
		os.Exit(1)
	}
}
