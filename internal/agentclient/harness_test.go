package agentclient_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/testenv"
)

var (
	buildOnce sync.Once
	agentBin  string
	buildErr  error
	binDir    string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// buildAgent builds cmd/airlock-agent (static) once per test binary, or
// returns $AIRLOCK_TEST_AGENT (e.g. an agent built with -race).
func buildAgent(tb testing.TB) string {
	tb.Helper()
	if bin := os.Getenv("AIRLOCK_TEST_AGENT"); bin != "" {
		return bin
	}
	goBin := testenv.RequireGoBuild(tb, "airlock-agent")
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "airlock-agent-bin-")
		if buildErr != nil {
			return
		}
		agentBin = filepath.Join(binDir, "airlock-agent")
		cmd := exec.Command(goBin, "build", "-o", agentBin, "github.com/airlock/airlock/cmd/airlock-agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build airlock-agent: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		tb.Fatal(buildErr)
	}
	return agentBin
}

// host is the host side of one agent: a unix listener the agent dials, and
// a client whose connections are the accepted ones.
type host struct {
	tb     testing.TB
	dir    string
	sock   string
	cmd    *exec.Cmd
	client *agentclient.Client
	stderr *bytes.Buffer
	logw   *lockedWriter // writes to stderr; lock it to read stderr while the agent runs

	mu       sync.Mutex
	ln       net.Listener
	accepted []net.Conn
	conns    chan net.Conn
}

func startAgent(tb testing.TB, args ...string) *host {
	tb.Helper()
	testenv.RequireRoot(tb, "processes run with an explicit uid/gid")
	bin := buildAgent(tb)
	dir, err := os.MkdirTemp("", "airlock-agent-test-") // short path: unix socket names are limited
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	h := &host{tb: tb, dir: dir, sock: filepath.Join(dir, "agent.sock"), conns: make(chan net.Conn, 64)}
	h.listen()
	h.stderr = &bytes.Buffer{}
	h.cmd = exec.Command(bin, append([]string{"--channel", h.sock, "-v"}, args...)...)
	h.logw = &lockedWriter{w: h.stderr}
	h.cmd.Stderr = h.logw
	if err := h.cmd.Start(); err != nil {
		tb.Fatalf("start agent: %v", err)
	}
	h.client = agentclient.New(h.dial)
	tb.Cleanup(func() {
		h.client.Close()
		_ = h.cmd.Process.Kill()
		_ = h.cmd.Wait()
		h.closeListener()
		if strings.Contains(h.stderr.String(), "DATA RACE") {
			tb.Error("the agent reported a data race")
		}
		if tb.Failed() {
			tb.Logf("agent log:\n%s", h.stderr.String())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.client.WaitReady(ctx); err != nil {
		tb.Fatalf("agent not ready: %v", err)
	}
	return h
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// agentLog returns the agent's log so far.
func (h *host) agentLog() string {
	h.logw.mu.Lock()
	defer h.logw.mu.Unlock()
	return h.stderr.String()
}

func (h *host) listen() {
	ln, err := net.Listen("unix", h.sock)
	if err != nil {
		h.tb.Fatal(err)
	}
	h.mu.Lock()
	h.ln = ln
	h.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			h.accepted = append(h.accepted, c)
			h.mu.Unlock()
			h.conns <- c
		}
	}()
}

func (h *host) closeListener() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ln != nil {
		h.ln.Close()
		h.ln = nil
	}
}

// closeAll closes the listener's accepted connections (in use and spare)
// and forgets the queued ones.
func (h *host) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.accepted {
		c.Close()
	}
	h.accepted = nil
	for {
		select {
		case c := <-h.conns:
			c.Close()
		default:
			return
		}
	}
}

func (h *host) acceptedCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.accepted)
}

func (h *host) dial(ctx context.Context) (net.Conn, error) {
	select {
	case c := <-h.conns:
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func testCtx(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	tb.Cleanup(cancel)
	return ctx
}

// result is a whole output stream.
type result struct {
	stdout, stderr bytes.Buffer
	combined       bytes.Buffer
	exit           agentapi.Exit
	errMsg         string
}

// collect reads a stream to its end.
func collect(tb testing.TB, s *agentclient.OutputStream) *result {
	tb.Helper()
	defer s.Close()
	var r result
	for {
		kind, payload, err := s.Next()
		if errors.Is(err, io.EOF) {
			return &r
		}
		if err != nil {
			tb.Fatalf("read output: %v", err)
		}
		switch kind {
		case agentapi.FrameStdout:
			r.stdout.Write(payload)
			r.combined.Write(payload)
		case agentapi.FrameStderr:
			r.stderr.Write(payload)
			r.combined.Write(payload)
		case agentapi.FrameExit:
			if err := json.Unmarshal(payload, &r.exit); err != nil {
				tb.Fatalf("decode exit: %v", err)
			}
		case agentapi.FrameError:
			r.errMsg = string(payload)
		default:
			tb.Fatalf("unexpected frame kind %d", kind)
		}
	}
}

var idSeq struct {
	sync.Mutex
	n int
}

func newID() string {
	idSeq.Lock()
	defer idSeq.Unlock()
	idSeq.n++
	return fmt.Sprintf("p%d", idSeq.n)
}

// run starts spec (as root unless set) and reads its whole output.
func (h *host) run(ctx context.Context, spec agentapi.ProcessSpec) *result {
	h.tb.Helper()
	if spec.ID == "" {
		spec.ID = newID()
	}
	if spec.User == "" {
		spec.User = "root"
	}
	if _, err := h.client.StartProcess(ctx, spec); err != nil {
		h.tb.Fatalf("start %v: %v", spec.Argv, err)
	}
	s, err := h.client.Output(ctx, spec.ID, 0)
	if err != nil {
		h.tb.Fatalf("output of %v: %v", spec.Argv, err)
	}
	return collect(h.tb, s)
}
