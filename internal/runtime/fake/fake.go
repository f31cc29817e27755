// Package fake is an in-memory runtime driver for tests that must run
// without root, runsc or QEMU (the worker's, the controller's, e2e smoke
// tests): Driver, Pauser, Snapshotter and Describer, passing
// runtimetest.Run with Options.Simulated like gvisor and qemu pass it for
// real.
//
// A sandbox is a record in the driver's memory (its programs run as
// goroutines): its guest is an overlay filesystem (the template's RootFS, read only through os.Root,
// under an in-memory writable layer; /proc/meminfo tells the sandbox's
// memory), a hostname and a process table. AgentConn returns one end of a
// net.Pipe whose other end is served, in process, by an HTTP/2 (h2c)
// server speaking the agentapi contract: health, processes with framed
// output, signals, and the file API.
//
// What differs from the real agent (internal/agent), on purpose: processes
// are the fake's built-in programs (sh.go: echo, cat, a shell without
// loops, …), not Linux programs, so nothing runs on the host and nothing
// needs root; stdin is read and dropped; only root and the default user
// exist; envd and the port proxy answer 404. Pause holds every agent
// request and every shell command until Resume. A checkpoint is the guest
// written as one JSON file (its writable layer, hostname and finished
// processes; a running process does not survive a restore, it is reported
// killed); a restore reads it into a new sandbox over the spec's RootFS.
// Delete forgets the sandbox and closes its connections; the driver owns
// no host resource, so a worker crash leaves nothing behind — and Adopt
// works only within the process that started the sandbox.
package fake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/runtime"
)

// Name is the driver name reported to the control plane.
const Name = "fake"

// Info is what the fake declares: pause, suspend and wake, checkpoints
// that leave the sandbox running, restores under new ids; no network.
var Info = runtime.Info{Name: Name, Caps: runtime.Caps{Pause: true, Snapshot: true, LeaveRunning: true, Fork: true}}

// agentPath is where a template has its agent: a root without one does not
// start, as with the real runtimes.
const agentPath = "usr/local/bin/airlock-agent"

// checkpointFile is the one file of a fake checkpoint.
const checkpointFile = "fake-checkpoint.json"

// checkpointMagic marks a fake checkpoint.
const checkpointMagic = "airlock-fake-checkpoint/1"

// Driver is the fake runtime. Its zero value is not usable: use New.
type Driver struct {
	log   *slog.Logger
	mu    sync.Mutex
	boxes map[string]*box
}

// New returns an empty fake runtime (log may be nil).
func New(log *slog.Logger) *Driver {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Driver{log: log, boxes: map[string]*box{}}
}

var (
	_ runtime.Driver      = (*Driver)(nil)
	_ runtime.Pauser      = (*Driver)(nil)
	_ runtime.Snapshotter = (*Driver)(nil)
	_ runtime.Describer   = (*Driver)(nil)
	_ runtime.Sandbox     = (*handle)(nil)
)

// box is one sandbox.
type box struct {
	id     string
	spec   runtime.Spec
	g      *guest
	status runtime.Status
	srv    *http.Server
	ln     *pipeListener
}

func (d *Driver) Name() string                          { return Name }
func (d *Driver) Describe(context.Context) runtime.Info { return Info }

// openRoot checks the template root has an executable agent and opens it.
func openRoot(dir string) (*os.Root, error) {
	fi, err := os.Stat(filepath.Join(dir, agentPath))
	if err != nil {
		return nil, fmt.Errorf("fake: root %s has no agent: %w", dir, err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return nil, fmt.Errorf("fake: root %s: %s is not an executable file", dir, agentPath)
	}
	b, err := os.ReadFile(filepath.Join(dir, agentPath))
	if err != nil || len(b) < 4 || (string(b[:4]) != "\x7fELF" && string(b[:2]) != "#!") {
		return nil, fmt.Errorf("fake: root %s: %s is not a program", dir, agentPath)
	}
	return os.OpenRoot(dir)
}

func meminfo(spec runtime.Spec) string {
	return fmt.Sprintf("MemTotal:       %d kB\nMemFree:        %d kB\n", spec.MemoryMiB*1024, spec.MemoryMiB*1024*3/4)
}

func (d *Driver) Start(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	root, err := openRoot(spec.RootFS)
	if err != nil {
		return nil, err
	}
	fsys := &guestFS{lower: root, upper: map[string]*node{}, gone: map[string]bool{}, meminfo: meminfo(spec)}
	return d.add(spec, newGuest(fsys, hostname(spec), 2))
}

func hostname(spec runtime.Spec) string {
	if spec.Hostname != "" {
		return spec.Hostname
	}
	return spec.ID
}

// add registers a sandbox running guest g.
func (d *Driver) add(spec runtime.Spec, g *guest) (runtime.Sandbox, error) {
	if spec.ID == "" {
		return nil, errors.New("fake: a sandbox needs an id")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.boxes[spec.ID]; ok {
		return nil, fmt.Errorf("fake: sandbox %s exists", spec.ID)
	}
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	b := &box{id: spec.ID, spec: spec, g: g, status: runtime.StatusRunning, ln: newPipeListener(),
		srv: &http.Server{Handler: g.handler(), Protocols: &p, ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelDebug)}}
	go b.srv.Serve(b.ln)
	d.boxes[spec.ID] = b
	d.log.Info("fake sandbox started", "id", spec.ID)
	return &handle{d: d, id: spec.ID, closed: make(chan struct{})}, nil
}

func (d *Driver) get(id string) (*box, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.boxes[id]
	if !ok {
		return nil, fmt.Errorf("fake: sandbox %s: %w", id, runtime.ErrNotFound)
	}
	return b, nil
}

func (d *Driver) Adopt(ctx context.Context, id string) (runtime.Sandbox, error) {
	if _, err := d.get(id); err != nil {
		return nil, err
	}
	return &handle{d: d, id: id, closed: make(chan struct{})}, nil
}

// Delete stops the guest, closes its connections and forgets it.
func (d *Driver) Delete(ctx context.Context, id string) error {
	d.mu.Lock()
	b, ok := d.boxes[id]
	delete(d.boxes, id)
	d.mu.Unlock()
	if !ok {
		return nil
	}
	b.g.stop()
	b.ln.Close()
	b.srv.Close()
	d.log.Info("fake sandbox deleted", "id", id)
	return nil
}

func (d *Driver) List(context.Context) ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ids := make([]string, 0, len(d.boxes))
	for id := range d.boxes {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

func (d *Driver) Status(_ context.Context, id string) (runtime.Status, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.boxes[id]
	if !ok {
		return runtime.StatusGone, nil
	}
	return b.status, nil
}

func (d *Driver) setStatus(id string, from []runtime.Status, to runtime.Status) (*box, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.boxes[id]
	if !ok {
		return nil, fmt.Errorf("fake: sandbox %s: %w", id, runtime.ErrNotFound)
	}
	if !slices.Contains(from, b.status) {
		return nil, fmt.Errorf("fake: sandbox %s is %s", id, b.status)
	}
	b.status = to
	return b, nil
}

func (d *Driver) Pause(_ context.Context, id string) error {
	b, err := d.setStatus(id, []runtime.Status{runtime.StatusRunning, runtime.StatusPaused}, runtime.StatusPaused)
	if err != nil {
		return err
	}
	b.g.pause()
	return nil
}

func (d *Driver) Resume(_ context.Context, id string) error {
	b, err := d.setStatus(id, []runtime.Status{runtime.StatusRunning, runtime.StatusPaused}, runtime.StatusRunning)
	if err != nil {
		return err
	}
	b.g.resume()
	return nil
}

// image is a checkpoint's content.
type image struct {
	Magic    string           `json:"magic"`
	Hostname string           `json:"hostname"`
	Upper    map[string]*node `json:"upper"`
	Gone     []string         `json:"gone"`
	NextPID  int              `json:"next_pid"`
	Procs    []imageProc      `json:"procs"`
	Taken    time.Time        `json:"taken"`
}

type imageProc struct {
	Info   json.RawMessage `json:"info"`
	Stdout []byte          `json:"stdout,omitempty"`
	Exit   json.RawMessage `json:"exit"`
}

// Checkpoint writes the guest into dir. Without leaveRunning the guest
// stops (StatusStopped) for the caller's Delete.
func (d *Driver) Checkpoint(_ context.Context, id, dir string, leaveRunning bool) error {
	b, err := d.get(id)
	if err != nil {
		return err
	}
	g := b.g
	g.mu.Lock()
	img := image{Magic: checkpointMagic, Hostname: g.hostname, Upper: g.fs.clone().upper, NextPID: g.nextPID, Taken: time.Now()}
	for p := range g.fs.gone {
		img.Gone = append(img.Gone, p)
	}
	slices.Sort(img.Gone)
	for _, p := range g.procs {
		info := p.info
		exit := p.exit
		if exit == nil { // a running program does not survive a restore
			now := time.Now()
			code := -1
			info.Running, info.EndedAt, info.ExitCode = false, &now, &code
			exit = &jsonExitKilled
		}
		ib, _ := json.Marshal(info)
		eb, _ := json.Marshal(exit)
		var out []byte
		for _, c := range p.chunks {
			out = append(out, c.data...)
		}
		img.Procs = append(img.Procs, imageProc{Info: ib, Stdout: out, Exit: eb})
	}
	g.mu.Unlock()
	data, err := json.Marshal(img)
	if err != nil {
		return fmt.Errorf("fake checkpoint %s: %w", id, err)
	}
	if err := os.WriteFile(filepath.Join(dir, checkpointFile), data, 0o600); err != nil {
		return fmt.Errorf("fake checkpoint %s: %w", id, err)
	}
	if !leaveRunning {
		if _, err := d.setStatus(id, []runtime.Status{runtime.StatusRunning, runtime.StatusPaused}, runtime.StatusStopped); err != nil {
			return err
		}
		g.stop()
		b.ln.Close()
		b.srv.Close()
	}
	return nil
}

// Restore starts spec.ID from the checkpoint in dir over spec.RootFS.
func (d *Driver) Restore(_ context.Context, spec runtime.Spec, dir string) (runtime.Sandbox, error) {
	if _, err := d.get(spec.ID); err == nil {
		return nil, fmt.Errorf("fake restore: sandbox %s exists", spec.ID)
	}
	data, err := os.ReadFile(filepath.Join(dir, checkpointFile))
	if err != nil {
		return nil, fmt.Errorf("fake restore %s: %w", spec.ID, err)
	}
	var img image
	if err := json.Unmarshal(data, &img); err != nil || img.Magic != checkpointMagic {
		return nil, fmt.Errorf("fake restore %s: %s is not a fake checkpoint", spec.ID, dir)
	}
	root, err := openRoot(spec.RootFS)
	if err != nil {
		return nil, err
	}
	fsys := &guestFS{lower: root, upper: img.Upper, gone: map[string]bool{}, meminfo: meminfo(spec)}
	if fsys.upper == nil {
		fsys.upper = map[string]*node{}
	}
	for _, p := range img.Gone {
		fsys.gone[p] = true
	}
	g := newGuest(fsys, img.Hostname, img.NextPID)
	for _, ip := range img.Procs {
		p := &proc{changed: make(chan struct{}), cancel: func() {}}
		if json.Unmarshal(ip.Info, &p.info) != nil || json.Unmarshal(ip.Exit, &p.exit) != nil {
			return nil, fmt.Errorf("fake restore %s: a process record is damaged", spec.ID)
		}
		if len(ip.Stdout) > 0 {
			p.chunks, p.size = []chunk{{1, ip.Stdout}}, int64(len(ip.Stdout))
		}
		g.procs[p.info.ID] = p
	}
	return d.add(spec, g)
}

// jsonExitKilled is the exit a restore reports for a process that was
// running at the checkpoint.
var jsonExitKilled = agentapi.Exit{ExitCode: -1, Signal: "KILL"}

// handle is a Sandbox: AgentConn dials the guest's in-process server.
type handle struct {
	d      *Driver
	id     string
	once   sync.Once
	closed chan struct{}
}

func (h *handle) ID() string { return h.id }

func (h *handle) Close() error {
	h.once.Do(func() { close(h.closed) })
	return nil
}

// AgentConn returns a new connection to the guest's agent.
func (h *handle) AgentConn(ctx context.Context) (net.Conn, error) {
	select {
	case <-h.closed:
		return nil, fmt.Errorf("fake: handle of %s is closed", h.id)
	default:
	}
	b, err := h.d.get(h.id)
	if err != nil {
		return nil, err
	}
	return b.ln.dial(ctx)
}

// pipeListener hands the server the other ends of dialed pipes.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) dial(ctx context.Context) (net.Conn, error) {
	c, s := net.Pipe()
	select {
	case l.conns <- s:
		return c, nil
	case <-l.done:
		return nil, fmt.Errorf("fake: the sandbox stopped: %w", net.ErrClosed)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "fake-agent" }
