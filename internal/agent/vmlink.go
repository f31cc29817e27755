package agent

// The guest side of the VM channel: a virtio-serial port, one byte stream
// for successive host sessions, each opened by the SYNC/ACK/GO handshake
// specified (with its words) in internal/agentapi/vmlink.go.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/agentapi"
)

// VMDialer opens the virtio-serial port and returns a Dialer whose
// connections are successive sessions on it: a dial waits until the
// previous connection is closed and a host connection has completed the
// handshake. Use it with Serve and spare 1.
func VMDialer(log *slog.Logger) (Dialer, error) {
	dev, err := vmPort(agentapi.VMPortName, 60*time.Second)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	l := newVMLink(fd, log)
	go l.readLoop()
	return l.dial, nil
}

type vmLink struct {
	fd      int
	log     *slog.Logger
	in      chan []byte // chunks from the host; nil = the host hung up
	mu      sync.Mutex
	pending []byte // read but not consumed; served before in
	wmu     sync.Mutex
	free    chan struct{} // holds a token while no session is open
}

func newVMLink(fd int, log *slog.Logger) *vmLink {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &vmLink{fd: fd, log: log, in: make(chan []byte, 64), free: make(chan struct{}, 1)}
	l.free <- struct{}{}
	return l
}

// readLoop is the only reader of the port.
func (l *vmLink) readLoop() {
	buf := make([]byte, 64<<10)
	connected := false
	for {
		n, err := unix.Read(l.fd, buf)
		if n > 0 {
			connected = true
			l.in <- bytes.Clone(buf[:n])
			continue
		}
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue
		}
		// 0 bytes: no host is connected (the port reports POLLHUP).
		if connected {
			l.in <- nil
		}
		connected = false
		time.Sleep(20 * time.Millisecond)
	}
}

// next returns the next chunk, hangup=true when the host went away.
func (l *vmLink) next(done <-chan struct{}) (b []byte, hangup bool, err error) {
	l.mu.Lock()
	if len(l.pending) > 0 {
		b, l.pending = l.pending, nil
		l.mu.Unlock()
		return b, false, nil
	}
	l.mu.Unlock()
	select {
	case b := <-l.in:
		return b, b == nil, nil
	case <-done:
		return nil, false, net.ErrClosed
	}
}

func (l *vmLink) unread(b []byte) {
	if len(b) == 0 {
		return
	}
	l.mu.Lock()
	l.pending = append(bytes.Clone(b), l.pending...)
	l.mu.Unlock()
}

func (l *vmLink) write(b []byte) (int, error) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	return l.writeLocked(b)
}

func (l *vmLink) writeLocked(b []byte) (int, error) {
	var n int
	for n < len(b) {
		m, err := unix.Write(l.fd, b[n:])
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue
		}
		if err != nil {
			return n, err
		}
		n += m
	}
	return n, nil
}

// dial waits for the previous session to end, then for a host handshake.
func (l *vmLink) dial(ctx context.Context) (net.Conn, error) {
	select {
	case <-l.free:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if err := l.handshake(ctx); err != nil {
		l.free <- struct{}{}
		return nil, err
	}
	l.log.Debug("vm channel: host session started")
	return &vmConn{l: l, done: make(chan struct{})}, nil
}

func (l *vmLink) handshake(ctx context.Context) error {
	var acc []byte
	nonce := ""
	for {
		b, hangup, err := l.next(ctx.Done())
		if err != nil {
			return err
		}
		if hangup {
			acc, nonce = nil, ""
			continue
		}
		acc = append(acc, b...)
		for {
			if nonce != "" {
				goLine := []byte(agentapi.VMGoPrefix + nonce + "\n")
				if i := bytes.Index(acc, goLine); i >= 0 {
					l.unread(acc[i+len(goLine):])
					return nil
				}
			}
			i := bytes.Index(acc, []byte(agentapi.VMSyncPrefix[4:]))
			if i < 0 {
				break
			}
			j := bytes.IndexByte(acc[i:], '\n')
			if j < 0 {
				break
			}
			n := string(acc[i+len(agentapi.VMSyncPrefix)-4 : i+j])
			acc = acc[i+j+1:]
			if n != nonce && len(n) <= 64 {
				nonce = n
				if _, err := l.write([]byte(agentapi.VMAckPrefix + nonce + "\n")); err != nil {
					return err
				}
			}
		}
		if len(acc) > 4096 {
			acc = bytes.Clone(acc[len(acc)-256:])
		}
	}
}

// vmConn is one host session on the port.
type vmConn struct {
	l    *vmLink
	done chan struct{}
	once sync.Once
	rmu  sync.Mutex
	buf  []byte
	eof  bool
}

func (c *vmConn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.eof {
		return 0, io.EOF
	}
	if len(c.buf) == 0 {
		b, hangup, err := c.l.next(c.done)
		if err != nil {
			return 0, io.EOF
		}
		if hangup {
			c.eof = true
			return 0, io.EOF
		}
		select {
		case <-c.done:
			c.l.unread(b)
			return 0, io.EOF
		default:
		}
		c.buf = b
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

func (c *vmConn) Write(p []byte) (int, error) {
	c.l.wmu.Lock()
	defer c.l.wmu.Unlock()
	select {
	case <-c.done:
		return 0, net.ErrClosed
	default:
	}
	return c.l.writeLocked(p)
}

func (c *vmConn) Close() error {
	c.once.Do(func() {
		close(c.done)
		c.rmu.Lock()
		c.l.unread(c.buf)
		c.buf = nil
		c.rmu.Unlock()
		c.l.wmu.Lock() // no write of this session after the token is back
		c.l.wmu.Unlock()
		c.l.free <- struct{}{}
	})
	return nil
}

func (c *vmConn) LocalAddr() net.Addr                { return &net.UnixAddr{Name: "vport", Net: "unix"} }
func (c *vmConn) RemoteAddr() net.Addr               { return &net.UnixAddr{Name: "host", Net: "unix"} }
func (c *vmConn) SetDeadline(t time.Time) error      { return nil }
func (c *vmConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *vmConn) SetWriteDeadline(t time.Time) error { return nil }
