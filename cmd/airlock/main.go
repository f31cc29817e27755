// Command airlock is Airlock's one binary: the daemons (`airlock up`,
// `airlock server`, `airlock worker`, in internal/daemon) and the CLI that
// talks to their API (`airlock sandbox …`, `exec`, `cp`, `op`, `bench`, in
// internal/cli). Run `airlock help` for the list.
package main

import (
	"context"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"
	"golang.org/x/term"

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
		case "worker":
			if len(args) > 1 && slices.Contains(cli.WorkerAdminVerbs, args[1]) {
				break // `airlock worker ls|get|cordon|uncordon`: the CLI's
			}
			fallthrough
		case "up", "server":
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
		Terminal:        stdinTerminal{},
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

// stdinTerminal is the process's terminal (stdin) for `exec -t` and
// `shell`, over golang.org/x/term; sizes are read from stdout when it is
// the terminal (stdin may be redirected from it) and stdin otherwise.
type stdinTerminal struct{}

func (stdinTerminal) MakeRaw() (func() error, error) {
	fd := int(os.Stdin.Fd())
	old, err := term.MakeRaw(fd)
	if err != nil {
		return nil, err
	}
	return func() error { return term.Restore(fd, old) }, nil
}

func (stdinTerminal) Size() (int, int, error) {
	if cols, rows, err := term.GetSize(int(os.Stdout.Fd())); err == nil {
		return cols, rows, nil
	}
	return term.GetSize(int(os.Stdin.Fd()))
}

func (stdinTerminal) Resized() (<-chan struct{}, func()) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGWINCH)
	out := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-sig:
				select {
				case out <- struct{}{}:
				default: // one pending change is enough: the size is read when it is handled
				}
			case <-done:
				return
			}
		}
	}()
	return out, func() { signal.Stop(sig); close(done) }
}
