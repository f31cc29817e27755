// Package mcp is `airlock mcp`: a Model Context Protocol server whose tools
// drive an Airlock server through internal/client, exactly as any API
// client could. It serves over stdio (ServeStdio) or over MCP's streamable
// HTTP transport at /mcp (Handler, ListenAndServe).
//
// Every tool call runs as the API key the server was configured with; over
// HTTP a request's "Authorization: Bearer <key>" overrides it, and a server
// configured without a key requires one (401 otherwise). See docs/mcp.md.
package mcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock/airlock/client"
)

// Path is where the streamable HTTP transport is served.
const Path = "/mcp"

// Version is reported to MCP clients as the server implementation's version.
var Version = "dev"

// Config is the Airlock server the tools call, and as whom.
type Config struct {
	URL    string // API base URL
	APIKey string // default key; may be empty over HTTP (then every request must bring one)
}

// server holds the configuration the tools read.
type server struct {
	cfg Config
}

// NewServer returns the MCP server with every Airlock tool registered.
func NewServer(cfg Config) *mcp.Server {
	s := &server{cfg: Config{URL: strings.TrimRight(cfg.URL, "/"), APIKey: cfg.APIKey}}
	srv := mcp.NewServer(&mcp.Implementation{Name: "airlock", Title: "Airlock sandboxes", Version: Version}, &mcp.ServerOptions{
		Instructions: "Tools to create and drive Airlock sandboxes (isolated Linux machines): create_sandbox, then run_command, " +
			"read_file/write_file/list_files, and delete_sandbox when done. Tool errors carry the API's message, which says what to fix.",
	})
	s.register(srv)
	return srv
}

// ServeStdio serves one MCP session over r and w (the process's stdin and
// stdout) until the client disconnects or ctx ends.
func ServeStdio(ctx context.Context, cfg Config, r io.Reader, w io.Writer) error {
	if cfg.APIKey == "" {
		return errors.New("airlock mcp: no API key (set $AIRLOCK_API_KEY or pass --api-key)")
	}
	t := &mcp.IOTransport{Reader: io.NopCloser(r), Writer: nopWriteCloser{w}}
	err := NewServer(cfg).Run(ctx, t)
	if err != nil && (errors.Is(err, io.EOF) || ctx.Err() != nil) {
		return nil
	}
	return err
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// Handler serves the streamable HTTP transport at Path. A request's
// "Authorization: Bearer <key>" is the API key its tool calls use; without
// one, cfg.APIKey is used, and if that is empty the request is refused with
// 401.
func Handler(cfg Config) http.Handler {
	srv := NewServer(cfg)
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	mux := http.NewServeMux()
	mux.Handle(Path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if key, ok := bearer(r.Header); !ok || key == "" {
			if r.Header.Get("Authorization") != "" {
				http.Error(w, "Authorization must be \"Bearer <Airlock API key>\"", http.StatusUnauthorized)
				return
			}
			if cfg.APIKey == "" {
				w.Header().Set("WWW-Authenticate", `Bearer realm="airlock"`)
				http.Error(w, "this MCP server has no default API key: send \"Authorization: Bearer <Airlock API key>\"", http.StatusUnauthorized)
				return
			}
		}
		h.ServeHTTP(w, r)
	}))
	return mux
}

// ListenAndServe serves Handler(cfg) on addr until ctx ends. ready, if not
// nil, is called with the bound address once listening.
func ListenAndServe(ctx context.Context, cfg Config, addr string, ready func(net.Addr)) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("airlock mcp: listen: %w", err)
	}
	if ready != nil {
		ready(ln.Addr())
	}
	hs := &http.Server{Handler: Handler(cfg), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = hs.Shutdown(sctx)
		case <-done:
		}
	}()
	err = hs.Serve(ln)
	close(done)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// bearer returns the key of an "Authorization: Bearer <key>" header.
func bearer(h http.Header) (string, bool) {
	v := h.Get("Authorization")
	if v == "" {
		return "", false
	}
	scheme, key, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimSpace(key), true
}

// client returns the API client for one tool call: the request's bearer key
// over HTTP, else the configured key.
func (s *server) client(req *mcp.CallToolRequest) (*client.Client, error) {
	key := s.cfg.APIKey
	if req != nil && req.Extra != nil && req.Extra.Header != nil {
		if k, ok := bearer(req.Extra.Header); ok && k != "" {
			key = k
		}
	}
	if key == "" {
		return nil, errors.New("no Airlock API key: send \"Authorization: Bearer <key>\" or start airlock mcp with $AIRLOCK_API_KEY")
	}
	return client.New(s.cfg.URL, key), nil
}
