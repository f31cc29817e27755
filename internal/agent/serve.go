package agent

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// Redial backoff bounds.
const (
	minBackoff = 5 * time.Millisecond
	maxBackoff = 500 * time.Millisecond
)

// Dialer opens one connection to the host.
type Dialer func(ctx context.Context) (net.Conn, error)

// Serve serves h as HTTP/2 without TLS on connections it dials, keeping
// spare unused connections dialed at all times: when a connection receives
// its first bytes from the host another one is dialed. Failed dials and
// connections closed before use are retried with backoff, forever. Serve
// returns when ctx ends.
func Serve(ctx context.Context, dial Dialer, spare int, h http.Handler, log *slog.Logger) error {
	if spare < 1 {
		spare = 1
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	l := &dialListener{conns: make(chan net.Conn), done: ctx.Done()}
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Handler:   h,
		Protocols: &p,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:          1 << 16,
			MaxReadFrameSize:              1 << 20,
			MaxReceiveBufferPerConnection: 64 << 20,
			MaxReceiveBufferPerStream:     16 << 20,
		},
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	var wg sync.WaitGroup
	for range spare {
		wg.Go(func() { l.slot(ctx, dial, log) })
	}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	err := srv.Serve(l)
	cancel()
	wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// dialListener is a net.Listener whose Accept yields dialed connections.
type dialListener struct {
	conns chan net.Conn
	done  <-chan struct{}
}

func (l *dialListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *dialListener) Close() error   { return nil }
func (l *dialListener) Addr() net.Addr { return &net.UnixAddr{Name: "agent", Net: "unix"} }

// slot keeps one spare connection: dial, hand it to the server, wait until
// the host uses it (first bytes) or drops it unused, then dial the next.
func (l *dialListener) slot(ctx context.Context, dial Dialer, log *slog.Logger) {
	backoff := minBackoff
	sleep := func() bool {
		t := time.NewTimer(backoff)
		defer t.Stop()
		backoff = min(backoff*2, maxBackoff)
		select {
		case <-t.C:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for ctx.Err() == nil {
		c, err := dial(ctx)
		if err != nil {
			log.Debug("dial host", "err", err)
			if !sleep() {
				return
			}
			continue
		}
		used := make(chan bool, 1)
		wc := &watchedConn{Conn: c, used: used}
		select {
		case l.conns <- wc:
		case <-ctx.Done():
			c.Close()
			return
		}
		select {
		case ok := <-used:
			if ok {
				backoff = minBackoff
			} else if !sleep() {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// watchedConn reports once whether its first read got bytes (true) or
// failed, or the conn was closed before any read (false).
type watchedConn struct {
	net.Conn
	once sync.Once
	used chan<- bool
}

func (c *watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.once.Do(func() { c.used <- n > 0 })
	return n, err
}

func (c *watchedConn) Close() error {
	c.once.Do(func() { c.used <- false })
	return c.Conn.Close()
}
