package envd

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/agent"
	"github.com/airlock/airlock/internal/agentapi"
	pb "github.com/airlock/airlock/internal/envdpb/process"
	"github.com/airlock/airlock/internal/envdpb/process/processconnect"
)

// processService implements process.Process over the agent's process table.
type processService struct{ s *Server }

var _ processconnect.ProcessHandler = (*processService)(nil)

func (ps *processService) find(sel *pb.ProcessSelector) (*agent.Proc, error) {
	switch v := sel.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		if p, ok := ps.s.agent.FindPID(int(v.Pid)); ok {
			return p, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", v.Pid))
	case *pb.ProcessSelector_Tag:
		if p, ok := ps.s.agent.FindTag(v.Tag); ok {
			return p, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %q not found", v.Tag))
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process selector (pid or tag) is required"))
	}
}

func (ps *processService) List(ctx context.Context, req *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	var out []*pb.ProcessInfo
	for _, p := range ps.s.agent.Procs() {
		argv := p.Argv()
		cfg := &pb.ProcessConfig{Cmd: argv[0], Args: argv[1:], Envs: p.Env()}
		if cwd := p.Cwd(); cwd != "" {
			cfg.Cwd = &cwd
		}
		info := &pb.ProcessInfo{Config: cfg, Pid: uint32(p.PID())}
		if tag := p.Tag(); tag != "" {
			info.Tag = &tag
		}
		out = append(out, info)
	}
	return connect.NewResponse(&pb.ListResponse{Processes: out}), nil
}

func (ps *processService) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	m := req.Msg
	cfg := m.GetProcess()
	if cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is required"))
	}
	u, err := ps.s.user(req.Header(), "")
	if err != nil {
		return err
	}
	env := ps.s.env()
	if env == nil {
		env = map[string]string{}
	}
	for k, v := range cfg.GetEnvs() {
		env[k] = v
	}
	// The default workdir, else the user's home.
	cwd, err := ps.s.resolve(cfg.GetCwd(), u)
	if err != nil {
		return err
	}
	spec := agent.ExecSpec{
		Argv:  append([]string{cfg.GetCmd()}, cfg.GetArgs()...),
		Env:   env,
		Cwd:   cwd,
		User:  u.Name,
		Stdin: m.Stdin == nil || m.GetStdin(),
		Tag:   m.GetTag(),
		// List reports the envs the caller gave, not the sandbox's.
		ConfigEnv: map[string]string{},
	}
	maps.Copy(spec.ConfigEnv, cfg.GetEnvs())
	if m.Pty != nil {
		spec.PTY = &agent.Winsize{Rows: uint16(m.GetPty().GetSize().GetRows()), Cols: uint16(m.GetPty().GetSize().GetCols())}
	}
	p, err := ps.s.agent.Exec(spec)
	if err != nil {
		return rpcError("start process", err)
	}
	if p.PID() == 0 {
		b := p.Read(0)
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("start process: %s", b.Exit.Error))
	}
	ps.s.log.Debug("envd process started", "pid", p.PID(), "argv", agent.LogArgv(spec.Argv), "user", u.Name)
	send := func(ev *pb.ProcessEvent) error { return stream.Send(&pb.StartResponse{Event: ev}) }
	return streamProcess(ctx, p, 0, keepalive(req.Header()), send)
}

func (ps *processService) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	p, err := ps.find(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	send := func(ev *pb.ProcessEvent) error { return stream.Send(&pb.ConnectResponse{Event: ev}) }
	return streamProcess(ctx, p, p.Offset(), keepalive(req.Header()), send)
}

// streamProcess sends start, then the output from offset with keepalives,
// then end. The process keeps running when the stream ends early.
func streamProcess(ctx context.Context, p *agent.Proc, offset int64, every time.Duration, send func(*pb.ProcessEvent) error) error {
	if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: uint32(p.PID())}}}); err != nil {
		return err
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		b := p.Read(offset)
		for _, c := range b.Chunks {
			d := &pb.ProcessEvent_DataEvent{}
			switch c.Kind {
			case agent.OutputStderr:
				d.Output = &pb.ProcessEvent_DataEvent_Stderr{Stderr: c.Data}
			case agent.OutputPTY:
				d.Output = &pb.ProcessEvent_DataEvent_Pty{Pty: c.Data}
			default:
				d.Output = &pb.ProcessEvent_DataEvent_Stdout{Stdout: c.Data}
			}
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: d}}); err != nil {
				return err
			}
		}
		offset = b.Next
		if b.Done {
			return send(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: endEvent(b.Exit)}})
		}
		if len(b.Chunks) > 0 {
			continue
		}
		select {
		case <-b.Wait:
		case <-tick.C:
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return rpcError("stream process output", ctx.Err())
		}
	}
}

// endEvent describes an exit the way envd (Go's os.ProcessState) does:
// "exit status 3", or "signal: killed" with exit code -1 and exited false.
func endEvent(e agentapi.Exit) *pb.ProcessEvent_EndEvent {
	end := &pb.ProcessEvent_EndEvent{ExitCode: int32(e.ExitCode), Exited: e.Signal == ""}
	if e.Signal != "" {
		name := e.Signal
		if sig := unix.SignalNum("SIG" + e.Signal); sig != 0 {
			name = sig.String()
		}
		end.Status = "signal: " + name
	} else {
		end.Status = fmt.Sprintf("exit status %d", e.ExitCode)
	}
	if e.TimedOut {
		msg := "timed out"
		end.Error = &msg
	}
	if e.Error != "" {
		end.Error = &e.Error
	}
	return end
}

func (ps *processService) Update(ctx context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	p, err := ps.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if req.Msg.Pty != nil {
		if !p.IsPTY() {
			return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no terminal", p.PID()))
		}
		size := req.Msg.GetPty().GetSize()
		if err := p.Resize(agent.Winsize{Rows: uint16(size.GetRows()), Cols: uint16(size.GetCols())}); err != nil {
			return nil, rpcError("resize terminal", err)
		}
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}

func (ps *processService) input(ctx context.Context, p *agent.Proc, in *pb.ProcessInput) error {
	var data []byte
	switch v := in.GetInput().(type) {
	case *pb.ProcessInput_Stdin:
		data = v.Stdin
	case *pb.ProcessInput_Pty:
		if !p.IsPTY() {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no terminal", p.PID()))
		}
		data = v.Pty
	default:
		return connect.NewError(connect.CodeInvalidArgument, errors.New("input (stdin or pty) is required"))
	}
	if err := p.WriteInput(ctx, data); err != nil {
		return rpcError("write input", err)
	}
	return nil
}

func (ps *processService) SendInput(ctx context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	p, err := ps.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := ps.input(ctx, p, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

func (ps *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var p *agent.Proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			found, err := ps.find(ev.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			p = found
		case *pb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("the first message must be start"))
			}
			if err := ps.input(ctx, p, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

func (ps *processService) SendSignal(ctx context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case pb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("unsupported signal %v", req.Msg.GetSignal()))
	}
	p, err := ps.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.Signal(sig); err != nil {
		if errors.Is(err, agent.ErrConflict) { // finished meanwhile
			return nil, connect.NewError(connect.CodeNotFound, err)
		}
		return nil, rpcError("send signal", err)
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

func (ps *processService) CloseStdin(ctx context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	p, err := ps.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if p.IsPTY() {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("a terminal has no stdin to close; send Ctrl-D (0x04) instead"))
	}
	p.CloseStdin()
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}
