package envd_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock/airlock/internal/agent"
	"github.com/airlock/airlock/internal/agent/envd"
	"github.com/airlock/airlock/internal/envdpb/filesystem/filesystemconnect"
	"github.com/airlock/airlock/internal/envdpb/process/processconnect"
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

// buildAgent builds cmd/airlock-agent statically once per test binary, or
// returns $AIRLOCK_TEST_AGENT.
func buildAgent(tb testing.TB) string {
	tb.Helper()
	if bin := os.Getenv("AIRLOCK_TEST_AGENT"); bin != "" {
		return bin
	}
	goBin := testenv.RequireGoBuild(tb, "airlock-agent")
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "airlock-envd-bin-"); buildErr != nil {
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

// sandbox is one envd endpoint under test: base is the URL the envd paths
// hang off (…/envd), root the agent's own root.
type sandbox struct {
	name string
	hc   *http.Client
	root string
	base string
	h2   bool
}

// startAgent runs the airlock-agent binary the way a runtime does: it dials
// a unix socket the test listens on and serves HTTP/2 (h2c) there.
func startAgent(tb testing.TB) *sandbox {
	tb.Helper()
	testenv.RequireRoot(tb, "the agent runs processes with an explicit uid/gid")
	bin := buildAgent(tb)
	dir, err := os.MkdirTemp("", "airlock-envd-") // short: unix socket paths are limited
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		tb.Fatal(err)
	}
	conns := make(chan net.Conn, 64)
	var mu sync.Mutex
	var accepted []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted = append(accepted, c)
			mu.Unlock()
			conns <- c
		}
	}()
	var stderr bytes.Buffer
	var stderrMu sync.Mutex
	cmd := exec.Command(bin, "--channel", sock, "-v")
	cmd.Stderr = writerFunc(func(b []byte) (int, error) {
		stderrMu.Lock()
		defer stderrMu.Unlock()
		return stderr.Write(b)
	})
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start agent: %v", err)
	}
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{
		Protocols: &p,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			select {
			case c := <-conns:
				return c, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		},
	}
	tb.Cleanup(func() {
		tr.CloseIdleConnections()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		ln.Close()
		mu.Lock()
		for _, c := range accepted {
			c.Close()
		}
		mu.Unlock()
		stderrMu.Lock()
		race := strings.Contains(stderr.String(), "DATA RACE")
		stderrMu.Unlock()
		if race {
			tb.Error("the agent reported a data race")
		}
		if tb.Failed() {
			stderrMu.Lock()
			tb.Logf("agent log:\n%s", stderr.String())
			stderrMu.Unlock()
		}
	})
	sb := &sandbox{name: "agent-h2c", hc: &http.Client{Transport: tr}, root: "http://agent", base: "http://agent/envd", h2: true}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, "GET", sb.base+"/health", nil)
		resp, err := sb.hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent {
				return sb
			}
			tb.Fatalf("GET /envd/health = %d, want 204", resp.StatusCode)
		}
		if ctx.Err() != nil {
			tb.Fatalf("agent not ready: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startInProcess serves the envd handler from this test process over
// plain HTTP/1.1, the transport E2B SDKs use.
func startInProcess(tb testing.TB) *sandbox {
	tb.Helper()
	testenv.RequireRoot(tb, "the agent runs processes with an explicit uid/gid")
	a := agent.New(agent.Config{})
	a.Handle("/envd/", http.StripPrefix("/envd", envd.New(a, envd.Config{})))
	a.Handle("/ports/", envd.Ports())
	srv := httptest.NewServer(envd.Tunnel(a))
	tb.Cleanup(srv.Close)
	return &sandbox{name: "inprocess-http1", hc: srv.Client(), root: srv.URL, base: srv.URL + "/envd"}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// codec is one Connect protocol and codec combination.
type codec struct {
	name string
	opts []connect.ClientOption
}

var codecs = []codec{
	{"connect+json", []connect.ClientOption{connect.WithProtoJSON()}},
	{"connect+proto", nil},
	{"grpc+proto", []connect.ClientOption{connect.WithGRPC()}},
}

func (sb *sandbox) process(c codec) processconnect.ProcessClient {
	return processconnect.NewProcessClient(sb.hc, sb.base, c.opts...)
}

func (sb *sandbox) files(c codec) filesystemconnect.FilesystemClient {
	return filesystemconnect.NewFilesystemClient(sb.hc, sb.base, c.opts...)
}

// do sends a plain HTTP request to an envd path.
func (sb *sandbox) do(tb testing.TB, method, path string, hdr http.Header, body io.Reader) (*http.Response, []byte) {
	tb.Helper()
	req, err := http.NewRequestWithContext(testCtx(tb), method, sb.base+path, body)
	if err != nil {
		tb.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := sb.hc.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp, b
}

func testCtx(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	tb.Cleanup(cancel)
	return ctx
}

// asRoot authenticates as root (the test host has no user "user").
func asRoot[T any](m *T) *connect.Request[T] {
	req := connect.NewRequest(m)
	req.Header().Set("Authorization", "Basic cm9vdDo=") // base64("root:")
	return req
}

// connectReq wraps m without a user: the server's default user applies.
func connectReq[T any](m *T) *connect.Request[T] { return connect.NewRequest(m) }

func rootHeader() http.Header {
	return http.Header{"Authorization": {"Basic cm9vdDo="}}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
