// Package ui serves the web console at /ui/: the build output of web/
// (Vite), committed under dist/ and embedded, so `go build` needs no npm
// and `airlock up` serves it with no extra step. See docs/console.md.
//
// The static files need no key: the page asks for an API key, keeps it in
// sessionStorage and sends it as Authorization: Bearer on every /v1 call,
// same-origin. Command output and files come from the workers' data planes
// (other origins), which the Content-Security-Policy names one by one
// (Options.DataPlaneOrigins); nothing else may be connected to, no inline
// script runs, and the only inline styles allowed are <style> elements
// that carry the response's nonce (the terminal emulator writes its
// theme and cell metrics that way; see web/src/nonce.ts).
//
// Rebuild dist/ with `npm run build` in web/ (web/test.sh checks that the
// committed output is what the source builds to).
package ui

import (
	"bytes"
	"context"
	"crypto/rand"
	"embed"
	"encoding/base64"
	"io/fs"
	"log/slog"
	"mime"
	"net/http"
	"path"
	"regexp"
	"strings"
	"time"
)

//go:embed dist
var dist embed.FS

// Prefix is where the console is mounted.
const Prefix = "/ui/"

// NoncePlaceholder is what dist/index.html carries where each answer puts
// its style nonce.
const NoncePlaceholder = "__AIRLOCK_STYLE_NONCE__"

// Options configure the handler.
type Options struct {
	// DataPlaneOrigins lists the origins (http://host:port and its ws://
	// form) of the workers' data planes, the only origins besides the
	// server's own the page may connect to. Nil: none.
	DataPlaneOrigins func(ctx context.Context) ([]string, error)
	// Logger receives failures to list the origins (nil: slog.Default()).
	Logger *slog.Logger
}

type handler struct {
	files fs.FS
	index []byte
	opts  Options
	mod   time.Time
}

// Handler returns the console's handler, for the paths under Prefix (and
// "/ui", redirected to Prefix).
func Handler(opts Options) http.Handler {
	sub, err := fs.Sub(dist, "dist")
	if err != nil {
		panic(err) // embed pattern guarantees dist exists
	}
	index, err := fs.ReadFile(sub, "index.html")
	if err != nil {
		panic("ui: dist/index.html is missing from the embedded build: " + err.Error())
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &handler{files: sub, index: index, opts: opts, mod: time.Now()}
}

// CSP returns the Content-Security-Policy of an answer with style nonce
// nonce, allowing connections to origins besides the page's own.
func CSP(nonce string, origins []string) string {
	connect := "'self'"
	for _, o := range origins {
		connect += " " + o
	}
	return strings.Join([]string{
		"default-src 'none'",
		"script-src 'self'",
		"style-src 'self' 'nonce-" + nonce + "'",
		"img-src 'self' data:",
		"font-src 'self'",
		"connect-src " + connect,
		"base-uri 'none'",
		"form-action 'none'",
		"frame-ancestors 'none'",
	}, "; ")
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if r.URL.Path == "/ui" {
		http.Redirect(w, r, Prefix, http.StatusMovedPermanently)
		return
	}
	name, ok := strings.CutPrefix(r.URL.Path, Prefix)
	if !ok {
		http.NotFound(w, r)
		return
	}
	nonce := newNonce()
	hd := w.Header()
	hd.Set("Content-Security-Policy", CSP(nonce, h.origins(r.Context())))
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Cross-Origin-Opener-Policy", "same-origin")
	if name == "" || name == "index.html" {
		hd.Set("Content-Type", "text/html; charset=utf-8")
		hd.Set("Cache-Control", "no-store")
		body := bytes.ReplaceAll(h.index, []byte(NoncePlaceholder), []byte(nonce))
		http.ServeContent(w, r, "index.html", h.mod, bytes.NewReader(body))
		return
	}
	clean := path.Clean(name)
	if clean != name || strings.HasPrefix(clean, ".") || !fs.ValidPath(clean) {
		http.NotFound(w, r)
		return
	}
	b, err := fs.ReadFile(h.files, clean)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	if ct := mime.TypeByExtension(path.Ext(clean)); ct != "" {
		hd.Set("Content-Type", ct)
	}
	if strings.HasPrefix(clean, "assets/") {
		hd.Set("Cache-Control", "public, max-age=31536000, immutable") // content-hashed names
	} else {
		hd.Set("Cache-Control", "no-cache")
	}
	http.ServeContent(w, r, clean, h.mod, bytes.NewReader(b))
}

func (h *handler) origins(ctx context.Context) []string {
	if h.opts.DataPlaneOrigins == nil {
		return nil
	}
	o, err := h.opts.DataPlaneOrigins(ctx)
	if err != nil {
		h.opts.Logger.Warn("console: cannot list the data planes' origins for the CSP", "err", err)
		return nil
	}
	out := o[:0:0]
	for _, s := range o {
		if originRE.MatchString(s) { // nothing that could end or extend the directive
			out = append(out, s)
		}
	}
	return out
}

var originRE = regexp.MustCompile(`^(https?|wss?)://[A-Za-z0-9.\-]+(:[0-9]{1,5})?$|^(https?|wss?)://\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?$`)

func newNonce() string {
	b := make([]byte, 18)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}
