// Command airlock is Airlock's one binary: the daemons (`airlock up`,
// `airlock server`, `airlock worker`, in internal/daemon) and the CLI that
// talks to their API (`airlock sandbox …`, `exec`, `cp`, `op`, `bench`, in
// internal/cli). Run `airlock help` for the list.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/bench/egressbench"
	"github.com/airlock/airlock/internal/cli"
	"github.com/airlock/airlock/internal/daemon"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) > 0 {
		switch args[0] {
		case "up", "server", "worker":
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return daemon.Main(ctx, args[0], args[1:])
		}
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	return cli.Main(context.Background(), args, cli.Env{
		Stdin:           os.Stdin,
		Stdout:          os.Stdout,
		Stderr:          os.Stderr,
		Getenv:          os.Getenv,
		StdinIsTerminal: isTerminal(os.Stdin),
		Signals:         sigs,
		BenchEgress:     egressbench.Run,
		ImportTemplate:  importTemplate,
	})
}

// isTerminal reports whether f is a terminal (not a pipe, file or /dev/null).
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
