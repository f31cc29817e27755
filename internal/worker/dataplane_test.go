package worker

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/testenv"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

// hostEnv is a worker with one running sandbox backed by a host agent.
type hostEnv struct {
	srv *fakeServer
	tw  *testWorker
	drv *hostDriver
	sid string
}

const hostSandbox = "sbx-host-0001"

func newHostEnv(t testing.TB) *hostEnv {
	t.Helper()
	testenv.RequireRoot(t, "the host agent runs commands as root via setuid")
	drv := &hostDriver{agentBin: buildAgent(t), dir: t.TempDir(), boxes: map[string]*hostBox{}}
	t.Cleanup(drv.killAll)
	srv := newFakeServer(t)
	tw := startWorker(t, srv, drv, func(string) string { return "/" })
	srv.assign(hostSandbox, "sha256:test", model.StateRunning)
	srv.waitObserved(testContext(t), hostSandbox, model.StateRunning)
	return &hostEnv{srv: srv, tw: tw, drv: drv, sid: hostSandbox}
}

// command returns the attach URL and token for a new command.
func (e *hostEnv) command(t testing.TB, id string, stdin bool, argv ...string) (string, string) {
	t.Helper()
	tok := e.srv.sign(t, token.Claims{SandboxID: e.sid, Scope: token.ScopeCommand, Command: &model.CommandSpec{
		ID: id, SandboxID: e.sid, Argv: argv, User: "root", Cwd: "/", Stdin: stdin,
	}})
	// The server hands out ws:// attach URLs.
	return strings.Replace(sandboxURL(e.tw.w, e.sid), "http://", "ws://", 1) + "/commands/" + id + "/attach", tok
}

// files returns a files client in the form the server's files session hands out.
func (e *hostEnv) files(t testing.TB) *client.FilesClient {
	return &client.FilesClient{URL: sandboxURL(e.tw.w, e.sid) + "/files", Token: e.srv.sign(t, token.Claims{SandboxID: e.sid, Scope: token.ScopeFiles})}
}

func TestDataPlane(t *testing.T) {
	e := newHostEnv(t)

	t.Run("attach stdout stderr exit", func(t *testing.T) {
		ctx := testContext(t)
		u, tok := e.command(t, "c-exit", false, "sh", "-c", "echo out; echo err >&2; echo out2; exit 3")
		var out, errb bytes.Buffer
		exit, err := client.RunCommand(ctx, u, tok, nil, &out, &errb)
		if err != nil {
			t.Fatal(err)
		}
		if exit.ExitCode != 3 || out.String() != "out\nout2\n" || errb.String() != "err\n" {
			t.Fatalf("exit %+v stdout %q stderr %q", exit, out.String(), errb.String())
		}
	})

	t.Run("stdin", func(t *testing.T) {
		ctx := testContext(t)
		u, tok := e.command(t, "c-stdin", true, "sha256sum")
		in := bytes.Repeat([]byte("0123456789abcdef"), 300_000) // ~4.8 MB, several frames
		var out bytes.Buffer
		exit, err := client.RunCommand(ctx, u, tok, bytes.NewReader(in), &out, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("%x  -\n", sha256.Sum256(in))
		if exit.ExitCode != 0 || out.String() != want {
			t.Fatalf("exit %+v stdout %q, want %q", exit, out.String(), want)
		}
	})

	t.Run("stdin never read", func(t *testing.T) {
		// More stdin than pipes hold, to a process that exits without
		// reading it: the attachment still ends (and the worker stops).
		ctx := testContext(t)
		u, tok := e.command(t, "c-noread", true, "sh", "-c", "echo done")
		var out bytes.Buffer
		exit, err := client.RunCommand(ctx, u, tok, bytes.NewReader(make([]byte, 8<<20)), &out, io.Discard)
		if err != nil || exit.ExitCode != 0 || out.String() != "done\n" {
			t.Fatalf("exit %+v stdout %q: %v", exit, out.String(), err)
		}
	})

	t.Run("signal", func(t *testing.T) {
		ctx := testContext(t)
		u, tok := e.command(t, "c-signal", false, "sleep", "1000")
		s, err := client.AttachCommand(ctx, u, tok, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		kind, payload, err := s.Next()
		if err != nil || kind != agentapi.FrameStarted {
			t.Fatalf("first frame %d %q %v, want started", kind, payload, err)
		}
		var info agentapi.ProcessInfo
		if err := json.Unmarshal(payload, &info); err != nil || info.ID != "c-signal" || !info.Running {
			t.Fatalf("started frame %s: %v", payload, err)
		}
		if err := s.Signal("TERM"); err != nil {
			t.Fatal(err)
		}
		exit := nextExit(t, s)
		if exit.Signal != "TERM" || exit.ExitCode != -1 {
			t.Fatalf("exit %+v, want killed by TERM", exit)
		}
		if _, _, err := s.Next(); !errors.Is(err, io.EOF) {
			t.Fatalf("after exit: %v, want EOF", err)
		}
	})

	t.Run("reattach from offset", func(t *testing.T) {
		ctx := testContext(t)
		var want bytes.Buffer
		for i := 1; i <= 50000; i++ {
			fmt.Fprintf(&want, "line %d\n", i)
		}
		u, tok := e.command(t, "c-reattach", false, "sh", "-c", `i=1; while [ $i -le 50000 ]; do echo "line $i"; i=$((i+1)); done`)
		s, err := client.AttachCommand(ctx, u, tok, 0)
		if err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		for got.Len() < 1000 {
			kind, p, err := s.Next()
			if err != nil {
				t.Fatal(err)
			}
			if kind == agentapi.FrameStdout {
				got.Write(p)
			}
			if kind == agentapi.FrameExit {
				t.Fatal("exited before 1000 bytes")
			}
		}
		s.Close() // drop mid-stream
		offset := int64(got.Len())
		s, err = client.AttachCommand(ctx, u, tok, offset)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for {
			kind, p, err := s.Next()
			if err != nil {
				t.Fatal(err)
			}
			if kind == agentapi.FrameStdout {
				got.Write(p)
			}
			if kind == agentapi.FrameExit {
				break
			}
		}
		if !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Fatalf("re-attached output differs: got %d bytes, want %d", got.Len(), want.Len())
		}
	})

	t.Run("detached keeps running and is listed", func(t *testing.T) {
		ctx := testContext(t)
		u, tok := e.command(t, "c-detached", false, "sh", "-c", "echo started; sleep 1000")
		s, err := client.AttachCommand(ctx, u, tok, 0)
		if err != nil {
			t.Fatal(err)
		}
		if kind, _, err := s.Next(); err != nil || kind != agentapi.FrameStarted {
			t.Fatalf("first frame %d: %v", kind, err)
		}
		s.Close() // no client any more
		cmds, err := e.files(t).ListCommands(ctx)
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(cmds, func(p agentapi.ProcessInfo) bool { return p.ID == "c-detached" })
		if i < 0 || !cmds[i].Running {
			t.Fatalf("c-detached not listed as running: %+v", cmds)
		}
		// Re-attach: the retained output is still there; then stop it.
		s, err = client.AttachCommand(ctx, u, tok, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		var out bytes.Buffer
		for out.String() != "started\n" {
			kind, p, err := s.Next()
			if err != nil {
				t.Fatal(err)
			}
			if kind == agentapi.FrameStdout {
				out.Write(p)
			}
		}
		if err := s.Signal("KILL"); err != nil {
			t.Fatal(err)
		}
		if exit := nextExit(t, s); exit.Signal != "KILL" {
			t.Fatalf("exit %+v, want KILL", exit)
		}
	})

	t.Run("tokens", func(t *testing.T) {
		ctx := testContext(t)
		spec := &model.CommandSpec{ID: "c-tok", SandboxID: e.sid, Argv: []string{"true"}, User: "root"}
		other := e.srv.sign(t, token.Claims{SandboxID: "sbx-other-0001", Scope: token.ScopeCommand, Command: spec})
		filesTok := e.srv.sign(t, token.Claims{SandboxID: e.sid, Scope: token.ScopeFiles})
		wrongCmd := e.srv.sign(t, token.Claims{SandboxID: e.sid, Scope: token.ScopeCommand,
			Command: &model.CommandSpec{ID: "c-else", Argv: []string{"true"}}})
		forged, _ := token.Sign(token.NewKey(), token.Claims{SandboxID: e.sid, Scope: token.ScopeFiles, Expires: 1 << 40})
		expired := e.srv.sign(t, token.Claims{SandboxID: e.sid, Scope: token.ScopeFiles, Expires: 1})
		attach := sandboxURL(e.tw.w, e.sid) + "/commands/c-tok/attach"
		for _, tc := range []struct {
			name string
			tok  string
			want error
		}{
			{"another sandbox", other, model.ErrForbidden},
			{"files scope", filesTok, model.ErrForbidden},
			{"another command", wrongCmd, model.ErrForbidden},
			{"forged", forged, model.ErrUnauthorized},
			{"none", "", model.ErrUnauthorized},
		} {
			if _, err := client.AttachCommand(ctx, attach, tc.tok, 0); !errors.Is(err, tc.want) {
				t.Errorf("attach with %s token: %v, want %v", tc.name, err, tc.want)
			}
		}
		for _, tc := range []struct {
			name string
			fc   *client.FilesClient
			want error
		}{
			{"another sandbox", &client.FilesClient{URL: sandboxURL(e.tw.w, e.sid),
				Token: e.srv.sign(t, token.Claims{SandboxID: "sbx-other-0001", Scope: token.ScopeFiles})}, model.ErrForbidden},
			{"command scope", &client.FilesClient{URL: sandboxURL(e.tw.w, e.sid), Token: other}, model.ErrForbidden},
			{"expired", &client.FilesClient{URL: sandboxURL(e.tw.w, e.sid), Token: expired}, model.ErrUnauthorized},
			{"unknown sandbox", &client.FilesClient{URL: e.tw.w.DataPlaneURL(),
				Token: e.srv.sign(t, token.Claims{SandboxID: "sbx-other-0001", Scope: token.ScopeFiles})}, model.ErrNotFound},
		} {
			if _, err := tc.fc.Stat(ctx, "/"); !errors.Is(err, tc.want) {
				t.Errorf("stat with %s: %v, want %v", tc.name, err, tc.want)
			}
		}
		// Raw HTTP: the answer is a JSON error with the status.
		res, err := http.Get(sandboxURL(e.tw.w, e.sid) + "/files/stat?path=/&token=" + other)
		if err != nil {
			t.Fatal(err)
		}
		var body agentapi.Error
		_ = json.NewDecoder(res.Body).Decode(&body)
		res.Body.Close()
		if res.StatusCode != http.StatusForbidden || body.Error.Code != "forbidden" {
			t.Fatalf("raw request: %d %+v", res.StatusCode, body)
		}
	})

	t.Run("files round trip 100 MiB", func(t *testing.T) {
		ctx := testContext(t)
		fc := e.files(t)
		dir := t.TempDir()
		const size = 100 << 20
		src := io.LimitReader(rand.NewChaCha8([32]byte{7}), size)
		h := sha256.New()
		fi, err := fc.Write(ctx, filepath.Join(dir, "sub", "big.bin"), io.TeeReader(src, h), "0600", "root")
		if err != nil {
			t.Fatal(err)
		}
		want := h.Sum(nil)
		if fi.Size != size || fi.Mode != "0600" {
			t.Fatalf("written file info %+v", fi)
		}
		rc, err := fc.Read(ctx, filepath.Join(dir, "sub", "big.bin"))
		if err != nil {
			t.Fatal(err)
		}
		h.Reset()
		n, err := io.Copy(h, rc)
		rc.Close()
		if err != nil || n != size || !bytes.Equal(h.Sum(nil), want) {
			t.Fatalf("read back %d bytes (err %v), sha256 equal %v", n, err, bytes.Equal(h.Sum(nil), want))
		}
	})

	t.Run("file operations and errors", func(t *testing.T) {
		ctx := testContext(t)
		fc := e.files(t)
		dir := t.TempDir()
		if _, err := fc.Mkdir(ctx, dir+"/a/b", "0750", "root"); err != nil {
			t.Fatal(err)
		}
		if _, err := fc.Write(ctx, dir+"/a/b/f.txt", strings.NewReader("hello"), "", "root"); err != nil {
			t.Fatal(err)
		}
		// From an *os.File at an offset: only the rest is sent, with a length.
		local := filepath.Join(t.TempDir(), "local")
		if err := os.WriteFile(local, []byte("hello world"), 0o644); err != nil {
			t.Fatal(err)
		}
		lf, err := os.Open(local)
		if err != nil {
			t.Fatal(err)
		}
		defer lf.Close()
		lf.Seek(6, io.SeekStart)
		if fi, err := fc.Write(ctx, dir+"/a/w.txt", lf, "", "root"); err != nil || fi.Size != 5 {
			t.Fatalf("write from file: %+v %v", fi, err)
		}
		if b, err := os.ReadFile(dir + "/a/w.txt"); err != nil || string(b) != "world" {
			t.Fatalf("written from file: %q %v", b, err)
		}
		if err := fc.Remove(ctx, dir+"/a/w.txt", false); err != nil {
			t.Fatal(err)
		}
		if _, err := fc.Move(ctx, dir+"/a/b/f.txt", dir+"/a/g.txt"); err != nil {
			t.Fatal(err)
		}
		es, err := fc.List(ctx, dir+"/a")
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range es {
			names = append(names, e.Name+":"+e.Type)
		}
		slices.Sort(names)
		if strings.Join(names, ",") != "b:dir,g.txt:file" {
			t.Fatalf("list: %v", names)
		}
		st, err := fc.Stat(ctx, dir+"/a/g.txt")
		if err != nil || st.Size != 5 || st.Type != "file" {
			t.Fatalf("stat %+v %v", st, err)
		}
		for _, tc := range []struct {
			name string
			do   func() error
			want error
		}{
			{"stat missing", func() error { _, err := fc.Stat(ctx, dir+"/nope"); return err }, model.ErrNotFound},
			{"read missing", func() error { _, err := fc.Read(ctx, dir+"/nope"); return err }, model.ErrNotFound},
			{"list missing", func() error { _, err := fc.List(ctx, dir+"/nope"); return err }, model.ErrNotFound},
			{"move missing", func() error { _, err := fc.Move(ctx, dir+"/nope", dir+"/x"); return err }, model.ErrNotFound},
			{"empty path", func() error { _, err := fc.Stat(ctx, ""); return err }, model.ErrInvalid},
		} {
			if err := tc.do(); !errors.Is(err, tc.want) {
				t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
			}
		}
		if err := fc.Remove(ctx, dir+"/a", false); err == nil {
			t.Error("non-recursive remove of a non-empty dir succeeded")
		}
		if err := fc.Remove(ctx, dir+"/a", true); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(dir + "/a"); !os.IsNotExist(err) {
			t.Fatalf("dir still there after recursive remove: %v", err)
		}
	})
}

func nextExit(t testing.TB, s *client.CommandSession) agentapi.Exit {
	t.Helper()
	for {
		kind, p, err := s.Next()
		if err != nil {
			t.Fatalf("waiting for exit: %v", err)
		}
		if kind == agentapi.FrameExit {
			var x agentapi.Exit
			if err := json.Unmarshal(p, &x); err != nil {
				t.Fatal(err)
			}
			return x
		}
	}
}

// TestWorkerLifecycleHost drives the reconcile loop over the host harness:
// start, failure without a template, delete, and deletion of what is not
// assigned.
func TestWorkerLifecycleHost(t *testing.T) {
	testenv.RequireRoot(t, "the host agent runs commands as root via setuid")
	ctx := testContext(t)
	drv := &hostDriver{agentBin: buildAgent(t), dir: t.TempDir(), boxes: map[string]*hostBox{}}
	t.Cleanup(drv.killAll)
	srv := newFakeServer(t)
	rootfs := func(d string) string {
		if d == "sha256:test" {
			return "/"
		}
		return ""
	}
	tw := startWorker(t, srv, drv, rootfs)

	srv.assign("sbx-life-0001", "sha256:test", model.StateRunning)
	srv.assign("sbx-life-0002", "sha256:missing", model.StateRunning)
	srv.waitObserved(ctx, "sbx-life-0001", model.StateRunning)
	o := srv.waitObserved(ctx, "sbx-life-0002", model.StateFailed)
	if !strings.Contains(o.Reason, "not present") {
		t.Errorf("failure reason %q", o.Reason)
	}
	if ids, _ := drv.List(ctx); slices.Contains(ids, "sbx-life-0002") {
		t.Error("failed sandbox left in the runtime")
	}

	srv.assign("sbx-life-0001", "sha256:test", model.StateDeleted)
	srv.waitObserved(ctx, "sbx-life-0001", model.StateDeleted)
	if ids, _ := drv.List(ctx); slices.Contains(ids, "sbx-life-0001") {
		t.Error("deleted sandbox still in the runtime")
	}

	// A runtime death is reported as failed.
	srv.assign("sbx-life-0003", "sha256:test", model.StateRunning)
	srv.waitObserved(ctx, "sbx-life-0003", model.StateRunning)
	drv.mu.Lock()
	b := drv.boxes["sbx-life-0003"]
	drv.mu.Unlock()
	_ = b.cmd.Process.Kill()
	o = srv.waitObserved(ctx, "sbx-life-0003", model.StateFailed)
	if o.Reason != "sandbox runtime exited" {
		t.Errorf("reason %q", o.Reason)
	}

	// Restart: a sandbox the server no longer assigns is deleted.
	srv.assign("sbx-life-0004", "sha256:test", model.StateRunning)
	srv.waitObserved(ctx, "sbx-life-0004", model.StateRunning)
	tw.stop(t)
	if ids, _ := drv.List(ctx); !slices.Contains(ids, "sbx-life-0004") {
		t.Fatal("stopping the worker deleted a running sandbox")
	}
	srv.Unassign("sbx-life-0004")
	tw2 := startWorker(t, srv, drv, rootfs)
	srv.waitObserved(ctx, "sbx-life-0004", model.StateDeleted)
	if ids, _ := drv.List(ctx); slices.Contains(ids, "sbx-life-0004") {
		t.Error("unassigned sandbox not deleted after restart")
	}
	// The dead one (0003) could not be adopted: removed from the runtime
	// and reported failed, not restarted.
	o = srv.waitObserved(ctx, "sbx-life-0003", model.StateFailed)
	if !strings.Contains(o.Reason, "adopted") {
		t.Errorf("reason after restart %q", o.Reason)
	}
	if ids, _ := drv.List(ctx); slices.Contains(ids, "sbx-life-0003") {
		t.Error("unadoptable sandbox left in the runtime")
	}

	// A running sandbox lost while no worker ran (say, a reboot) is reported
	// gone, not started again empty.
	srv.assign("sbx-life-0006", "sha256:test", model.StateRunning)
	srv.waitObserved(ctx, "sbx-life-0006", model.StateRunning)
	tw2.stop(t)
	if err := drv.Delete(ctx, "sbx-life-0006"); err != nil {
		t.Fatal(err)
	}
	tw3 := startWorker(t, srv, drv, rootfs)
	srv.waitObserved(ctx, "sbx-life-0006", model.StateDeleted)
	if ids, _ := drv.List(ctx); slices.Contains(ids, "sbx-life-0006") {
		t.Error("a lost sandbox was started again")
	}

	// A create the worker died in: the runtime holds a half-made sandbox
	// that cannot be adopted, and the server never saw it run (still
	// starting). It is created again, not failed: nothing in it was lost.
	srv.assign("sbx-life-0007", "sha256:test", model.StateRunning)
	srv.waitObserved(ctx, "sbx-life-0007", model.StateRunning)
	tw3.stop(t)
	drv.mu.Lock()
	_ = drv.boxes["sbx-life-0007"].cmd.Process.Kill()
	drv.mu.Unlock()
	srv.Update("sbx-life-0007", func(a *workerapi.Assignment) { a.Sandbox.State = model.StateStarting })
	var before int // the states reported before the restart
	srv.waitFor(ctx, "sbx-life-0007", func(_ workerapi.Observed, hist []model.SandboxState) bool {
		before = len(hist)
		return true
	})
	startWorker(t, srv, drv, rootfs)
	var h []model.SandboxState
	srv.waitFor(ctx, "sbx-life-0007", func(_ workerapi.Observed, hist []model.SandboxState) bool {
		h = hist[before:]
		return slices.Contains(h, model.StateFailed) || slices.Contains(h, model.StateRunning)
	})
	t.Logf("states of the interrupted create after the restart: %v", h)
	if slices.Contains(h, model.StateFailed) {
		t.Errorf("a create interrupted by a worker restart was failed on the way (states %v)", h)
	}

	// Deleted while (or right after) starting: ends deleted, nothing left.
	srv.assign("sbx-life-0005", "sha256:test", model.StateRunning)
	srv.assign("sbx-life-0005", "sha256:test", model.StateDeleted)
	srv.waitObserved(ctx, "sbx-life-0005", model.StateDeleted)
	if ids, _ := drv.List(ctx); slices.Contains(ids, "sbx-life-0005") {
		t.Error("sandbox deleted during start left in the runtime")
	}
}

// cuttingProxy forwards TCP to target and cuts the first cuts connections
// after more than after bytes came back from the target.
type cuttingProxy struct {
	ln     net.Listener
	target string
	after  int64
	mu     sync.Mutex
	cuts   int
	done   int
}

func newCuttingProxy(t testing.TB, target string, cuts int, after int64) *cuttingProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cuttingProxy{ln: ln, target: target, after: after, cuts: cuts}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *cuttingProxy) serve(c net.Conn) {
	defer c.Close()
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer u.Close()
	p.mu.Lock()
	cut := p.done < p.cuts
	if cut {
		p.done++
	}
	p.mu.Unlock()
	go func() { _, _ = io.Copy(u, c); u.Close() }()
	if !cut {
		_, _ = io.Copy(c, u)
		return
	}
	_, _ = io.Copy(c, io.LimitReader(u, p.after))
}

func TestRunCommandReattaches(t *testing.T) {
	e := newHostEnv(t)
	ctx := testContext(t)
	var want bytes.Buffer
	for i := 1; i <= 50000; i++ {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	target := strings.TrimPrefix(e.tw.w.DataPlaneURL(), "http://")
	proxy := newCuttingProxy(t, target, 2, 100_000)
	_, tok := e.command(t, "c-cut", false, "sh", "-c", `i=1; while [ $i -le 50000 ]; do echo "line $i"; i=$((i+1)); done; echo bye >&2`)
	u := "http://" + proxy.ln.Addr().String() + "/v1/sandboxes/" + e.sid + "/commands/c-cut/attach"
	var out, errb bytes.Buffer
	exit, err := client.RunCommand(ctx, u, tok, nil, &out, &errb)
	if err != nil {
		t.Fatal(err)
	}
	proxy.mu.Lock()
	cuts := proxy.done
	proxy.mu.Unlock()
	if cuts != 2 {
		t.Fatalf("proxy cut %d connections, want 2", cuts)
	}
	if exit.ExitCode != 0 || !bytes.Equal(out.Bytes(), want.Bytes()) || errb.String() != "bye\n" {
		t.Fatalf("exit %+v, stdout %d bytes (want %d, equal %v), stderr %q", exit, out.Len(), want.Len(),
			bytes.Equal(out.Bytes(), want.Bytes()), errb.String())
	}
}

// BenchmarkFiles64MiB measures data-plane file throughput over the host
// agent harness: MB/s of one 64 MiB write, and of one 64 MiB read.
func BenchmarkFiles64MiB(b *testing.B) {
	e := newHostEnv(b)
	fc := e.files(b)
	ctx := testContext(b)
	const size = 64 << 20
	path := filepath.Join(b.TempDir(), "bench.bin")
	b.Run("write", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			if _, err := fc.Write(ctx, path, io.LimitReader(rand.NewChaCha8([32]byte{1}), size), "", "root"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("read", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			rc, err := fc.Read(ctx, path)
			if err != nil {
				b.Fatal(err)
			}
			n, err := io.Copy(io.Discard, rc)
			rc.Close()
			if err != nil || n != size {
				b.Fatalf("read %d bytes: %v", n, err)
			}
		}
	})
}
