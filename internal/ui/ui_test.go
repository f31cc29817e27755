package ui

import (
	"context"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func get(t *testing.T, h http.Handler, method, path string) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec.Result()
}

func TestConsole(t *testing.T) {
	h := Handler(Options{DataPlaneOrigins: func(context.Context) ([]string, error) {
		return []string{"http://127.0.0.1:7071", "ws://127.0.0.1:7071", "http://evil; script-src *", "wss://[::1]:9"}, nil
	}})

	r := get(t, h, "GET", "/ui")
	if r.StatusCode != http.StatusMovedPermanently || r.Header.Get("Location") != Prefix {
		t.Fatalf("/ui: %d %q, want a redirect to %s", r.StatusCode, r.Header.Get("Location"), Prefix)
	}

	r = get(t, h, "GET", "/ui/")
	body, _ := io.ReadAll(r.Body)
	if r.StatusCode != http.StatusOK || !strings.HasPrefix(r.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("/ui/: %d %s", r.StatusCode, r.Header.Get("Content-Type"))
	}
	csp := r.Header.Get("Content-Security-Policy")
	m := regexp.MustCompile(`'nonce-([A-Za-z0-9_-]{20,})'`).FindStringSubmatch(csp)
	if m == nil {
		t.Fatalf("CSP without a style nonce: %q", csp)
	}
	if !strings.Contains(string(body), `content="`+m[1]+`"`) || strings.Contains(string(body), NoncePlaceholder) {
		t.Fatalf("index.html does not carry the CSP's nonce %s:\n%s", m[1], body)
	}
	for _, want := range []string{
		"default-src 'none'", "script-src 'self'", "frame-ancestors 'none'", "base-uri 'none'",
		"connect-src 'self' http://127.0.0.1:7071 ws://127.0.0.1:7071 wss://[::1]:9",
	} {
		if !strings.Contains(csp, want) {
			t.Errorf("CSP lacks %q: %s", want, csp)
		}
	}
	if strings.Contains(csp, "evil") || strings.Contains(csp, "unsafe") {
		t.Errorf("CSP lets through a bad origin or an unsafe source: %s", csp)
	}
	if r.Header.Get("X-Content-Type-Options") != "nosniff" || r.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("headers: %v", r.Header)
	}
	if again := get(t, h, "GET", "/ui/").Header.Get("Content-Security-Policy"); again == csp {
		t.Error("two answers share a nonce")
	}

	// No inline script: every <script> of the page has a src under /ui/.
	for _, s := range regexp.MustCompile(`<script[^>]*>`).FindAllString(string(body), -1) {
		if !strings.Contains(s, `src="/ui/assets/`) {
			t.Errorf("inline or foreign script in index.html: %s", s)
		}
	}
	// Every asset index.html names is embedded and served with its type.
	refs := regexp.MustCompile(`(?:src|href)="(/ui/[^"]+)"`).FindAllStringSubmatch(string(body), -1)
	if len(refs) < 2 {
		t.Fatalf("index.html names %d assets", len(refs))
	}
	for _, ref := range refs {
		r := get(t, h, "GET", ref[1])
		if r.StatusCode != http.StatusOK {
			t.Errorf("%s: %d", ref[1], r.StatusCode)
		}
		if strings.HasSuffix(ref[1], ".js") && !strings.Contains(r.Header.Get("Content-Type"), "javascript") {
			t.Errorf("%s: Content-Type %q", ref[1], r.Header.Get("Content-Type"))
		}
		if strings.Contains(ref[1], "/assets/") && !strings.Contains(r.Header.Get("Cache-Control"), "immutable") {
			t.Errorf("%s: Cache-Control %q", ref[1], r.Header.Get("Cache-Control"))
		}
	}

	for _, p := range []string{"/ui/nope.js", "/ui/../go.mod", "/ui/assets/../index.html", "/ui/.hidden", "/uix"} {
		if r := get(t, h, "GET", p); r.StatusCode != http.StatusNotFound {
			t.Errorf("%s: %d, want 404", p, r.StatusCode)
		}
	}
	if r := get(t, h, "POST", "/ui/"); r.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /ui/: %d, want 405", r.StatusCode)
	}
}

// The committed build must be small and whole: web/test.sh checks that it
// is exactly what web/ builds to.
func TestEmbeddedBuild(t *testing.T) {
	sub, _ := fs.Sub(dist, "dist")
	total := 0
	err := fs.WalkDir(sub, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if strings.HasSuffix(p, ".map") {
			t.Errorf("source map %s in the embedded build", p)
		}
		info, _ := d.Info()
		total += int(info.Size())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if total > 1<<20 {
		t.Errorf("embedded build is %d bytes; keep it under 1 MiB", total)
	}
}
