package envd

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"time"
)

// Ports returns the handler of /ports/{port}/…: an HTTP reverse proxy to
// 127.0.0.1:{port} inside the sandbox, with the rest of the path (and the
// query) unchanged, so a server a process started in the sandbox is reachable
// through the agent. HTTP/1.1 upgrades (WebSocket) are proxied too when the
// request reaches the agent over HTTP/1.1; over the agent's HTTP/2 channel
// use Tunnel.
func Ports() http.Handler {
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			port := pr.In.PathValue("port")
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = net.JoinHostPort("127.0.0.1", port)
			rest := "/" + pr.In.PathValue("rest")
			pr.Out.URL.Path = rest
			pr.Out.URL.RawPath = ""
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
		},
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writeHTTPError(w, http.StatusBadGateway, "port "+r.PathValue("port")+" in the sandbox: "+err.Error())
		},
	}
	m := http.NewServeMux()
	m.HandleFunc("/ports/{port}/{rest...}", func(w http.ResponseWriter, r *http.Request) {
		if _, err := parsePort(r.PathValue("port")); err != nil {
			writeHTTPError(w, http.StatusBadRequest, err.Error())
			return
		}
		rp.ServeHTTP(w, r)
	})
	m.HandleFunc("/ports/{port}", func(w http.ResponseWriter, r *http.Request) {
		u := *r.URL
		u.Path += "/"
		http.Redirect(w, r, u.String(), http.StatusTemporaryRedirect)
	})
	return m
}

func parsePort(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 {
		return 0, errors.New("port " + strconv.Quote(s) + " is not a TCP port number")
	}
	return n, nil
}

// Tunnel wraps next: an HTTP/2 CONNECT request for 127.0.0.1:{port} (or
// localhost:{port}) becomes a TCP connection to that port inside the
// sandbox, carried by the request and response bodies; everything else goes
// to next. The data plane uses it for WebSocket and other raw traffic to
// user ports.
func Tunnel(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect || r.ProtoMajor != 2 {
			next.ServeHTTP(w, r)
			return
		}
		host, port, err := net.SplitHostPort(r.Host)
		if err == nil {
			_, err = parsePort(port)
		}
		if err != nil || (host != "127.0.0.1" && host != "localhost" && host != "::1") {
			writeHTTPError(w, http.StatusBadRequest, "CONNECT needs 127.0.0.1:<port>")
			return
		}
		var d net.Dialer
		c, err := d.DialContext(r.Context(), "tcp", net.JoinHostPort("127.0.0.1", port))
		if err != nil {
			writeHTTPError(w, http.StatusBadGateway, "port "+port+" in the sandbox: "+err.Error())
			return
		}
		defer c.Close()
		// A reset stream or a gone client ends the tunnel even if the port
		// never closes its side.
		stop := context.AfterFunc(r.Context(), func() { _ = c.SetDeadline(time.Now()) })
		defer stop()
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		_ = rc.Flush()
		done := make(chan struct{})
		go func() {
			defer close(done)
			if _, err := io.Copy(c, r.Body); err != nil {
				_ = c.SetDeadline(time.Now()) // the client side broke: end both directions
				return
			}
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
		}()
		buf := make([]byte, 32<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if _, werr := w.Write(buf[:n]); werr != nil {
					break
				}
				if rc.Flush() != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		_ = c.SetDeadline(time.Now())
		r.Body.Close()
		<-done
	})
}
