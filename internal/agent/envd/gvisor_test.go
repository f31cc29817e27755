package envd_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/textproto"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	fspb "github.com/airlock/airlock/internal/envdpb/filesystem"
	pb "github.com/airlock/airlock/internal/envdpb/process"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/gvisor"
	"github.com/airlock/airlock/internal/runtime/runtimetest"
	"github.com/airlock/airlock/internal/setup"
	"github.com/airlock/airlock/internal/testenv"
)

// testCacheDir holds runsc and templates between test runs (shared with
// the runtime and setup tests).
const testCacheDir = "/var/tmp/airlock-test-cache"

type tLog struct{ t testing.TB }

func (w tLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// startGVisor runs a sandbox from the base template with the gVisor driver
// and returns its envd endpoint over the agent channel.
func startGVisor(t *testing.T) *sandbox {
	t.Helper()
	testenv.RequireRunsc(t)
	bin := buildAgent(t)
	ctx := context.Background()
	runsc, err := setup.EnsureRunsc(ctx, testCacheDir, tLog{t})
	if err != nil {
		t.Skipf("needs runsc (set %s or install Go to build it): %v", setup.RunscEnv, err)
	}
	_, rootfs, err := setup.EnsureDebianTemplate(ctx, testCacheDir, bin, tLog{t})
	if err != nil {
		t.Fatalf("base template: %v", err)
	}
	base := t.TempDir()
	state := filepath.Join(base, "state")
	t.Cleanup(func() { syscall.Unmount(filepath.Join(state, "null-netns"), syscall.MNT_DETACH) })
	d, err := gvisor.New(gvisor.Config{RunscPath: runsc, StateDir: state, RunDir: filepath.Join(base, "run"), CgroupParent: "/airlock-test"})
	if err != nil {
		t.Fatal(err)
	}
	id := runtimetest.NewID()
	sbx, err := d.Start(ctx, runtime.Spec{ID: id, RootFS: rootfs, VCPUs: 1, MemoryMiB: 512, Hostname: "sandbox"})
	if err != nil {
		t.Fatal(err)
	}
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return sbx.AgentConn(ctx) }}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		sbx.Close()
		if err := d.Delete(context.Background(), id); err != nil {
			t.Errorf("delete sandbox: %v", err)
		}
	})
	sb := &sandbox{name: "gvisor", hc: &http.Client{Transport: tr}, root: "http://agent", base: "http://agent/envd", h2: true}
	hctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(hctx, "GET", sb.base+"/health", nil)
		resp, err := sb.hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent {
				return sb
			}
		}
		if hctx.Err() != nil {
			t.Fatalf("envd in the sandbox not healthy: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestInGVisor drives envd the way the E2B SDK does (no user: the
// template's default user "user") inside a real gVisor sandbox.
func TestInGVisor(t *testing.T) {
	sb := startGVisor(t)
	ctx := testCtx(t)
	json := codecs[0]
	pc, fc := sb.process(json), sb.files(json)

	if resp, out := sb.do(t, "POST", "/init", nil, strings.NewReader(`{"envVars":{"SBX":"yes"}}`)); resp.StatusCode != 204 {
		t.Fatalf("init = %d %s", resp.StatusCode, out)
	}
	t.Run("run as the default user", func(t *testing.T) {
		s, err := pc.Start(ctx, connectReq(&pb.StartRequest{Process: bash(`echo "$HOME $(id -un) $(pwd) $SBX"; echo e >&2; exit 2`), Stdin: ptr(false)}))
		if err != nil {
			t.Fatal(err)
		}
		ev := drain(t, s)
		if ev.stdout.String() != "/home/user user /home/user yes\n" || ev.stderr.String() != "e\n" || ev.end.GetExitCode() != 2 {
			t.Fatalf("stdout %q stderr %q end %v", ev.stdout.String(), ev.stderr.String(), ev.end)
		}
	})
	t.Run("pty", func(t *testing.T) {
		s, err := pc.Start(ctx, connectReq(&pb.StartRequest{
			Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-i", "-l"}, Envs: map[string]string{"TERM": "xterm-256color"}},
			Pty:     &pb.PTY{Size: &pb.PTY_Size{Rows: 24, Cols: 80}},
		}))
		if err != nil || !s.Receive() {
			t.Fatal(err, s.Err())
		}
		sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: s.Msg().GetEvent().GetStart().GetPid()}}
		var ev events
		send := func(in string) {
			if _, err := pc.SendInput(ctx, connectReq(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte(in)}}})); err != nil {
				t.Fatal(err)
			}
		}
		waitFor := func(want string) {
			for !strings.Contains(ev.pty.String(), want) {
				if !s.Receive() {
					t.Fatalf("stream ended (%v) before %q: %q", s.Err(), want, ev.pty.String())
				}
				record(&ev, s.Msg().GetEvent())
			}
		}
		send("echo mark-$((6*7)) $(id -un); stty size\n")
		waitFor("mark-42 user")
		waitFor("24 80")
		if _, err := pc.Update(ctx, connectReq(&pb.UpdateRequest{Process: sel, Pty: &pb.PTY{Size: &pb.PTY_Size{Rows: 50, Cols: 132}}})); err != nil {
			t.Fatal(err)
		}
		// The new size is set when Update answers, but gVisor's terminal
		// can hand a shell that reads it at once the old one (seen once in
		// CI); ask again, a bounded number of times, until it shows.
		for i := 0; !strings.Contains(ev.pty.String(), "50 132"); i++ {
			if i == 20 {
				t.Fatalf("the terminal never reported 50 132 after Update: %q", ev.pty.String())
			}
			send(fmt.Sprintf("stty size; echo asked-$((%d+1000))\n", i))
			waitFor(fmt.Sprintf("asked-%d", i+1000))
		}
		send("exit 3\n")
		for s.Receive() {
			record(&ev, s.Msg().GetEvent())
		}
		if ev.end.GetExitCode() != 3 {
			t.Fatalf("end %v (%v)", ev.end, s.Err())
		}
	})
	t.Run("files owned by the user and watched", func(t *testing.T) {
		w, err := fc.WatchDir(ctx, connectReq(&fspb.WatchDirRequest{Path: "/home/user", Recursive: true}))
		if err != nil || !w.Receive() || w.Msg().GetStart() == nil {
			t.Fatal(err, w.Err())
		}
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		for _, name := range []string{"up/a.txt", "/home/user/up/b.txt"} {
			h := textproto.MIMEHeader{}
			h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename=%q`, name))
			pw, _ := mw.CreatePart(h)
			_, _ = pw.Write([]byte("content of " + name))
		}
		mw.Close()
		resp, out := sb.do(t, "POST", "/files", http.Header{"Content-Type": {mw.FormDataContentType()}, "X-Metadata-Kind": {"upload"}}, &body)
		if resp.StatusCode != 200 || !strings.Contains(string(out), `"/home/user/up/a.txt"`) {
			t.Fatalf("upload = %d %s", resp.StatusCode, out)
		}
		st, err := fc.Stat(ctx, connectReq(&fspb.StatRequest{Path: "up/a.txt"}))
		if err != nil || st.Msg.GetEntry().GetOwner() != "user" || st.Msg.GetEntry().GetGroup() != "user" {
			t.Fatalf("stat = %v, %v; want owned by user", st, err)
		}
		if st.Msg.GetEntry().GetMetadata()["kind"] != "upload" {
			t.Errorf("metadata in the sandbox = %v, want kind upload", st.Msg.GetEntry().GetMetadata())
		}
		if dir, err := fc.Stat(ctx, connectReq(&fspb.StatRequest{Path: "up"})); err != nil || dir.Msg.GetEntry().GetOwner() != "user" {
			t.Fatalf("created parent = %v, %v; want owned by user", dir, err)
		}
		for {
			if !w.Receive() {
				t.Fatalf("watch ended: %v", w.Err())
			}
			if ev := w.Msg().GetFilesystem(); ev.GetName() == "up/b.txt" && ev.GetType() == fspb.EventType_EVENT_TYPE_CREATE {
				break
			}
		}
		resp, out = sb.do(t, "GET", "/files?path=up/b.txt", nil, nil)
		if resp.StatusCode != 200 || string(out) != "content of /home/user/up/b.txt" {
			t.Fatalf("download = %d %q", resp.StatusCode, out)
		}
	})
	t.Run("ports", func(t *testing.T) {
		s, err := pc.Start(ctx, connectReq(&pb.StartRequest{Process: bash("mkdir -p site && echo served > site/i.txt && cd site && exec python3 -m http.server 8000"), Stdin: ptr(false)}))
		if err != nil || !s.Receive() {
			t.Fatal(err, s.Err())
		}
		pid := s.Msg().GetEvent().GetStart().GetPid()
		defer pc.SendSignal(ctx, connectReq(&pb.SendSignalRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: pb.Signal_SIGNAL_SIGKILL}))
		var body string
		for body != "served\n" {
			if ctx.Err() != nil {
				t.Fatalf("web server in the sandbox not reachable; last answer %q", body)
			}
			req, _ := http.NewRequestWithContext(ctx, "GET", sb.root+"/ports/8000/i.txt", nil)
			if resp, err := sb.hc.Do(req); err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				body = string(b)
			}
			time.Sleep(100 * time.Millisecond)
		}
		pr, pw := io.Pipe()
		req, _ := http.NewRequestWithContext(ctx, "CONNECT", sb.root, pr)
		req.Host = "127.0.0.1:8000"
		resp, err := sb.hc.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("CONNECT = %v, %v", resp, err)
		}
		defer resp.Body.Close()
		fmt.Fprintf(pw, "GET /i.txt HTTP/1.0\r\nHost: x\r\n\r\n")
		got, err := http.ReadResponse(bufio.NewReader(resp.Body), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(got.Body)
		if got.StatusCode != 200 || string(b) != "served\n" {
			t.Fatalf("through the tunnel: %d %q", got.StatusCode, b)
		}
		pw.Close()
	})
	t.Run("upgrade through a tunnel", func(t *testing.T) {
		// An HTTP/1.1 upgrade server like a WebSocket one: 101, then echo lines.
		script := strings.Join([]string{
			"import http.server",
			"class H(http.server.BaseHTTPRequestHandler):",
			"    protocol_version = 'HTTP/1.1'",
			"    def do_GET(self):",
			"        self.send_response(101)",
			"        self.send_header('Upgrade', 'echo')",
			"        self.send_header('Connection', 'Upgrade')",
			"        self.end_headers()",
			"        self.wfile.flush()",
			"        while True:",
			"            line = self.rfile.readline()",
			"            if not line:",
			"                break",
			"            self.wfile.write(b'echo:' + line)",
			"            self.wfile.flush()",
			"http.server.HTTPServer(('127.0.0.1', 8001), H).serve_forever()",
		}, "\n")
		s, err := pc.Start(ctx, connectReq(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "python3", Args: []string{"-c", script}}, Stdin: ptr(false)}))
		if err != nil || !s.Receive() {
			t.Fatal(err, s.Err())
		}
		pid := s.Msg().GetEvent().GetStart().GetPid()
		defer pc.SendSignal(ctx, connectReq(&pb.SendSignalRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: pb.Signal_SIGNAL_SIGKILL}))
		for {
			pr, pw := io.Pipe()
			req, _ := http.NewRequestWithContext(ctx, "CONNECT", sb.root, pr)
			req.Host = "127.0.0.1:8001"
			resp, err := sb.hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 200 { // not listening yet
				resp.Body.Close()
				pw.Close()
				if ctx.Err() != nil {
					t.Fatal("the upgrade server never listened")
				}
				time.Sleep(100 * time.Millisecond)
				continue
			}
			br := bufio.NewReader(resp.Body)
			fmt.Fprintf(pw, "GET /chat HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
			up, err := http.ReadResponse(br, nil)
			if err != nil || up.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("upgrade: %v %v", up, err)
			}
			fmt.Fprintf(pw, "ping\n")
			line, err := br.ReadString('\n')
			if err != nil || line != "echo:ping\n" {
				t.Fatalf("echo = %q, %v", line, err)
			}
			pw.Close()
			resp.Body.Close()
			return
		}
	})
	t.Run("metrics", func(t *testing.T) {
		resp, out := sb.do(t, "GET", "/metrics", nil, nil)
		if resp.StatusCode != 200 || !strings.Contains(string(out), `"mem_total":`) {
			t.Fatalf("metrics = %d %s", resp.StatusCode, out)
		}
	})
}
