// Package pgtest gives tests a real, empty PostgreSQL database.
//
// URL returns the URL of a fresh database named after the test and drops it
// when the test ends. The databases live on the server named by
// $AIRLOCK_TEST_POSTGRES_URL when it is set; otherwise pgtest runs a private
// server from the PostgreSQL binaries on this machine (initdb + postgres in a
// temporary directory, as an unprivileged user when the test runs as root,
// listening on 127.0.0.1 at a free port and on a private unix socket).
//
// Call Main from TestMain to start that private server once for the whole
// test binary and stop it after the last test:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// Without Main, each URL call starts and stops its own server.
//
// In the fast tier (go test -short) no private server starts (initdb and a
// server cost seconds and need the PostgreSQL binaries): URL uses the
// server named by $AIRLOCK_TEST_POSTGRES_URL when it is set, and skips the
// test otherwise, saying so; the full suite (scripts/test.sh) runs them.
package pgtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlock/airlock/internal/testenv"
)

// EnvURL names the variable that points tests at an existing server. Its
// user must be allowed to create databases.
const EnvURL = "AIRLOCK_TEST_POSTGRES_URL"

var (
	shared    *Server // started by Main
	sharedErr error
	counter   atomic.Int64
)

// Main runs the package's tests with one private server (unless EnvURL is
// set) and stops it afterwards. Use it as the body of TestMain.
func Main(m *testing.M) {
	flag.Parse() // for testing.Short: -short starts no private server
	if os.Getenv(EnvURL) == "" && !testing.Short() {
		shared, sharedErr = Start()
	}
	code := m.Run()
	if shared != nil {
		if err := shared.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: stop: %v\n", err)
		}
	}
	os.Exit(code)
}

// URL returns the URL of a new, empty database for t, dropped at cleanup.
// It skips t when neither EnvURL nor PostgreSQL binaries are available.
func URL(t testing.TB) string {
	t.Helper()
	base := os.Getenv(EnvURL)
	if base == "" {
		testenv.Short(t, "starts a private PostgreSQL server (initdb); set "+EnvURL+" to use a running one")
	}
	switch {
	case base != "":
	case shared != nil:
		base = shared.URL()
	case sharedErr != nil:
		skipOrFail(t, sharedErr)
	default:
		srv, err := Start()
		if err != nil {
			skipOrFail(t, err)
		}
		t.Cleanup(func() {
			if err := srv.Stop(); err != nil {
				t.Errorf("pgtest: stop server: %v", err)
			}
		})
		base = srv.URL()
	}
	name := dbName(t.Name())
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("pgtest: parse %s: %v", EnvURL, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("pgtest: connect to %s: %v", redact(u), err)
	}
	defer admin.Close(context.Background())
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Errorf("pgtest: drop database %s: connect: %v", name, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	u.Path = "/" + name
	return u.String()
}

// errMissing marks a machine without PostgreSQL binaries.
var errMissing = errors.New("postgresql binaries not found")

func skipOrFail(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, errMissing) {
		t.Skipf("pgtest: SKIPPING: no PostgreSQL to test against: %v; install postgresql (apt-get install postgresql) or set %s", err, EnvURL)
	}
	t.Fatalf("pgtest: start private postgres: %v", err)
}

var unsafeChars = regexp.MustCompile(`[^a-z0-9_]+`)

// dbName turns a test name into a unique, valid database name.
func dbName(test string) string {
	n := counter.Add(1)
	suffix := fmt.Sprintf("_%d_%d", os.Getpid(), n)
	name := "t_" + strings.Trim(unsafeChars.ReplaceAllString(strings.ToLower(test), "_"), "_")
	const max = 63
	if len(name)+len(suffix) > max {
		h := sha256.Sum256([]byte(test))
		tail := "_" + hex.EncodeToString(h[:4])
		name = name[:max-len(suffix)-len(tail)] + tail
	}
	return name + suffix
}

func redact(u *url.URL) string {
	c := *u
	if c.User != nil {
		c.User = url.User(c.User.Username())
	}
	return c.String()
}

// Server is a private PostgreSQL server.
type Server struct {
	dir  string
	port int
	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	err  error // how the process ended
}

// URL returns the URL of the server's "postgres" database, as superuser
// "postgres" over TCP.
func (s *Server) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// SocketDir returns the directory of the server's unix socket.
func (s *Server) SocketDir() string { return filepath.Join(s.dir, "sock") }

// binDir finds a directory holding initdb and postgres.
func binDir() (string, error) {
	var cands []string
	if p, err := exec.LookPath("initdb"); err == nil {
		cands = append(cands, filepath.Dir(p))
	}
	cands = append(cands, "/usr/local/bin", "/usr/local/pgsql/bin")
	vers, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(vers, func(i, j int) bool { return pgVersion(vers[i]) > pgVersion(vers[j]) })
	cands = append(cands, vers...)
	for _, d := range cands {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", fmt.Errorf("%w: looked for initdb and postgres in $PATH, /usr/local/bin, /usr/local/pgsql/bin and /usr/lib/postgresql/*/bin", errMissing)
}

func pgVersion(dir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return v
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// credential returns who the server runs as: the current user, or nobody
// when that is root (postgres refuses to run as root).
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		return nil, fmt.Errorf("running as root and no unprivileged user to run postgres as: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("parse uid/gid of nobody: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

// Start initializes and starts a private server. Stop it with Stop.
func Start() (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "airlock-pgtest-")
	if err != nil {
		return nil, fmt.Errorf("make temp dir: %w", err)
	}
	s := &Server{dir: dir}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(dir)
		}
	}()
	data, sock := filepath.Join(dir, "data"), s.SocketDir()
	if err := os.Mkdir(sock, 0o700); err != nil {
		return nil, fmt.Errorf("make socket dir: %w", err)
	}
	if cred != nil {
		for _, p := range []string{dir, sock} {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return nil, fmt.Errorf("chown %s: %w", p, err)
			}
		}
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres",
		"-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Dir = dir
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	// The port is free when chosen; if another process takes it first the
	// server fails to start and we try another.
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s.port = port
		if lastErr = s.run(bin, data, sock, cred); lastErr == nil {
			ok = true
			return s, nil
		}
	}
	return nil, lastErr
}

func (s *Server) run(bin, data, sock string, cred *syscall.Credential) error {
	logPath := filepath.Join(s.dir, "postgres.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open server log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", data,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "port="+strconv.Itoa(s.port),
		"-c", "unix_socket_directories="+sock,
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
		"-c", "max_connections=200",
		"-c", "log_min_messages=warning",
	)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// Pdeathsig: an immediate shutdown if the test binary dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	done := make(chan struct{})
	s.cmd, s.done = cmd, done
	go func() {
		err := cmd.Wait()
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
		close(done)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := pgx.Connect(ctx, s.URL())
		if err == nil {
			err = c.Ping(ctx)
			c.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("postgres exited while starting: %v\n%s", s.exitErr(), log)
		default:
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-done
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("postgres did not accept connections in 60s: %v\n%s", err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *Server) exitErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Stop shuts the server down (fast shutdown) and removes its files.
func (s *Server) Stop() error {
	var errs []error
	if s.cmd != nil && s.cmd.Process != nil {
		select {
		case <-s.done:
		default:
			if err := s.cmd.Process.Signal(syscall.SIGINT); err != nil {
				errs = append(errs, fmt.Errorf("signal postgres: %w", err))
			}
			select {
			case <-s.done:
			case <-time.After(30 * time.Second):
				s.cmd.Process.Kill()
				<-s.done
				errs = append(errs, errors.New("postgres did not stop in 30s; killed"))
			}
		}
	}
	if err := os.RemoveAll(s.dir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", s.dir, err))
	}
	return errors.Join(errs...)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
