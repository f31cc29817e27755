// Package httplimit bounds what one client can hold of an HTTP server: how
// long it may take to send its headers, how long an idle keep-alive
// connection stays open, how long a request body may stall, and how large
// the headers may be. The server (control plane and E2B router) and the
// worker (data plane) build their http.Server here.
//
// There is deliberately no ReadTimeout or WriteTimeout: uploads (imports,
// file writes) and SSE streams, long polls and attaches legitimately last
// longer than any fixed bound. Instead a body read waits at most
// BodyStallTimeout for the next bytes (the semantics of nginx's
// client_body_timeout), so a body that keeps flowing is never cut and one
// that stops is.
package httplimit

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// Limits of one HTTP server. A zero field takes the Default's value.
type Limits struct {
	// ReadHeaderTimeout bounds reading a request's line and headers.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that carries no request
	// for this long.
	IdleTimeout time.Duration
	// BodyStallTimeout is the longest wait for the next bytes of a request
	// body.
	BodyStallTimeout time.Duration
	// MaxHeaderBytes caps a request's line and headers (431 beyond).
	MaxHeaderBytes int
}

// Default limits; Control and DataPlane are what the daemons use.
var (
	// Default: 30 s for headers, 120 s idle, 60 s body stall, 1 MiB headers.
	Default = Limits{
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       120 * time.Second,
		BodyStallTimeout:  60 * time.Second,
		MaxHeaderBytes:    1 << 20,
	}
	// Control is the server's (/v1, /internal/v1, E2B API and router):
	// headers there are an API key and a few fields, 64 KiB is plenty.
	Control = Limits{MaxHeaderBytes: 64 << 10}
	// DataPlane is the worker's: a command token in a header carries the
	// command's argv and env, so headers keep the 1 MiB default.
	DataPlane = Limits{}
)

func (l Limits) withDefaults() Limits {
	if l.ReadHeaderTimeout <= 0 {
		l.ReadHeaderTimeout = Default.ReadHeaderTimeout
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = Default.IdleTimeout
	}
	if l.BodyStallTimeout <= 0 {
		l.BodyStallTimeout = Default.BodyStallTimeout
	}
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = Default.MaxHeaderBytes
	}
	return l
}

// Server returns an http.Server for h with these limits.
func (l Limits) Server(h http.Handler) *http.Server {
	l = l.withDefaults()
	return &http.Server{
		Handler:           BodyStall(h, l.BodyStallTimeout),
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
	}
}

// ErrBodyStalled is what a handler's body read returns when the client sent
// nothing for the stall timeout.
var ErrBodyStalled = errors.New("request body stalled")

// BodyStall makes every body read of h's requests wait at most d for the
// next bytes. The deadline is cleared once the body ends, so what the
// handler does after (stream a response, hijack) is not bounded by it.
// CONNECT and Upgrade requests are tunnels, whose "body" may rightly be
// quiet for long: they are left alone.
func BodyStall(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody && r.Method != http.MethodConnect && r.Header.Get("Upgrade") == "" {
			r.Body = &stallReader{body: r.Body, rc: http.NewResponseController(w), d: d}
		}
		h.ServeHTTP(w, r)
	})
}

type stallReader struct {
	body io.ReadCloser
	rc   *http.ResponseController
	d    time.Duration
	done bool
}

func (s *stallReader) Read(p []byte) (int, error) {
	if s.done {
		return s.body.Read(p)
	}
	_ = s.rc.SetReadDeadline(time.Now().Add(s.d)) // ErrNotSupported: no bound, as before
	n, err := s.body.Read(p)
	switch {
	case err == io.EOF:
		// The body is complete: what the handler does next is unbounded.
		s.done = true
		_ = s.rc.SetReadDeadline(time.Time{})
	case err != nil:
		// The deadline stays (passed): the server's own attempt to drain
		// the rest of the body before it answers must not wait either.
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			err = fmt.Errorf("%w: no bytes for %v: %w", ErrBodyStalled, s.d, err)
		}
	}
	return n, err
}

func (s *stallReader) Close() error { return s.body.Close() }
