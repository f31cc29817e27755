package envd_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os/user"
	"strings"
	"testing"

	"connectrpc.com/connect"

	pb "github.com/airlock/airlock/internal/envdpb/process"
)

// events is what a Start or Connect stream delivered.
type events struct {
	pid            uint32
	stdout, stderr bytes.Buffer
	pty            bytes.Buffer
	keepalives     int
	end            *pb.ProcessEvent_EndEvent
}

// drain reads a process stream to its end; the first event must be start.
func drain(t *testing.T, s *connect.ServerStreamForClient[pb.StartResponse]) *events {
	t.Helper()
	var ev events
	first := true
	for s.Receive() {
		e := s.Msg().GetEvent()
		if first {
			if e.GetStart() == nil {
				t.Fatalf("first event is %v, want start", e)
			}
			ev.pid = e.GetStart().GetPid()
			first = false
			continue
		}
		record(&ev, e)
	}
	if err := s.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if first {
		t.Fatal("stream ended without a start event")
	}
	return &ev
}

func record(ev *events, e *pb.ProcessEvent) {
	switch {
	case e.GetData() != nil:
		d := e.GetData()
		ev.stdout.Write(d.GetStdout())
		ev.stderr.Write(d.GetStderr())
		ev.pty.Write(d.GetPty())
	case e.GetKeepalive() != nil:
		ev.keepalives++
	case e.GetEnd() != nil:
		ev.end = e.GetEnd()
	}
}

func bash(cmd string) *pb.ProcessConfig {
	return &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}}
}

func ptr[T any](v T) *T { return &v }

func forEachTransport(t *testing.T, fn func(t *testing.T, sb *sandbox, c codec)) {
	agentSB := startAgent(t)
	local := startInProcess(t)
	for _, sb := range []*sandbox{agentSB, local} {
		for _, c := range codecs {
			if c.name == "grpc+proto" && !sb.h2 {
				continue // gRPC needs HTTP/2
			}
			t.Run(sb.name+"/"+c.name, func(t *testing.T) { fn(t, sb, c) })
		}
	}
}

func TestStart(t *testing.T) {
	forEachTransport(t, func(t *testing.T, sb *sandbox, c codec) {
		ctx := testCtx(t)
		pc := sb.process(c)
		tests := []struct {
			name           string
			req            *pb.StartRequest
			stdout, stderr string
			code           int32
		}{
			{"stdout stderr exit code", &pb.StartRequest{Process: bash("echo out; echo err >&2; exit 3"), Stdin: ptr(false)},
				"out\n", "err\n", 3},
			{"envs and cwd", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", `echo "$FOO|$(pwd)|$USER"`},
				Envs: map[string]string{"FOO": "bar"}, Cwd: ptr("/tmp")}}, "bar|/tmp|root\n", "", 0},
			{"big output", &pb.StartRequest{Process: bash("head -c 3000000 /dev/zero | tr '\\0' x")},
				strings.Repeat("x", 3000000), "", 0},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				s, err := pc.Start(ctx, asRoot(tt.req))
				if err != nil {
					t.Fatal(err)
				}
				ev := drain(t, s)
				if ev.pid == 0 {
					t.Error("start event has pid 0")
				}
				if ev.stdout.String() != tt.stdout || ev.stderr.String() != tt.stderr {
					t.Errorf("stdout %.80q stderr %q, want %.80q %q", ev.stdout.String(), ev.stderr.String(), tt.stdout, tt.stderr)
				}
				if ev.end == nil || ev.end.GetExitCode() != tt.code || !ev.end.GetExited() || ev.end.GetStatus() == "" {
					t.Errorf("end = %v, want exit code %d, exited", ev.end, tt.code)
				}
			})
		}
	})
}

func TestStartErrors(t *testing.T) {
	sb := startAgent(t)
	ctx := testCtx(t)
	pc := sb.process(codecs[0])
	tests := []struct {
		name string
		req  *connect.Request[pb.StartRequest]
		code connect.Code
	}{
		{"unknown user", func() *connect.Request[pb.StartRequest] {
			r := connect.NewRequest(&pb.StartRequest{Process: bash("true")})
			r.Header().Set("Authorization", "Basic bm8tc3VjaC11c2VyLXh5ejo=") // no-such-user-xyz:
			return r
		}(), connect.CodeUnauthenticated},
		{"no cmd", asRoot(&pb.StartRequest{Process: &pb.ProcessConfig{}}), connect.CodeInvalidArgument},
		{"program not found", asRoot(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/no/such/program"}}), connect.CodeInvalidArgument},
		{"cwd missing", asRoot(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "true", Cwd: ptr("/no/such/dir")}}), connect.CodeInvalidArgument},
	}
	if _, err := user.Lookup("user"); err != nil { // E2B's default user is absent on this host
		tests = append(tests, struct {
			name string
			req  *connect.Request[pb.StartRequest]
			code connect.Code
		}{"default user missing", connect.NewRequest(&pb.StartRequest{Process: bash("true")}), connect.CodeUnauthenticated})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := pc.Start(ctx, tt.req)
			if err == nil {
				for s.Receive() {
				}
				err = s.Err()
			}
			if connect.CodeOf(err) != tt.code {
				t.Fatalf("err = %v, want %v", err, tt.code)
			}
		})
	}
}

func TestBackgroundListSignal(t *testing.T) {
	forEachTransport(t, func(t *testing.T, sb *sandbox, c codec) {
		ctx := testCtx(t)
		pc := sb.process(c)
		for _, sig := range []pb.Signal{pb.Signal_SIGNAL_SIGKILL, pb.Signal_SIGNAL_SIGTERM} {
			t.Run(sig.String(), func(t *testing.T) {
				cfg := bash("sleep 1000")
				cfg.Envs = map[string]string{"K": "V"}
				s, err := pc.Start(ctx, asRoot(&pb.StartRequest{Process: cfg, Tag: ptr("bg-" + sig.String()), Stdin: ptr(false)}))
				if err != nil {
					t.Fatal(err)
				}
				if !s.Receive() || s.Msg().GetEvent().GetStart() == nil {
					t.Fatalf("no start event: %v", s.Err())
				}
				pid := s.Msg().GetEvent().GetStart().GetPid()
				list, err := pc.List(ctx, asRoot(&pb.ListRequest{}))
				if err != nil {
					t.Fatal(err)
				}
				var found *pb.ProcessInfo
				for _, p := range list.Msg.GetProcesses() {
					if p.GetPid() == pid {
						found = p
					}
				}
				if found == nil || found.GetTag() != "bg-"+sig.String() || found.GetConfig().GetCmd() != "/bin/bash" ||
					strings.Join(found.GetConfig().GetArgs(), " ") != "-l -c sleep 1000" || len(found.GetConfig().GetEnvs()) != 1 ||
					found.GetConfig().GetEnvs()["K"] != "V" {
					t.Fatalf("List = %v, want pid %d with tag and config", list.Msg.GetProcesses(), pid)
				}
				if _, err := pc.SendSignal(ctx, asRoot(&pb.SendSignalRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: sig})); err != nil {
					t.Fatal(err)
				}
				var ev events
				for s.Receive() {
					record(&ev, s.Msg().GetEvent())
				}
				if err := s.Err(); err != nil {
					t.Fatal(err)
				}
				want := map[pb.Signal]string{pb.Signal_SIGNAL_SIGKILL: "signal: killed", pb.Signal_SIGNAL_SIGTERM: "signal: terminated"}[sig]
				if ev.end == nil || ev.end.GetExited() || ev.end.GetExitCode() != -1 || ev.end.GetStatus() != want {
					t.Fatalf("end = %v, want %q, exit code -1, not exited", ev.end, want)
				}
				_, err = pc.SendSignal(ctx, asRoot(&pb.SendSignalRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: sig}))
				if connect.CodeOf(err) != connect.CodeNotFound {
					t.Fatalf("signal to an ended process: %v, want not_found", err)
				}
			})
		}
	})
}

func TestStdin(t *testing.T) {
	forEachTransport(t, func(t *testing.T, sb *sandbox, c codec) {
		ctx := testCtx(t)
		pc := sb.process(c)
		s, err := pc.Start(ctx, asRoot(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "cat"}, Stdin: ptr(true)}))
		if err != nil {
			t.Fatal(err)
		}
		if !s.Receive() {
			t.Fatal(s.Err())
		}
		sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: s.Msg().GetEvent().GetStart().GetPid()}}
		if _, err := pc.SendInput(ctx, asRoot(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("hello\n")}}})); err != nil {
			t.Fatal(err)
		}
		var ev events
		for ev.stdout.String() != "hello\n" && s.Receive() {
			record(&ev, s.Msg().GetEvent())
		}
		if ev.stdout.String() != "hello\n" {
			t.Fatalf("stdout %q before the stream ended (%v), want echo of the input", ev.stdout.String(), s.Err())
		}
		if _, err := pc.CloseStdin(ctx, asRoot(&pb.CloseStdinRequest{Process: sel})); err != nil {
			t.Fatal(err)
		}
		for s.Receive() {
			record(&ev, s.Msg().GetEvent())
		}
		if ev.end == nil || ev.end.GetExitCode() != 0 {
			t.Fatalf("end = %v (%v), want exit 0 after CloseStdin", ev.end, s.Err())
		}
		// A process started without stdin refuses input.
		s2, err := pc.Start(ctx, asRoot(&pb.StartRequest{Process: bash("sleep 1000"), Stdin: ptr(false)}))
		if err != nil || !s2.Receive() {
			t.Fatal(err, s2.Err())
		}
		sel2 := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: s2.Msg().GetEvent().GetStart().GetPid()}}
		_, err = pc.SendInput(ctx, asRoot(&pb.SendInputRequest{Process: sel2, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("x")}}}))
		if connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Errorf("SendInput without stdin: %v, want failed_precondition", err)
		}
		if _, err := pc.SendSignal(ctx, asRoot(&pb.SendSignalRequest{Process: sel2, Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
			t.Fatal(err)
		}
		s2.Close()
	})
}

func TestStreamInput(t *testing.T) {
	sb := startAgent(t) // client streaming needs HTTP/2
	ctx := testCtx(t)
	for _, c := range codecs {
		t.Run(c.name, func(t *testing.T) {
			pc := sb.process(c)
			s, err := pc.Start(ctx, asRoot(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "cat"}, Stdin: ptr(true)}))
			if err != nil || !s.Receive() {
				t.Fatal(err, s.Err())
			}
			pid := s.Msg().GetEvent().GetStart().GetPid()
			in := pc.StreamInput(ctx)
			in.RequestHeader().Set("Authorization", "Basic cm9vdDo=")
			msgs := []*pb.StreamInputRequest{
				{Event: &pb.StreamInputRequest_Start{Start: &pb.StreamInputRequest_StartEvent{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}}}},
				{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("one ")}}}}},
				{Event: &pb.StreamInputRequest_Keepalive{Keepalive: &pb.StreamInputRequest_KeepAlive{}}},
				{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("two\n")}}}}},
			}
			for _, m := range msgs {
				if err := in.Send(m); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := in.CloseAndReceive(); err != nil {
				t.Fatal(err)
			}
			var ev events
			for ev.stdout.String() != "one two\n" && s.Receive() {
				record(&ev, s.Msg().GetEvent())
			}
			if ev.stdout.String() != "one two\n" {
				t.Fatalf("stdout %q, want the streamed input in order", ev.stdout.String())
			}
			if _, err := pc.CloseStdin(ctx, asRoot(&pb.CloseStdinRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}})); err != nil {
				t.Fatal(err)
			}
			for s.Receive() {
			}
		})
	}
}

func TestConnect(t *testing.T) {
	forEachTransport(t, func(t *testing.T, sb *sandbox, c codec) {
		ctx := testCtx(t)
		pc := sb.process(c)
		tag := "reattach-" + c.name
		sctx, cancel := context.WithCancel(ctx)
		s, err := pc.Start(sctx, asRoot(&pb.StartRequest{Process: bash(`read x; echo "got $x"; exit 4`), Tag: &tag, Stdin: ptr(true)}))
		if err != nil || !s.Receive() {
			t.Fatal(err, s.Err())
		}
		pid := s.Msg().GetEvent().GetStart().GetPid()
		cancel() // drop the first stream; the process keeps running
		s.Close()
		for _, sel := range []*pb.ProcessSelector{
			{Selector: &pb.ProcessSelector_Tag{Tag: tag}},
			{Selector: &pb.ProcessSelector_Pid{Pid: pid}},
		} {
			cs, err := pc.Connect(ctx, asRoot(&pb.ConnectRequest{Process: sel}))
			if err != nil || !cs.Receive() {
				t.Fatal(err, cs.Err())
			}
			if got := cs.Msg().GetEvent().GetStart().GetPid(); got != pid {
				t.Fatalf("Connect start pid %d, want %d", got, pid)
			}
			if _, ok := sel.GetSelector().(*pb.ProcessSelector_Tag); ok {
				cs.Close() // a second attachment follows
				continue
			}
			if _, err := pc.SendInput(ctx, asRoot(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("hi\n")}}})); err != nil {
				t.Fatal(err)
			}
			var ev events
			for cs.Receive() {
				record(&ev, cs.Msg().GetEvent())
			}
			if ev.stdout.String() != "got hi\n" || ev.end == nil || ev.end.GetExitCode() != 4 {
				t.Fatalf("re-attached stream: stdout %q end %v (%v)", ev.stdout.String(), ev.end, cs.Err())
			}
		}
		_, err = pc.Connect(ctx, asRoot(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: "no-such-tag"}}}))
		if err == nil {
			cs, _ := pc.Connect(ctx, asRoot(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: "no-such-tag"}}}))
			cs.Receive()
			err = cs.Err()
		}
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("Connect to an unknown tag: %v, want not_found", err)
		}
	})
}

func TestPTY(t *testing.T) {
	forEachTransport(t, func(t *testing.T, sb *sandbox, c codec) {
		ctx := testCtx(t)
		pc := sb.process(c)
		s, err := pc.Start(ctx, asRoot(&pb.StartRequest{
			Process: &pb.ProcessConfig{Cmd: "/bin/sh", Envs: map[string]string{"TERM": "xterm-256color", "PS1": "$ "}},
			Pty:     &pb.PTY{Size: &pb.PTY_Size{Rows: 24, Cols: 80}},
		}))
		if err != nil || !s.Receive() {
			t.Fatal(err, s.Err())
		}
		sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: s.Msg().GetEvent().GetStart().GetPid()}}
		var ev events
		send := func(in string) {
			t.Helper()
			if _, err := pc.SendInput(ctx, asRoot(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte(in)}}})); err != nil {
				t.Fatal(err)
			}
		}
		waitFor := func(want string) {
			t.Helper()
			for !strings.Contains(ev.pty.String(), want) {
				if !s.Receive() {
					t.Fatalf("stream ended (%v) before %q; terminal output %q", s.Err(), want, ev.pty.String())
				}
				record(&ev, s.Msg().GetEvent())
			}
		}
		send("echo mark-$((6*7)); stty size\n")
		waitFor("mark-42")
		waitFor("24 80")
		if _, err := pc.Update(ctx, asRoot(&pb.UpdateRequest{Process: sel, Pty: &pb.PTY{Size: &pb.PTY_Size{Rows: 40, Cols: 100}}})); err != nil {
			t.Fatal(err)
		}
		send("stty size\n")
		waitFor("40 100")
		if !strings.Contains(ev.pty.String(), "stty size") {
			t.Errorf("terminal did not echo the input: %q", ev.pty.String())
		}
		_, err = pc.CloseStdin(ctx, asRoot(&pb.CloseStdinRequest{Process: sel}))
		if connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Errorf("CloseStdin on a terminal: %v, want failed_precondition", err)
		}
		send("exit 5\n")
		for s.Receive() {
			record(&ev, s.Msg().GetEvent())
		}
		if ev.end == nil || ev.end.GetExitCode() != 5 {
			t.Fatalf("end = %v (%v), want exit 5", ev.end, s.Err())
		}
		if ev.stdout.Len() != 0 || ev.stderr.Len() != 0 {
			t.Errorf("terminal output leaked into stdout/stderr: %q %q", ev.stdout.String(), ev.stderr.String())
		}
	})
}

// rawStream posts one Connect server-streaming JSON request, the way the E2B
// JS SDK does, and returns the decoded envelopes (the last is end-of-stream).
func rawStream(t *testing.T, sb *sandbox, path string, hdr http.Header, msg any, until func(map[string]any) bool) []map[string]any {
	t.Helper()
	body, _ := json.Marshal(msg)
	var env bytes.Buffer
	env.WriteByte(0)
	_ = binary.Write(&env, binary.BigEndian, uint32(len(body)))
	env.Write(body)
	h := http.Header{"Content-Type": {"application/connect+json"}, "Connect-Protocol-Version": {"1"}}
	for k, v := range hdr {
		h[k] = v
	}
	req, _ := http.NewRequestWithContext(testCtx(t), "POST", sb.base+path, &env)
	req.Header = h
	resp, err := sb.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/connect+json" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST %s = %d %s: %s", path, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	br := bufio.NewReader(resp.Body)
	var out []map[string]any
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatalf("read envelope: %v", err)
		}
		payload := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
		if _, err := io.ReadFull(br, payload); err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(payload, &m); err != nil {
			t.Fatalf("envelope %q: %v", payload, err)
		}
		m["_flags"] = float64(hdr[0])
		out = append(out, m)
		if until != nil && until(m) {
			return out
		}
	}
}

func TestWireJSON(t *testing.T) {
	sb := startAgent(t)
	pc := sb.process(codecs[0])
	ctx := testCtx(t)
	t.Run("sdk run", func(t *testing.T) {
		envs := rawStream(t, sb, "/process.Process/Start", rootHeader(), map[string]any{
			"process": map[string]any{"cmd": "/bin/bash", "args": []string{"-l", "-c", "echo hi; exit 2"}}, "stdin": false}, nil)
		if len(envs) < 3 {
			t.Fatalf("envelopes %v", envs)
		}
		if _, ok := envs[0]["event"].(map[string]any)["start"].(map[string]any)["pid"]; !ok {
			t.Errorf("first envelope %v, want event.start.pid", envs[0])
		}
		var sawData, sawEnd bool
		for _, e := range envs {
			ev, _ := e["event"].(map[string]any)
			if d, ok := ev["data"].(map[string]any); ok && d["stdout"] == "aGkK" { // base64("hi\n")
				sawData = true
			}
			if end, ok := ev["end"].(map[string]any); ok && end["exitCode"] == float64(2) && end["exited"] == true && end["status"] == "exit status 2" {
				sawEnd = true
			}
		}
		last := envs[len(envs)-1]
		if !sawData || !sawEnd || last["_flags"] != float64(2) || last["error"] != nil {
			t.Fatalf("envelopes %v: want data stdout aGkK, end exitCode 2, then a clean end-of-stream", envs)
		}
	})
	t.Run("keepalive", func(t *testing.T) {
		h := rootHeader()
		h.Set("Keepalive-Ping-Interval", "1")
		var pid float64
		envs := rawStream(t, sb, "/process.Process/Start", h, map[string]any{
			"process": map[string]any{"cmd": "cat"}, "stdin": true, "tag": "keepalive"}, func(m map[string]any) bool {
			ev, _ := m["event"].(map[string]any)
			if s, ok := ev["start"].(map[string]any); ok {
				pid, _ = s["pid"].(float64)
			}
			_, ok := ev["keepalive"]
			return ok
		})
		if _, ok := envs[len(envs)-1]["event"].(map[string]any)["keepalive"]; !ok {
			t.Fatalf("no keepalive event: %v", envs)
		}
		_, err := pc.SendSignal(ctx, asRoot(&pb.SendSignalRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: uint32(pid)}}, Signal: pb.Signal_SIGNAL_SIGKILL}))
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Run("connect timeout", func(t *testing.T) {
		h := rootHeader()
		h.Set("Connect-Timeout-Ms", "300")
		envs := rawStream(t, sb, "/process.Process/Start", h, map[string]any{
			"process": map[string]any{"cmd": "/bin/bash", "args": []string{"-l", "-c", "sleep 1000"}}, "tag": "timeout", "stdin": false}, nil)
		last := envs[len(envs)-1]
		e, _ := last["error"].(map[string]any)
		if last["_flags"] != float64(2) || e["code"] != "deadline_exceeded" {
			t.Fatalf("last envelope %v, want end-of-stream with deadline_exceeded", last)
		}
		if _, err := pc.SendSignal(ctx, asRoot(&pb.SendSignalRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: "timeout"}}, Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
			t.Fatalf("the process should outlive the timed-out stream: %v", err)
		}
	})
	t.Run("unary error", func(t *testing.T) {
		resp, body := sb.do(t, "POST", "/process.Process/SendSignal", http.Header{"Content-Type": {"application/json"}, "Authorization": {"Basic cm9vdDo="}},
			strings.NewReader(`{"process":{"pid":999999},"signal":"SIGNAL_SIGKILL"}`))
		var e struct{ Code, Message string }
		_ = json.Unmarshal(body, &e)
		if resp.StatusCode != 404 || e.Code != "not_found" || e.Message == "" {
			t.Fatalf("SendSignal unknown pid = %d %s, want 404 not_found", resp.StatusCode, body)
		}
	})
}
