package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/testenv"
)

// stack is one running Airlock: a server process and a worker process.
type stack struct {
	root        string // server data, binaries and logs live under here
	workerDir   string // the worker's --data-dir (shared with other packages' test caches)
	bin         string // built binaries
	db          string // --db for the server
	workerToken string
	serverAddr  string
	dataAddr    string
	server      *exec.Cmd
	worker      *exec.Cmd
	adminKey    string
	logs        *os.File
}

var (
	st      *stack
	skipWhy string

	// The stack starts with the first test that needs it (go test
	// -run NONE starts nothing) and holds the cache's e2e lock until the
	// test binary ends.
	stackOnce sync.Once
	stackErr  error
	stackLock *os.File
)

func TestMain(m *testing.M) {
	if why := testenv.RootReason("end-to-end tests run a server and a worker over runsc and cgroups"); why != "" {
		skipWhy = why
	}
	code := m.Run()
	if st != nil {
		st.stop()
	}
	if stackLock != nil {
		stackLock.Close()
	}
	os.Exit(code)
}

func need(t *testing.T) *stack {
	t.Helper()
	if skipWhy != "" {
		t.Skip(skipWhy)
	}
	stackOnce.Do(func() {
		if stackLock, stackErr = lockStack(); stackErr == nil {
			st, stackErr = startStack()
		}
	})
	if stackErr != nil {
		t.Fatalf("e2e: cannot start Airlock: %v", stackErr)
	}
	return st
}

// lockStack takes the cache's e2e lock: the stack's server and worker
// live in fixed directories of the cache (the worker's credential file
// among them), so a second e2e run on the same cache would clobber a
// running one. It waits for the other run, saying so.
func lockStack() (*os.File, error) {
	if err := os.MkdirAll(cacheDir(), 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(cacheDir(), "e2e.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: another end-to-end run holds %s; waiting for it (set AIRLOCK_TEST_CACHE to run apart)\n", path)
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
	}
	return f, nil
}

// cacheDir keeps runsc and the Debian layer between runs so only the first
// run on a machine pays for them. The setup and runtime tests use the same
// directory; set-up takes a lock in it, so concurrent packages build once.
func cacheDir() string {
	if d := os.Getenv("AIRLOCK_TEST_CACHE"); d != "" {
		return d
	}
	return "/var/tmp/airlock-test-cache"
}

func startStack() (*stack, error) {
	root := filepath.Join(cacheDir(), "e2e")
	s := &stack{root: root, workerDir: cacheDir(), bin: filepath.Join(root, "bin"), workerToken: "e2e-worker-token"}
	for _, d := range []string{s.bin, filepath.Join(root, "server"), s.workerDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	// A fresh control plane each run; the worker dir keeps its caches.
	os.Remove(filepath.Join(root, "server", "airlock.db"))
	os.Remove(filepath.Join(root, "server", "admin.key"))
	logs, err := os.Create(filepath.Join(root, "stack.log"))
	if err != nil {
		return nil, err
	}
	s.logs = logs
	modRoot, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	for _, b := range []struct{ pkg, cgo string }{{"./cmd/airlock", "1"}, {"./cmd/airlock-agent", "0"}} {
		cmd := exec.Command("go", "build", "-o", s.bin+"/", b.pkg)
		cmd.Dir = modRoot
		cmd.Env = append(os.Environ(), "CGO_ENABLED="+b.cgo)
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	s.db = filepath.Join(root, "server", "airlock.db")
	if u := os.Getenv("AIRLOCK_TEST_POSTGRES_URL"); u != "" {
		if s.db, err = freshDatabase(u); err != nil {
			return nil, err
		}
	}
	if s.serverAddr, err = freeAddr(); err != nil {
		return nil, err
	}
	if s.dataAddr, err = freeAddr(); err != nil {
		return nil, err
	}
	if err := s.startServer(); err != nil {
		return nil, err
	}
	if err := s.startWorker(); err != nil {
		s.stop()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // first run builds runsc and the template
	defer cancel()
	if err := s.waitHealthy(ctx); err != nil {
		s.stop()
		return nil, err
	}
	s.adminKey = readTrim(filepath.Join(root, "server", "admin.key"))
	if s.adminKey == "" {
		s.stop()
		return nil, fmt.Errorf("server wrote no admin.key")
	}
	return s, nil
}

func (s *stack) startServer() error {
	s.server = exec.Command(filepath.Join(s.bin, "airlock"), "server",
		"--listen", s.serverAddr, "--data-dir", filepath.Join(s.root, "server"),
		"--db", s.db, "--worker-token", s.workerToken)
	s.server.Stdout, s.server.Stderr = s.logs, s.logs
	return s.server.Start()
}

func (s *stack) startWorker() error {
	s.worker = exec.Command(filepath.Join(s.bin, "airlock"), "worker",
		"--server", "http://"+s.serverAddr, "--data-dir", s.workerDir,
		"--data-listen", s.dataAddr, "--worker-token", s.workerToken, "--id", "w-e2e")
	s.worker.Stdout, s.worker.Stderr = s.logs, s.logs
	return s.worker.Start()
}

// kill ends a process the harness started with sig and waits for it.
func kill(cmd *exec.Cmd, sig syscall.Signal) {
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

func (s *stack) stop() {
	// Delete what the tests left behind, then stop the processes.
	if s.adminKey != "" {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		c := s.client()
		page, err := c.ListSandboxes(ctx, client.SandboxFilter{Limit: 1000})
		if err == nil {
			for _, sb := range page.Sandboxes {
				if op, err := c.DeleteSandbox(ctx, sb.ID); err == nil {
					c.WaitOperation(ctx, op.ID)
				}
			}
		}
		cancel()
	}
	kill(s.worker, syscall.SIGTERM)
	kill(s.server, syscall.SIGTERM)
	s.logs.Close()
}

func (s *stack) url() string { return "http://" + s.serverAddr }

func (s *stack) client() *client.Client { return client.New(s.url(), s.adminKey) }

func (s *stack) waitHealthy(ctx context.Context) error {
	for {
		resp, err := http.Get(s.url() + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("airlock not healthy: %w (log: %s)", ctx.Err(), filepath.Join(s.root, "stack.log"))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// freshDatabase creates a new database on the PostgreSQL server at base and
// returns its URL.
func freshDatabase(base string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", fmt.Errorf("connect to postgres: %w", err)
	}
	defer conn.Close(ctx)
	name := fmt.Sprintf("airlock_e2e_%d", time.Now().UnixNano())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("create database: %w", err)
	}
	cfg, err := pgx.ParseConfig(base)
	if err != nil {
		return "", err
	}
	return strings.Replace(base, "/"+cfg.Database+"?", "/"+name+"?", 1), nil
}

func readTrim(p string) string {
	b, _ := os.ReadFile(p)
	return strings.TrimSpace(string(b))
}

// newSandbox creates a sandbox, waits until it runs, and deletes it when
// the test ends.
func newSandbox(t *testing.T, c *client.Client, req client.CreateSandboxRequest) model.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, op, err := c.CreateSandbox(ctx, req, "")
	if err != nil {
		t.Fatalf("create sandbox: %v", err)
	}
	if _, err := c.WaitOperation(ctx, op.ID); err != nil {
		t.Fatalf("create operation: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if op, err := c.DeleteSandbox(ctx, sb.ID); err == nil {
			c.WaitOperation(ctx, op.ID)
		}
	})
	sb, err = c.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

type result struct {
	stdout, stderr string
	exit           agentapi.Exit
}

// run runs argv in the sandbox and returns its output.
func run(t *testing.T, c *client.Client, id string, req client.CreateCommandRequest, stdin io.Reader) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd, err := c.CreateCommand(ctx, id, req)
	if err != nil {
		t.Fatalf("create command %v: %v", req.Argv, err)
	}
	var out, errb bytes.Buffer
	exit, err := client.RunCommand(ctx, cmd.AttachURL, cmd.Token, stdin, &out, &errb)
	if err != nil {
		t.Fatalf("run %v: %v", req.Argv, err)
	}
	return result{out.String(), errb.String(), exit}
}

func sh(t *testing.T, c *client.Client, id, script string) result {
	t.Helper()
	return run(t, c, id, client.CreateCommandRequest{Argv: []string{"/bin/sh", "-c", script}}, nil)
}

// leftovers lists what remains on the host for sandbox id: processes, mounts,
// cgroups, run directories.
func (s *stack) leftovers(id string) []string { return leftoversIn(s.workerDir, id) }

// leftoversIn is leftovers for a worker with data dir dir.
func leftoversIn(dir, id string) []string {
	var found []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(id)) {
			found = append(found, "process "+p+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, id) {
				found = append(found, "mount: "+line)
			}
		}
	}
	cg, _ := filepath.Glob("/sys/fs/cgroup/*/airlock/" + id)
	for _, d := range cg {
		found = append(found, "cgroup "+d)
	}
	matches, _ := filepath.Glob(filepath.Join(dir, "*", id))
	for _, d := range matches {
		found = append(found, "dir "+d)
	}
	return found
}
