package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"
)

// Proxy limits.
const (
	// peekTimeout bounds how long the client has to send its ClientHello
	// or request header once it sent its first byte (and the first byte
	// itself when the address alone cannot admit the connection).
	peekTimeout = 10 * time.Second
	// serverFirstWait is how long a connection whose destination the
	// policy admits by address waits for a first byte before it is
	// admitted as a nameless connection (SSH, SMTP … speak first from
	// the server).
	serverFirstWait = 300 * time.Millisecond
	// maxPeek bounds the ClientHello and each HTTP request header block.
	maxPeek = 16 << 10
	// maxChunkLine bounds a chunk-size line of a chunked request body.
	maxChunkLine = 4 << 10
	// dialTimeout bounds the dial of an admitted connection's upstream.
	dialTimeout = 10 * time.Second

	reasonNoInterception = "the rule intercepts TLS, but no org CA reached the gateway for this sandbox"
)

// ServeProxy serves the sandboxes' redirected TCP connections accepted
// on l until l is closed or the gateway is; it then returns an error
// wrapping net.ErrClosed, or ErrClosed.
func (g *Gateway) ServeProxy(l net.Listener) error { return g.serveProxyFor(l, nil) }

// serveProxyFor serves l; with sb set every connection is sb's, whatever
// its source (its own listener: see AttachListeners).
func (g *Gateway) serveProxyFor(l net.Listener, sb *sandbox) error {
	if !g.serving(l, l.Close) {
		return ErrClosed
	}
	defer g.unserving(l)
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if g.isClosed() {
				return ErrClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("egress proxy: %w", err)
			}
			// EMFILE and friends: back off like net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			g.log.Warn("egress proxy: accept", "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		if sb != nil {
			go g.handleConnOf(c, sb)
		} else {
			go g.handleConn(c)
		}
	}
}

// proxyConn is one proxied connection, listed in its sandbox's conns.
type proxyConn struct {
	client net.Conn
	dst    netip.AddrPort
	// name and admitted are guarded by the sandbox's mu.
	name     string
	admitted bool
	// tls and intercepted (guarded by the sandbox's mu too) say what
	// Update must keep: a TLS connection stays only under a rule of the
	// same mode (passthrough or intercept).
	tls, intercepted bool

	mu       sync.Mutex
	upstream net.Conn
	done     bool
}

// cut resets the connection: the client sees an RST at once.
func (pc *proxyConn) cut() {
	pc.mu.Lock()
	if pc.done {
		pc.mu.Unlock()
		return
	}
	pc.done = true
	up := pc.upstream
	pc.mu.Unlock()
	resetConn(pc.client)
	if up != nil {
		resetConn(up)
	}
}

// finish closes both sides in order.
func (pc *proxyConn) finish() {
	pc.mu.Lock()
	if pc.done {
		pc.mu.Unlock()
		return
	}
	pc.done = true
	up := pc.upstream
	pc.mu.Unlock()
	pc.client.Close()
	if up != nil {
		up.Close()
	}
}

func (pc *proxyConn) setUpstream(up net.Conn) bool {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.done {
		return false
	}
	pc.upstream = up
	return true
}

// resetConn closes c with an RST (SO_LINGER 0) when it is TCP.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

func (sb *sandbox) add(pc *proxyConn) error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.detached {
		return errors.New("sandbox detached")
	}
	if len(sb.conns) >= maxConns {
		return fmt.Errorf("sandbox has %d connections open (the most)", maxConns)
	}
	sb.conns[pc] = struct{}{}
	return nil
}

func (sb *sandbox) remove(pc *proxyConn) {
	sb.mu.Lock()
	delete(sb.conns, pc)
	sb.mu.Unlock()
}

func addrPortOf(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func (g *Gateway) handleConn(c net.Conn) {
	g.handleConnOf(c, g.sandboxByAddr(remoteAddr(c.RemoteAddr())))
}

// handleConnOf serves c, a connection of sb (nil: from no sandbox's address).
func (g *Gateway) handleConnOf(c net.Conn, sb *sandbox) {
	ev := Event{Kind: KindTCP, Rule: -1}
	deny := func(reason string) {
		ev.Allowed, ev.Reason = false, reason
		g.emit(ev)
		resetConn(c)
	}
	src := remoteAddr(c.RemoteAddr())
	if sb == nil {
		deny(fmt.Sprintf("connection from %v, which is no sandbox's address", src))
		return
	}
	ev.SandboxID = sb.id
	dst, err := g.originalDst(c)
	if err != nil {
		deny(err.Error())
		return
	}
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	ev.IP, ev.Port = dst.Addr(), dst.Port()
	if !dst.Addr().IsValid() || dst == addrPortOf(c.LocalAddr()) {
		deny("connection to the gateway itself")
		return
	}
	pc := &proxyConn{client: c, dst: dst}
	if err := sb.add(pc); err != nil {
		deny(err.Error())
		return
	}
	defer sb.remove(pc)

	// Would the address alone admit the connection? Then a client that
	// sends nothing first is not kept waiting long.
	policy, _, _ := sb.snapshot()
	if g.checksReach(policy) {
		if d := g.reachable(policy, dst.Addr()); !d.Allow {
			ev.Rule = d.Rule
			deny(d.Reason) // whatever name it would carry
			return
		}
	}
	raw := policy.Conn("", dst.Addr(), dst.Port(), "tcp")
	rawOK := raw.Allow && !raw.ByName && raw.TLS != tlsIntercept
	p, err := peek(c, rawOK)
	if err != nil {
		ev.SNI, ev.Host, ev.Name = p.sni, p.host, p.name
		deny(err.Error())
		return
	}
	ev.SNI, ev.Host, ev.Name = p.sni, p.host, p.name
	if p.hostIP.IsValid() && p.hostIP.Unmap() != dst.Addr() {
		deny(fmt.Sprintf("Host %s is not the destination %v", p.host, dst.Addr()))
		return
	}
	d, reason := g.admit(sb, pc, p.name, dst)
	ev.Rule = d.Rule
	if reason != "" {
		deny(reason)
		return
	}
	ev.Allowed, ev.Reason = true, d.Reason
	g.emit(ev)

	if p.proto == protoTLS {
		policy, _, _ := sb.snapshot()
		ic := interceptionOf(policy)
		sb.mu.Lock()
		pc.tls = true
		pc.intercepted = d.TLS == tlsIntercept && ic != nil
		sb.mu.Unlock()
		if pc.intercepted {
			g.intercept(sb, pc, p, p.name, ic)
			return
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	up, err := g.dial(ctx, "tcp", dst.String())
	cancel()
	if err != nil {
		g.log.Debug("egress proxy: dial upstream", "sandbox", sb.id, "dst", dst, "err", err)
		pc.cut()
		return
	}
	if !pc.setUpstream(up) { // cut while dialling
		resetConn(up)
		return
	}
	defer pc.finish()

	var toUp func() error
	if p.proto == protoHTTP {
		br := bufio.NewReaderSize(io.MultiReader(bytes.NewReader(p.buf), c), maxPeek+64)
		toUp = func() error { return g.relayHTTP(sb, pc, br, up) }
	} else {
		toUp = func() error {
			if _, err := up.Write(p.buf); err != nil {
				return err
			}
			_, err := io.Copy(up, c)
			return err
		}
	}
	errc := make(chan error, 1)
	go func() {
		err := toUp()
		if err == nil {
			closeWrite(up)
		} else {
			pc.cut()
		}
		errc <- err
	}()
	// upstream → sandbox: *net.TCPConn.ReadFrom splices.
	if _, err := io.Copy(c, up); err == nil {
		closeWrite(c)
	} else {
		pc.cut()
	}
	<-errc
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	c.Close()
}

// admit decides a connection (or an HTTP request's new Host) under the
// sandbox's current policy; reason is "" when admitted. A policy update
// racing the decision makes it decide again, so nothing admitted under
// an old policy escapes Update's sweep.
func (g *Gateway) admit(sb *sandbox, pc *proxyConn, name string, dst netip.AddrPort) (Decision, string) {
	for {
		policy, gen, detached := sb.snapshot()
		if detached {
			return Decision{Rule: -1}, "sandbox detached"
		}
		d, reason := g.decide(sb, policy, name, dst)
		sb.mu.Lock()
		if sb.gen != gen {
			sb.mu.Unlock()
			continue
		}
		if reason == "" {
			pc.name, pc.admitted = name, true
		}
		sb.mu.Unlock()
		return d, reason
	}
}

func (g *Gateway) decide(sb *sandbox, policy Policy, name string, dst netip.AddrPort) (Decision, string) {
	ip := dst.Addr()
	d := policy.Conn(name, ip, dst.Port(), "tcp")
	switch {
	case !d.Allow:
		if d.Reason == "" {
			return d, "not allowed by policy"
		}
		return d, d.Reason
	case d.TLS == tlsIntercept && interceptionOf(policy) == nil:
		return d, reasonNoInterception
	case d.ByName && name == "":
		return d, "a domain rule cannot admit a connection that names no host"
	case d.ByName && !g.attributed(sb, name, ip):
		if names := g.Lookup(sb.id, ip); len(names) > 0 {
			return d, fmt.Sprintf("%v was not resolved for %s by this sandbox (it was for %v)", ip, name, names)
		}
		return d, fmt.Sprintf("%v was not resolved for %s by this sandbox", ip, name)
	}
	return d, ""
}

const (
	protoNone  = iota // the client sent nothing (yet)
	protoTLS          // a TLS ClientHello
	protoHTTP         // an HTTP/1.x request
	protoOther        // anything else
)

type peeked struct {
	proto     int
	buf       []byte     // every byte read, to replay upstream
	sni, host string     // as sent (for events)
	name      string     // the canonical name the connection is judged by
	hostIP    netip.Addr // an HTTP Host that is an IP literal
}

var errTooLarge = errors.New("too large")

// peek reads the start of the client's stream without consuming it (the
// bytes are kept to replay) and finds the name the connection is judged
// by: the SNI of a TLS ClientHello or the Host of an HTTP/1.x request.
func peek(c net.Conn, rawOK bool) (peeked, error) {
	var p peeked
	start := time.Now()
	first := peekTimeout
	if rawOK {
		first = serverFirstWait
	}
	_ = c.SetReadDeadline(start.Add(first))
	defer c.SetReadDeadline(time.Time{})
	tmp := make([]byte, 4096)
	more := func() error {
		if len(p.buf) >= maxPeek {
			return errTooLarge
		}
		n, err := c.Read(tmp[:min(len(tmp), maxPeek-len(p.buf))])
		p.buf = append(p.buf, tmp[:n]...)
		if n > 0 {
			return nil
		}
		return err
	}
	if err := more(); err != nil {
		if len(p.buf) == 0 && rawOK && errors.Is(err, os.ErrDeadlineExceeded) {
			return p, nil // admitted by address, nameless
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return p, fmt.Errorf("nothing sent within %v: the connection names no host", first)
		}
		return p, fmt.Errorf("client closed before naming a host: %w", err)
	}
	_ = c.SetReadDeadline(start.Add(peekTimeout))

	if p.buf[0] == 0x16 { // TLS handshake record
		p.proto = protoTLS
		sni, err := parseClientHello(c, &p.buf)
		p.sni = sni
		switch {
		case errors.Is(err, errTooLarge):
			return p, fmt.Errorf("TLS ClientHello larger than %d KiB", maxPeek>>10)
		case errors.Is(err, os.ErrDeadlineExceeded):
			return p, fmt.Errorf("TLS ClientHello incomplete after %v", peekTimeout)
		case err != nil:
			return p, fmt.Errorf("malformed TLS ClientHello: %w", err)
		}
		if sni != "" {
			name, ok := canonicalName(sni)
			if !ok {
				return p, fmt.Errorf("invalid SNI %q", sni)
			}
			p.name = name
		}
		return p, nil
	}

	// An HTTP/1.x request starts with a method token of upper-case
	// letters and a space.
	for {
		i := bytes.IndexByte(p.buf, ' ')
		isMethod := func(b []byte) bool {
			for _, c := range b {
				if c < 'A' || c > 'Z' {
					return false
				}
			}
			return true
		}
		if i > 0 && i <= 16 && isMethod(p.buf[:i]) {
			break
		}
		if i >= 0 || len(p.buf) > 16 || !isMethod(p.buf) {
			p.proto = protoOther
			return p, nil
		}
		if err := more(); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return p, fmt.Errorf("nothing recognisable sent within %v", peekTimeout)
			}
			return p, fmt.Errorf("client closed before naming a host: %w", err)
		}
	}
	p.proto = protoHTTP
	for {
		if i := bytes.Index(p.buf, []byte("\r\n\r\n")); i >= 0 {
			h, err := parseHead(p.buf[:i+4])
			p.host = h.host
			if err != nil {
				return p, err
			}
			p.name, p.hostIP = h.name, h.ip
			return p, nil
		}
		if err := more(); err != nil {
			switch {
			case errors.Is(err, errTooLarge):
				return p, fmt.Errorf("HTTP request header larger than %d KiB", maxPeek>>10)
			case errors.Is(err, os.ErrDeadlineExceeded):
				return p, fmt.Errorf("HTTP request header incomplete after %v", peekTimeout)
			}
			return p, fmt.Errorf("client closed inside the request header: %w", err)
		}
	}
}

// helloConn feeds crypto/tls the client's bytes, recording each one it
// reads (bounded by maxPeek) so they can be replayed upstream; what
// crypto/tls writes (an alert) goes nowhere.
type helloConn struct {
	src net.Conn
	buf *[]byte
	off int
}

func (h *helloConn) Read(p []byte) (int, error) {
	if h.off < len(*h.buf) {
		n := copy(p, (*h.buf)[h.off:])
		h.off += n
		return n, nil
	}
	room := maxPeek - len(*h.buf)
	if room <= 0 {
		return 0, errTooLarge
	}
	if len(p) > room {
		p = p[:room]
	}
	n, err := h.src.Read(p)
	*h.buf = append(*h.buf, p[:n]...)
	h.off += n
	return n, err
}

func (h *helloConn) Write(p []byte) (int, error)        { return len(p), nil }
func (h *helloConn) Close() error                       { return nil }
func (h *helloConn) LocalAddr() net.Addr                { return h.src.LocalAddr() }
func (h *helloConn) RemoteAddr() net.Addr               { return h.src.RemoteAddr() }
func (h *helloConn) SetDeadline(t time.Time) error      { return nil }
func (h *helloConn) SetReadDeadline(t time.Time) error  { return nil }
func (h *helloConn) SetWriteDeadline(t time.Time) error { return nil }

var errHelloSeen = errors.New("client hello seen")

// parseClientHello parses the ClientHello with crypto/tls's own parser
// (records, fragmentation, extensions: the parser the field trusts) and
// stops the handshake as soon as the hello is read; it returns the SNI
// ("" when the client sent none).
func parseClientHello(c net.Conn, buf *[]byte) (string, error) {
	var sni string
	seen := false
	cfg := &tls.Config{GetConfigForClient: func(chi *tls.ClientHelloInfo) (*tls.Config, error) {
		sni, seen = chi.ServerName, true
		return nil, errHelloSeen
	}}
	err := tls.Server(&helloConn{src: c, buf: buf}, cfg).Handshake()
	if seen {
		return sni, nil
	}
	if err == nil {
		err = errors.New("handshake ended without a ClientHello")
	}
	return "", err
}

// relayHTTP copies HTTP/1.x requests from the sandbox upstream, one at a
// time, re-judging each whose Host differs from the connection's current
// name. Only origin-form requests with exactly one Host, a body framed
// by one Content-Length or by chunked alone, strict CRLF line ends and
// no Upgrade pass: anything a server might frame differently from the
// gateway is refused, so the gateway and the server always agree where
// a request starts and so which Host it carries.
func (g *Gateway) relayHTTP(sb *sandbox, pc *proxyConn, br *bufio.Reader, up net.Conn) error {
	for {
		block, err := readHead(br)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return nil // the client closed (between requests, or inside one)
			}
			if errors.Is(err, errTooLarge) {
				return g.denyHTTP(sb, pc, "", fmt.Sprintf("HTTP request header larger than %d KiB", maxPeek>>10))
			}
			return err
		}
		h, err := parseHead(block)
		if err != nil {
			return g.denyHTTP(sb, pc, h.host, err.Error())
		}
		if h.ip.IsValid() && h.ip.Unmap() != pc.dst.Addr() {
			return g.denyHTTP(sb, pc, h.host, fmt.Sprintf("Host %s is not the destination %v", h.host, pc.dst.Addr()))
		}
		sb.mu.Lock()
		cur := pc.name
		sb.mu.Unlock()
		if h.name != cur {
			d, reason := g.admit(sb, pc, h.name, pc.dst)
			ev := Event{SandboxID: sb.id, Kind: KindHTTP, Name: h.name, Host: h.host, IP: pc.dst.Addr(), Port: pc.dst.Port(), Rule: d.Rule}
			if reason != "" {
				ev.Reason = "Host changed on a kept-alive connection: " + reason
				g.emit(ev)
				pc.cut()
				return errCut
			}
			ev.Allowed, ev.Reason = true, d.Reason
			g.emit(ev)
		}
		if _, err := up.Write(block); err != nil {
			return err
		}
		switch {
		case h.chunked:
			if err := copyChunked(up, br); err != nil {
				return g.denyHTTP(sb, pc, h.host, err.Error())
			}
		case h.length > 0:
			// What br holds, then the rest straight from the client
			// connection, which up.ReadFrom splices (br's peeked bytes
			// went into its buffer on its first fill: it is larger).
			n := min(int64(br.Buffered()), h.length)
			if _, err := io.CopyN(up, br, n); err != nil {
				return err
			}
			if _, err := io.CopyN(up, pc.client, h.length-n); err != nil {
				return err
			}
		}
	}
}

var errCut = errors.New("connection cut")

func (g *Gateway) denyHTTP(sb *sandbox, pc *proxyConn, host, reason string) error {
	sb.mu.Lock()
	name := pc.name
	sb.mu.Unlock()
	g.emit(Event{SandboxID: sb.id, Kind: KindHTTP, Name: name, Host: host, IP: pc.dst.Addr(), Port: pc.dst.Port(), Rule: -1, Reason: reason})
	pc.cut()
	return errCut
}

// readHead reads one request header block (request line to the empty
// line) of at most maxPeek bytes, every line ending in CRLF.
func readHead(br *bufio.Reader) ([]byte, error) {
	var block []byte
	for {
		line, err := br.ReadSlice('\n')
		if len(block)+len(line) > maxPeek || errors.Is(err, bufio.ErrBufferFull) {
			return block, errTooLarge
		}
		block = append(block, line...)
		if err != nil {
			if errors.Is(err, io.EOF) {
				if len(block) == 0 {
					return nil, io.EOF
				}
				return block, io.ErrUnexpectedEOF
			}
			return block, err
		}
		if len(line) == 2 && line[0] == '\r' {
			return block, nil
		}
	}
}

type head struct {
	host    string     // the Host header as sent
	name    string     // its canonical name ("" for an IP literal)
	ip      netip.Addr // an IP literal Host
	length  int64
	chunked bool
}

// parseHead parses a request header block that ends in an empty line.
func parseHead(block []byte) (head, error) {
	var h head
	if !bytes.HasSuffix(block, []byte("\r\n\r\n")) {
		return h, errors.New("malformed HTTP request: header not ended by an empty line")
	}
	lines := bytes.Split(block[:len(block)-4], []byte("\r\n"))
	for _, l := range lines {
		if bytes.IndexByte(l, '\r') >= 0 || bytes.IndexByte(l, '\n') >= 0 || bytes.IndexByte(l, 0) >= 0 {
			return h, errors.New("malformed HTTP request: bare CR, LF or NUL")
		}
	}
	parts := bytes.Split(lines[0], []byte(" "))
	if len(parts) != 3 || len(parts[0]) == 0 {
		return h, fmt.Errorf("malformed HTTP request line %.64q", lines[0])
	}
	method, target, proto := string(parts[0]), parts[1], string(parts[2])
	if proto != "HTTP/1.1" && proto != "HTTP/1.0" {
		return h, fmt.Errorf("protocol %.16q is not served (HTTP/1.0 and 1.1 are)", proto)
	}
	switch {
	case method == "CONNECT":
		return h, errors.New("CONNECT refused: the gateway is not a forward proxy")
	case len(target) > 0 && target[0] == '/':
	case method == "OPTIONS" && string(target) == "*":
	default:
		return h, fmt.Errorf("request target %.64q refused: only origin-form (a path) is served, not a proxy's absolute URI", target)
	}
	hosts, lengths := 0, 0
	for _, l := range lines[1:] {
		if len(l) == 0 || l[0] == ' ' || l[0] == '\t' {
			return h, errors.New("malformed HTTP request: folded or empty header line")
		}
		i := bytes.IndexByte(l, ':')
		if i <= 0 || !isToken(l[:i]) {
			return h, fmt.Errorf("malformed HTTP header line %.64q", l)
		}
		key, val := string(l[:i]), string(bytes.Trim(l[i+1:], " \t"))
		switch {
		case equalFold(key, "Host"):
			hosts++
			h.host = val
		case equalFold(key, "Content-Length"):
			lengths++
			n, ok := parseLength(val)
			if !ok || (lengths > 1 && n != h.length) {
				return h, fmt.Errorf("invalid Content-Length %.32q", val)
			}
			h.length = n
		case equalFold(key, "Transfer-Encoding"):
			if !equalFold(val, "chunked") || h.chunked {
				return h, fmt.Errorf("Transfer-Encoding %.32q refused (only one chunked is served)", val)
			}
			h.chunked = true
		case equalFold(key, "Upgrade"):
			return h, errors.New("protocol upgrade over plain HTTP refused (use TLS)")
		}
	}
	if h.chunked && lengths > 0 {
		return h, errors.New("request has both Content-Length and Transfer-Encoding")
	}
	if hosts != 1 {
		return h, fmt.Errorf("request has %d Host headers (exactly one is required)", hosts)
	}
	name, ip, err := hostOf(h.host)
	if err != nil {
		return h, err
	}
	h.name, h.ip = name, ip
	return h, nil
}

// hostOf splits a Host header into a canonical name or an IP literal,
// dropping the port.
func hostOf(host string) (string, netip.Addr, error) {
	bad := fmt.Errorf("invalid Host %.64q", host)
	hn := host
	if len(hn) > 0 && hn[0] == '[' {
		end := bytes.IndexByte([]byte(hn), ']')
		if end < 0 {
			return "", netip.Addr{}, bad
		}
		rest := hn[end+1:]
		if rest != "" && (rest[0] != ':' || !isPort(rest[1:])) {
			return "", netip.Addr{}, bad
		}
		ip, err := netip.ParseAddr(hn[1:end])
		if err != nil || !ip.Is6() {
			return "", netip.Addr{}, bad
		}
		return "", ip, nil
	}
	if i := bytes.LastIndexByte([]byte(hn), ':'); i >= 0 {
		if !isPort(hn[i+1:]) {
			return "", netip.Addr{}, bad
		}
		hn = hn[:i]
	}
	if ip, err := netip.ParseAddr(hn); err == nil && ip.Is4() {
		return "", ip, nil
	}
	name, ok := canonicalName(hn)
	if !ok {
		return "", netip.Addr{}, bad
	}
	return name, netip.Addr{}, nil
}

func isPort(s string) bool {
	if s == "" || len(s) > 5 {
		return false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func parseLength(s string) (int64, bool) {
	if s == "" || len(s) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

func isToken(b []byte) bool {
	for _, c := range b {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case bytes.IndexByte([]byte("!#$%&'*+-.^_`|~"), c) >= 0:
		default:
			return false
		}
	}
	return len(b) > 0
}

func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// copyChunked copies one chunked body (chunks, last chunk, trailer)
// from br to w as it is, checking its framing.
func copyChunked(w io.Writer, br *bufio.Reader) error {
	for {
		line, err := readLine(br, maxChunkLine)
		if err != nil {
			return fmt.Errorf("chunked body: %w", err)
		}
		size, ok := parseChunkSize(line[:len(line)-2])
		if !ok {
			return fmt.Errorf("chunked body: invalid chunk size line %.32q", line)
		}
		if _, err := w.Write(line); err != nil {
			return err
		}
		if size == 0 {
			// Trailer fields, then the empty line.
			total := 0
			for {
				line, err := readLine(br, maxChunkLine)
				if err != nil {
					return fmt.Errorf("chunked trailer: %w", err)
				}
				total += len(line)
				if total > maxPeek {
					return fmt.Errorf("chunked trailer larger than %d KiB", maxPeek>>10)
				}
				if _, err := w.Write(line); err != nil {
					return err
				}
				if len(line) == 2 {
					return nil
				}
			}
		}
		if _, err := io.CopyN(w, br, size); err != nil {
			return err
		}
		crlf := make([]byte, 2)
		if _, err := io.ReadFull(br, crlf); err != nil {
			return err
		}
		if crlf[0] != '\r' || crlf[1] != '\n' {
			return errors.New("chunked body: chunk not followed by CRLF")
		}
		if _, err := w.Write(crlf); err != nil {
			return err
		}
	}
}

// readLine reads a CRLF-terminated line of at most limit bytes with no
// other CR or LF.
func readLine(br *bufio.Reader, limit int) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, errors.New("line too long")
		}
		return nil, err
	}
	if len(line) > limit {
		return nil, errors.New("line too long")
	}
	if len(line) < 2 || line[len(line)-2] != '\r' || bytes.IndexByte(line[:len(line)-2], '\r') >= 0 {
		return nil, errors.New("line not ended by CRLF")
	}
	return append([]byte(nil), line...), nil
}

// parseChunkSize parses "hex[;ext]"; at most 15 hex digits.
func parseChunkSize(b []byte) (int64, bool) {
	if i := bytes.IndexByte(b, ';'); i >= 0 {
		b = b[:i]
	}
	if len(b) == 0 || len(b) > 15 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		var v byte
		switch {
		case '0' <= c && c <= '9':
			v = c - '0'
		case 'a' <= c && c <= 'f':
			v = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			v = c - 'A' + 10
		default:
			return 0, false
		}
		n = n<<4 | int64(v)
	}
	return n, true
}
