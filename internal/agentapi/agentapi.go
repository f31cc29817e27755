// Package agentapi is the wire contract between the worker and airlock-agent,
// the small static program that runs as PID 1 inside every sandbox. It links
// only the standard library so the agent can import it.
//
// Transport: the agent dials the runtime's private channel (gVisor: a unix
// socket in a bind-mounted per-sandbox directory) and serves HTTP/2 without
// TLS (h2c, prior knowledge) on each connection it dials. It always keeps one
// spare, unused connection dialed, so the host can open more when it needs
// them. The agent never listens on anything.
//
// Endpoints (all JSON unless noted; errors are {"error":{"code","message"}}
// with an HTTP status, see Error):
//
//	GET    /health                          → Health
//	POST   /processes          ProcessSpec  → 201 ProcessInfo (started); 409 if the id exists
//	GET    /processes?limit=N&after=C       → []ProcessInfo, one page (see MaxPageEntries)
//	GET    /processes/{id}                  → ProcessInfo
//	GET    /processes/{id}/output?offset=N  → stream of frames (see WriteFrame) from combined
//	                                          output offset N: the retained output, then live output,
//	                                          then one FrameExit; ends after FrameExit
//	POST   /processes/{id}/stdin            raw body streamed to the process's stdin
//	                                          (?close=1 closes stdin when the body ends)
//	POST   /processes/{id}/close-stdin      → 204
//	POST   /processes/{id}/signal  Signal   → 204
//	POST   /processes/{id}/resize  PTYSize  → 204 (a process started with PTY)
//	GET    /files/content?path=P            → raw bytes; headers X-Airlock-Mode (octal), Content-Length
//	PUT    /files/content?path=P&mode=0644&owner=user  raw body → 200 FileInfo
//	                                          (parents created, written to a temp file and renamed)
//	GET    /files/stat?path=P               → FileInfo (Lstat; 404 if missing)
//	GET    /files/list?path=P&limit=N&after=C → []FileInfo sorted by name, one page
//	POST   /files/mkdir        Mkdir        → 200 FileInfo (mkdir -p)
//	POST   /files/move         Move         → 200 FileInfo
//	DELETE /files?path=P&recursive=1        → 204
//
// The same connections also carry (served by internal/agent/envd):
//
//	/envd/…                 E2B's envd API with envd's own paths after the prefix:
//	                        Connect-RPC /envd/process.Process/*, /envd/filesystem.Filesystem/*,
//	                        and /envd/files, /envd/health, /envd/envs, /envd/init, /envd/metrics
//	/ports/{port}/…         HTTP reverse proxy to 127.0.0.1:{port} inside the sandbox
//	CONNECT 127.0.0.1:{port}  (HTTP/2 CONNECT, :authority = the address) a raw TCP tunnel to that
//	                        port: request body → port, port → response body (WebSocket, any TCP)
//
// Relative paths resolve against the home directory of the default user.
package agentapi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// Path prefixes of the envd API and the port proxy on the agent channel.
const (
	EnvdPrefix  = "/envd"
	PortsPrefix = "/ports/"
)

// Pages of the list endpoints: at most MaxPageEntries entries (fewer with
// ?limit=N) and about MaxPageBytes of JSON (at least one entry). When more
// remain, the NextCursorHeader of the answer is the ?after= of the next page.
const (
	MaxPageEntries   = 1000
	MaxPageBytes     = 4 << 20
	NextCursorHeader = "X-Airlock-Next-Cursor"
)

// Version is the agent protocol version reported by /health.
const Version = "1"

// Defaults inside every template.
const (
	DefaultUser = "user"
	DefaultHome = "/home/user"
	DefaultUID  = 1000
	DefaultGID  = 1000
	// ChannelDir is where the per-sandbox channel directory is mounted inside
	// the guest; the agent dials ChannelDir/ChannelSocket.
	ChannelDir    = "/run/airlock"
	ChannelSocket = "agent.sock"
)

// Health is the /health answer.
type Health struct {
	Version string    `json:"version"`
	PID     int       `json:"pid"`
	Boot    time.Time `json:"boot"`
}

// ProcessSpec starts a process. Argv[0] is looked up in PATH. User defaults
// to DefaultUser; Cwd to that user's home; Env is merged over a base
// environment (PATH, HOME, USER, LANG).
type ProcessSpec struct {
	ID       string            `json:"id"`
	Argv     []string          `json:"argv"`
	Env      map[string]string `json:"env,omitempty"`
	Cwd      string            `json:"cwd,omitempty"`
	User     string            `json:"user,omitempty"`
	Stdin    bool              `json:"stdin,omitempty"`     // keep a stdin pipe open; otherwise stdin is /dev/null
	TimeoutS int               `json:"timeout_s,omitempty"` // SIGKILL after this many seconds; 0: none
	// PTY runs the process as a session leader on a new pseudo-terminal
	// of this size: its stdin is the terminal (Stdin is implied), stdout
	// and stderr are both the terminal and arrive as FrameStdout.
	PTY *PTYSize `json:"pty,omitempty"`
}

// PTYSize is a terminal size, the body of POST /processes/{id}/resize.
type PTYSize struct {
	Cols int `json:"cols"`
	Rows int `json:"rows"`
}

// MaxPTYSide bounds each side of a PTYSize.
const MaxPTYSide = 1000

// Validate says what is wrong with a terminal size.
func (s PTYSize) Validate() error {
	if s.Cols < 1 || s.Cols > MaxPTYSide || s.Rows < 1 || s.Rows > MaxPTYSide {
		return fmt.Errorf("pty size %dx%d (cols x rows) is out of range; each must be 1 to %d", s.Cols, s.Rows, MaxPTYSide)
	}
	return nil
}

// ProcessInfo describes a process the agent started.
type ProcessInfo struct {
	ID        string     `json:"id"`
	PID       int        `json:"pid"`
	Argv      []string   `json:"argv"`
	Running   bool       `json:"running"`
	ExitCode  *int       `json:"exit_code,omitempty"`
	StartedAt time.Time  `json:"started_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	// OutputBytes is the combined stdout+stderr offset reached so far.
	OutputBytes int64 `json:"output_bytes"`
}

// Exit is the payload of FrameExit.
type Exit struct {
	ExitCode int    `json:"exit_code"`        // -1 if killed by a signal
	Signal   string `json:"signal,omitempty"` // e.g. "KILL"
	TimedOut bool   `json:"timed_out,omitempty"`
	Error    string `json:"error,omitempty"` // e.g. the program could not be started
}

// Signal names a signal by name ("TERM", "KILL", "INT", "HUP", "USR1", …) or number.
type Signal struct {
	Signal string `json:"signal"`
}

// FileInfo describes a file.
type FileInfo struct {
	Path    string    `json:"path"`
	Name    string    `json:"name"`
	Type    string    `json:"type"` // "file", "dir", "symlink", "other"
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"` // octal permission bits, e.g. "0644"
	UID     int       `json:"uid"`
	GID     int       `json:"gid"`
	Owner   string    `json:"owner,omitempty"`
	ModTime time.Time `json:"mod_time"`
	Target  string    `json:"target,omitempty"` // symlink target
}

// Mkdir is the /files/mkdir body.
type Mkdir struct {
	Path  string `json:"path"`
	Mode  string `json:"mode,omitempty"`  // default "0755"
	Owner string `json:"owner,omitempty"` // default DefaultUser
}

// Move is the /files/move body.
type Move struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// Error is the body of every non-2xx answer.
type Error struct {
	Error struct {
		Code    string `json:"code"` // "not_found", "invalid", "conflict", "internal"
		Message string `json:"message"`
	} `json:"error"`
}

// Frame kinds in an output stream (agent → host, and worker → client over
// the data-plane WebSocket, where each message is one frame without the
// length prefix).
const (
	FrameStdout  byte = 1
	FrameStderr  byte = 2
	FrameExit    byte = 3 // payload: JSON Exit
	FrameStarted byte = 4 // payload: JSON ProcessInfo
	FrameError   byte = 5 // payload: JSON {"message": "..."}; the stream ends
)

// Frame kinds a data-plane client sends over the WebSocket.
const (
	FrameStdin      byte = 16 // payload: bytes for stdin
	FrameStdinClose byte = 17 // no payload
	FrameSignal     byte = 18 // payload: JSON Signal
	FrameResize     byte = 19 // payload: JSON PTYSize (a PTY command)
)

// MaxFramePayload bounds one frame.
const MaxFramePayload = 1 << 20

// WriteFrame writes one length-prefixed frame: kind (1 byte), payload length
// (4 bytes, big endian), payload.
func WriteFrame(w io.Writer, kind byte, payload []byte) error {
	if len(payload) > MaxFramePayload {
		return fmt.Errorf("frame payload of %d bytes exceeds %d", len(payload), MaxFramePayload)
	}
	var hdr [5]byte
	hdr[0] = kind
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(payload)
	return err
}

// ReadFrame reads one frame written by WriteFrame.
func ReadFrame(r io.Reader) (kind byte, payload []byte, err error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxFramePayload {
		return 0, nil, errors.New("agentapi: frame too large")
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, fmt.Errorf("agentapi: short frame: %w", err)
	}
	return hdr[0], payload, nil
}
