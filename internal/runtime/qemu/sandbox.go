package qemu

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
)

// sandbox is a handle on a running VM. The agent channel is one
// virtio-serial port, so it carries one connection at a time: AgentConn
// waits until the previous connection is closed, connects to the chardev
// socket and runs the session handshake (internal/agentapi/vmlink.go) that
// makes the guest start a fresh HTTP/2 session.
type sandbox struct {
	d      *Driver
	id     string
	dir    string
	free   chan struct{} // holds a token while no connection is open
	closed chan struct{}
	once   sync.Once
	mu     sync.Mutex
	active net.Conn
}

func (s *sandbox) ID() string { return s.id }

func (s *sandbox) Close() error {
	s.once.Do(func() {
		close(s.closed)
		// Not under s.mu: the connection's Close takes it.
		s.mu.Lock()
		active := s.active
		s.mu.Unlock()
		if active != nil {
			active.Close()
		}
	})
	return nil
}

var errClosed = errors.New("qemu: sandbox handle closed")

func (s *sandbox) AgentConn(ctx context.Context) (net.Conn, error) {
	select {
	case <-s.free:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.closed:
		return nil, errClosed
	}
	c, err := s.connect(ctx)
	if err != nil {
		s.free <- struct{}{}
		return nil, fmt.Errorf("qemu agent channel %s: %w", s.id, err)
	}
	hc := &hostConn{Conn: c, s: s}
	s.mu.Lock()
	s.active = hc
	s.mu.Unlock()
	select {
	case <-s.closed: // closed while connecting
		hc.Close()
		return nil, errClosed
	default:
	}
	return hc, nil
}

func (s *sandbox) connect(ctx context.Context) (net.Conn, error) {
	for {
		if _, ok := s.d.pid(s.id); !ok {
			return nil, errors.New("qemu is not running")
		}
		var dl net.Dialer
		c, err := dl.DialContext(ctx, "unix", filepath.Join(s.dir, "agent.sock"))
		if err == nil {
			hc, err := handshake(ctx, c, s.closed)
			if err == nil {
				return hc, nil
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			s.d.log.Debug("qemu: agent handshake", "id", s.id, "err", err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.closed:
			return nil, errClosed
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// handshake sends SYNC until the guest answers ACK, then GO.
func handshake(ctx context.Context, c net.Conn, closed <-chan struct{}) (net.Conn, error) {
	nb := make([]byte, 8)
	rand.Read(nb)
	nonce := hex.EncodeToString(nb)
	ack := []byte(agentapi.VMAckPrefix + nonce + "\n")
	br := bufio.NewReaderSize(c, 64<<10)
	found := make(chan error, 1)
	go func() {
		var acc []byte
		for {
			b, err := br.ReadByte()
			if err != nil {
				found <- err
				return
			}
			acc = append(acc, b)
			if bytes.HasSuffix(acc, ack) {
				found <- nil
				return
			}
			if len(acc) > 4096 {
				acc = append(acc[:0], acc[len(acc)-64:]...)
			}
		}
	}()
	sync := []byte(agentapi.VMSyncPrefix + nonce + "\n")
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	fail := func(err error) (net.Conn, error) {
		c.Close()
		<-found
		return nil, err
	}
	if _, err := c.Write(sync); err != nil {
		return fail(err)
	}
	for {
		select {
		case err := <-found:
			if err != nil {
				c.Close()
				return nil, fmt.Errorf("handshake: %w", err)
			}
			if _, err := c.Write([]byte(agentapi.VMGoPrefix + nonce + "\n")); err != nil {
				c.Close()
				return nil, err
			}
			return &bufConn{Conn: c, r: br}, nil
		case <-tick.C:
			if _, err := c.Write(sync); err != nil {
				return fail(err)
			}
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-closed:
			return fail(errClosed)
		}
	}
}

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// hostConn gives the handle's token back when closed.
type hostConn struct {
	net.Conn
	s    *sandbox
	once sync.Once
}

func (c *hostConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.s.mu.Lock()
		if c.s.active == c {
			c.s.active = nil
		}
		c.s.mu.Unlock()
		c.s.free <- struct{}{}
	})
	return err
}
