package gvisor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// errClosed is returned by AgentConn after the handle was closed.
var errClosed = errors.New("gvisor: sandbox handle closed")

// sandbox is a handle: the channel listener and the connections it accepts.
type sandbox struct {
	id    string
	ln    *net.UnixListener
	d     *Driver
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
}

func newSandbox(id string, ln *net.UnixListener, d *Driver) *sandbox {
	sb := &sandbox{id: id, ln: ln, d: d, conns: make(chan net.Conn), done: make(chan struct{})}
	sb.wg.Add(1)
	go sb.acceptLoop()
	return sb
}

func (s *sandbox) ID() string { return s.id }

// acceptLoop hands every accepted connection to AgentConn, one at a time.
func (s *sandbox) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			s.d.log.Warn("agent channel accept failed", "id", s.id, "err", err)
			select {
			case <-s.done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		select {
		case s.conns <- c:
		case <-s.done:
			c.Close()
			return
		}
	}
}

// AgentConn returns the next connection the agent dialed.
func (s *sandbox) AgentConn(ctx context.Context) (net.Conn, error) {
	select {
	case c := <-s.conns:
		return c, nil
	case <-s.done:
		return nil, fmt.Errorf("agent connection for %s: %w", s.id, errClosed)
	case <-ctx.Done():
		return nil, fmt.Errorf("agent connection for %s: %w", s.id, ctx.Err())
	}
}

// Close stops accepting; connections already returned stay open.
func (s *sandbox) Close() error {
	var err error
	s.once.Do(func() {
		close(s.done)
		err = s.ln.Close()
		s.wg.Wait()
		s.d.forget(s)
	})
	return err
}
