package e2e

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/client"
)

// ptySession is the built `airlock` CLI running on a real pseudo-terminal
// (github.com/creack/pty), as a user's terminal would run it.
type ptySession struct {
	t    *testing.T
	cmd  *exec.Cmd
	ptmx *os.File
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
}

func startPTY(t *testing.T, s *stack, rows, cols uint16, args ...string) *ptySession {
	t.Helper()
	cmd := exec.Command(filepath.Join(s.bin, "airlock"), args...)
	cmd.Env = append(os.Environ(), "AIRLOCK_URL="+s.url(), "AIRLOCK_API_KEY="+s.adminKey, "TERM=xterm")
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: rows, Cols: cols})
	if err != nil {
		t.Fatalf("start airlock %v on a pty: %v", args, err)
	}
	p := &ptySession{t: t, cmd: cmd, ptmx: ptmx, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		buf := make([]byte, 4096)
		for {
			n, err := ptmx.Read(buf)
			p.mu.Lock()
			p.out.Write(buf[:n])
			p.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		ptmx.Close()
	})
	return p
}

func (p *ptySession) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func (p *ptySession) send(s string) {
	p.t.Helper()
	if _, err := p.ptmx.Write([]byte(s)); err != nil {
		p.t.Fatalf("write %q to the terminal: %v", s, err)
	}
}

// waitFor waits until the terminal has shown want (after what it showed
// at mark, a length of output()), retrying retry every second if set.
func (p *ptySession) waitFor(mark int, want, retry string) int {
	p.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	next := time.Now()
	for time.Now().Before(deadline) {
		out := p.output()
		if i := strings.Index(out[mark:], want); i >= 0 {
			return mark + i + len(want)
		}
		if retry != "" && time.Now().After(next) {
			p.send(retry)
			next = time.Now().Add(time.Second)
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.t.Fatalf("the terminal never showed %q; it showed:\n%s", want, p.output())
	return 0
}

// exitCode waits for the CLI to exit and returns its exit status.
func (p *ptySession) exitCode() int {
	p.t.Helper()
	waited := make(chan error, 1)
	go func() { waited <- p.cmd.Wait() }()
	select {
	case err := <-waited:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			p.t.Fatalf("wait: %v", err)
		}
		return 0
	case <-time.After(60 * time.Second):
		p.t.Fatalf("the CLI did not exit; the terminal showed:\n%s", p.output())
		return -1
	}
}

// TestTerminal drives `airlock exec -it` and `airlock shell` on a real
// pseudo-terminal: the remote side sees a terminal of the local size, a
// local resize reaches it, Ctrl-C interrupts the remote foreground job
// (not the CLI), keys are not echoed twice (the local terminal is raw),
// and the CLI exits with the remote shell's status.
func TestTerminal(t *testing.T) {
	s := need(t)
	c := s.client()
	sb := newSandbox(t, c, client.CreateSandboxRequest{})

	p := startPTY(t, s, 30, 100, "exec", "-it", sb.ID, "--", "bash", "--norc", "--noprofile")
	m := p.waitFor(0, "30 100", "stty size\r")
	// Type at the prompt: between commands bash leaves the remote terminal
	// cooked, and its kernel echo plus readline's redraw would show a line
	// typed then twice whatever the local terminal does.
	m = p.waitFor(m, "$ ", "")
	// Typed once, shown once: the local terminal is raw, the remote echoes.
	p.send("echo mark-$((6*7))\r")
	m = p.waitFor(m, "mark-42", "")
	if n := strings.Count(p.output(), "echo mark-$((6*7))"); n != 1 {
		t.Errorf("the typed line shows %d times, want once (local echo left on?):\n%s", n, p.output())
	}
	if err := pty.Setsize(p.ptmx, &pty.Winsize{Rows: 40, Cols: 120}); err != nil {
		t.Fatal(err)
	}
	m = p.waitFor(m, "40 120", "stty size\r")
	p.send("sleep 1000\r")
	time.Sleep(1500 * time.Millisecond)
	p.send("\x03") // Ctrl-C
	m = p.waitFor(m, "status-130", "echo status-$?\r")
	p.send("exit 7\r")
	if code := p.exitCode(); code != 7 {
		t.Fatalf("airlock exec -it exited %d, want the shell's 7; the terminal showed:\n%s", code, p.output())
	}
	_ = m

	// airlock shell: a login shell of the default user.
	sh := startPTY(t, s, 24, 80, "shell", sb.ID)
	sh.waitFor(0, "whoami-user", "echo whoami-$(whoami)\r")
	sh.send("exit 3\r")
	if code := sh.exitCode(); code != 3 {
		t.Fatalf("airlock shell exited %d, want 3; the terminal showed:\n%s", code, sh.output())
	}

	// Without a terminal on stdin, -t says what is wrong (exit 2).
	cmd := exec.Command(filepath.Join(s.bin, "airlock"), "exec", "-t", sb.ID, "--", "true")
	cmd.Env = append(os.Environ(), "AIRLOCK_URL="+s.url(), "AIRLOCK_API_KEY="+s.adminKey)
	cmd.Stdin = strings.NewReader("")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), "not a terminal") {
		t.Fatalf("exec -t without a terminal: %v, stderr %q; want exit 2 saying stdin is not a terminal", err, stderr.String())
	}
}

// TestTerminalRestored: after `airlock exec -it` the local terminal is back
// in the mode it was in (echo and canonical input on).
func TestTerminalRestored(t *testing.T) {
	s := need(t)
	sb := newSandbox(t, s.client(), client.CreateSandboxRequest{})
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	defer tty.Close()
	go io.Copy(io.Discard, ptmx)
	cmd := exec.Command(filepath.Join(s.bin, "airlock"), "exec", "-it", sb.ID, "--", "true")
	cmd.Env = append(os.Environ(), "AIRLOCK_URL="+s.url(), "AIRLOCK_API_KEY="+s.adminKey)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	if err := cmd.Run(); err != nil {
		t.Fatalf("airlock exec -it … true: %v", err)
	}
	tio, err := unix.IoctlGetTermios(int(tty.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	if tio.Lflag&unix.ECHO == 0 || tio.Lflag&unix.ICANON == 0 {
		t.Fatalf("the terminal is left raw after exec -it (lflag %#x)", tio.Lflag)
	}
}
