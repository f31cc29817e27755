package envd_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock/airlock/internal/agent/envd"
	fspb "github.com/airlock/airlock/internal/envdpb/filesystem"
	pb "github.com/airlock/airlock/internal/envdpb/process"
)

func TestFiles(t *testing.T) {
	for _, sb := range []*sandbox{startAgent(t), startInProcess(t)} {
		t.Run(sb.name, func(t *testing.T) {
			dir := t.TempDir()
			// Several files at once: each part's filename is its full path.
			var body bytes.Buffer
			mw := multipart.NewWriter(&body)
			files := map[string]string{
				filepath.Join(dir, "one.txt"):             "first",
				filepath.Join(dir, "deep", "er", "2.bin"): "\x00\x01second",
			}
			for path, data := range files {
				h := textproto.MIMEHeader{}
				h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename=%q`, path))
				h.Set("Content-Type", "application/octet-stream")
				pw, _ := mw.CreatePart(h)
				_, _ = pw.Write([]byte(data))
			}
			mw.Close()
			hdr := rootHeader()
			hdr.Set("Content-Type", mw.FormDataContentType())
			resp, out := sb.do(t, "POST", "/files", hdr, &body)
			var written []envd.WriteInfo
			if err := json.Unmarshal(out, &written); resp.StatusCode != 200 || err != nil || len(written) != 2 {
				t.Fatalf("POST /files multipart = %d %s", resp.StatusCode, out)
			}
			for _, w := range written {
				if _, ok := files[w.Path]; !ok || w.Type != "file" || w.Name != filepath.Base(w.Path) {
					t.Errorf("written %+v", w)
				}
			}
			for path, data := range files {
				b, err := os.ReadFile(path)
				if err != nil || string(b) != data {
					t.Errorf("%s = %q, %v; want %q", path, b, err, data)
				}
			}

			// Metadata headers become extended attributes, reported by Stat.
			var mdBody bytes.Buffer
			mdw := multipart.NewWriter(&mdBody)
			mdPart, _ := mdw.CreateFormFile("file", filepath.Join(dir, "md.txt"))
			_, _ = mdPart.Write([]byte("with metadata"))
			mdw.Close()
			hdr = rootHeader()
			hdr.Set("Content-Type", mdw.FormDataContentType())
			hdr.Set("X-Metadata-Author", "alice")
			resp, out = sb.do(t, "POST", "/files?path="+url.QueryEscape(filepath.Join(dir, "md.txt")), hdr, &mdBody)
			if resp.StatusCode != 200 || !strings.Contains(string(out), `"metadata":{"author":"alice"}`) {
				t.Fatalf("POST /files with metadata = %d %s", resp.StatusCode, out)
			}
			st, err := sb.files(codecs[0]).Stat(testCtx(t), asRoot(&fspb.StatRequest{Path: filepath.Join(dir, "md.txt")}))
			if err != nil || st.Msg.GetEntry().GetMetadata()["author"] != "alice" {
				t.Errorf("Stat metadata = %v, %v; want author alice", st, err)
			}

			// Single file with ?path=, and a raw body.
			raw := filepath.Join(dir, "raw", "r.txt")
			hdr = rootHeader()
			hdr.Set("Content-Type", "application/octet-stream")
			resp, out = sb.do(t, "POST", "/files?path="+url.QueryEscape(raw), hdr, strings.NewReader("raw body"))
			if resp.StatusCode != 200 || !strings.Contains(string(out), `"path":"`+raw+`"`) {
				t.Fatalf("POST /files raw = %d %s", resp.StatusCode, out)
			}
			// gzip-encoded raw body.
			var gz bytes.Buffer
			zw := gzip.NewWriter(&gz)
			_, _ = zw.Write([]byte("zipped"))
			zw.Close()
			hdr.Set("Content-Encoding", "gzip")
			if resp, out = sb.do(t, "POST", "/files?path="+url.QueryEscape(raw+".gz"), hdr, &gz); resp.StatusCode != 200 {
				t.Fatalf("POST /files gzip = %d %s", resp.StatusCode, out)
			}

			for _, tt := range []struct {
				path   string
				accept string
				status int
				want   string
			}{
				{raw, "", 200, "raw body"},
				{raw + ".gz", "", 200, "zipped"},
				{raw, "gzip", 200, "raw body"},
				{filepath.Join(dir, "missing"), "", 404, ""},
				{dir, "", 400, ""},
			} {
				h := rootHeader()
				if tt.accept != "" {
					h.Set("Accept-Encoding", tt.accept)
				}
				resp, out := sb.do(t, "GET", "/files?path="+url.QueryEscape(tt.path), h, nil)
				if resp.Header.Get("Content-Encoding") == "gzip" {
					zr, err := gzip.NewReader(bytes.NewReader(out))
					if err != nil {
						t.Fatal(err)
					}
					out, _ = io.ReadAll(zr)
				} else if tt.accept == "gzip" && resp.StatusCode == 200 {
					t.Errorf("GET %s with Accept-Encoding gzip: not gzipped", tt.path)
				}
				if resp.StatusCode != tt.status {
					t.Errorf("GET /files %s = %d %s, want %d", tt.path, resp.StatusCode, out, tt.status)
					continue
				}
				if tt.status == 200 && string(out) != tt.want {
					t.Errorf("GET /files %s = %q, want %q", tt.path, out, tt.want)
				}
				if tt.status != 200 {
					var e struct {
						Message string
						Code    int
					}
					if json.Unmarshal(out, &e) != nil || e.Code != tt.status || e.Message == "" {
						t.Errorf("error body %s, want {message, code: %d}", out, tt.status)
					}
				}
			}
		})
	}
}

func TestInitEnvsAndTokens(t *testing.T) {
	sb := startAgent(t)
	ctx := testCtx(t)
	resp, out := sb.do(t, "GET", "/envs", nil, nil)
	if resp.StatusCode != 200 || strings.TrimSpace(string(out)) != "{}" {
		t.Fatalf("GET /envs before init = %d %s", resp.StatusCode, out)
	}
	token := "secret-token"
	initBody := `{"envVars":{"SANDBOX_VAR":"from-init","SHARED":"init"},"accessToken":"` + token +
		`","defaultUser":"root","defaultWorkdir":"/tmp","timestamp":"2026-11-30T00:00:00Z"}`
	if resp, out = sb.do(t, "POST", "/init", http.Header{"Content-Type": {"application/json"}}, strings.NewReader(initBody)); resp.StatusCode != 204 {
		t.Fatalf("POST /init = %d %s", resp.StatusCode, out)
	}
	withToken := http.Header{"X-Access-Token": {token}}
	if resp, _ := sb.do(t, "GET", "/envs", nil, nil); resp.StatusCode != 401 {
		t.Errorf("GET /envs without the token = %d, want 401", resp.StatusCode)
	}
	resp, out = sb.do(t, "GET", "/envs", withToken, nil)
	var envs map[string]string
	if resp.StatusCode != 200 || json.Unmarshal(out, &envs) != nil || envs["SANDBOX_VAR"] != "from-init" {
		t.Fatalf("GET /envs = %d %s", resp.StatusCode, out)
	}
	if resp, _ := sb.do(t, "GET", "/health", nil, nil); resp.StatusCode != 204 {
		t.Errorf("GET /health without the token = %d, want 204", resp.StatusCode)
	}
	if resp, _ := sb.do(t, "POST", "/init", nil, strings.NewReader(`{"accessToken":"stolen"}`)); resp.StatusCode != 401 {
		t.Errorf("re-init without the current token = %d, want 401", resp.StatusCode)
	}

	// RPCs need the token; the default user and workdir and the env apply.
	pc := sb.process(codecs[0])
	if _, err := pc.List(ctx, connect.NewRequest(&pb.ListRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("List without the token: %v, want unauthenticated", err)
	}
	req := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/bash",
		Args: []string{"-l", "-c", `echo "$SANDBOX_VAR|$SHARED|$(pwd)|$(id -un)"`}, Envs: map[string]string{"SHARED": "request"}}})
	req.Header().Set("X-Access-Token", token)
	s, err := pc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	ev := drain(t, s)
	if got := ev.stdout.String(); got != "from-init|request|/tmp|root\n" {
		t.Errorf("process saw %q, want init env, request env over it, default workdir and user", got)
	}

	// Files: the header or a signature.
	path := "/tmp/airlock-envd-signed-" + strconv.Itoa(os.Getpid())
	t.Cleanup(func() { os.Remove(path) })
	q := func(op string, exp int64, user string) string {
		v := url.Values{"path": {path}, "signature": {envd.Signature(path, op, user, token, exp)}}
		if exp != 0 {
			v.Set("signature_expiration", strconv.FormatInt(exp, 10))
		}
		if user != "" {
			v.Set("username", user)
		}
		return v.Encode()
	}
	octet := http.Header{"Content-Type": {"application/octet-stream"}}
	for _, tt := range []struct {
		name   string
		method string
		query  string
		hdr    http.Header
		status int
	}{
		{"write unsigned", "POST", "path=" + url.QueryEscape(path), octet, 401},
		{"write signed", "POST", q("write", 0, ""), octet, 200},
		{"write signed with user and expiry", "POST", q("write", time.Now().Add(time.Hour).Unix(), "root"), octet, 200},
		{"write expired", "POST", q("write", time.Now().Add(-time.Minute).Unix(), ""), octet, 401},
		{"read with the write signature", "GET", q("write", 0, ""), nil, 401},
		{"read signed", "GET", q("read", 0, ""), nil, 200},
		{"read with the header", "GET", "path=" + url.QueryEscape(path), withToken, 200},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var body io.Reader
			if tt.method == "POST" {
				body = strings.NewReader("signed")
			}
			resp, out := sb.do(t, tt.method, "/files?"+tt.query, tt.hdr, body)
			if resp.StatusCode != tt.status {
				t.Fatalf("%s /files = %d %s, want %d", tt.method, resp.StatusCode, out, tt.status)
			}
		})
	}
}

// TestCORS: browsers may call envd from any origin, as with envd.
func TestCORS(t *testing.T) {
	sb := startInProcess(t)
	resp, _ := sb.do(t, "OPTIONS", "/process.Process/Start", http.Header{"Origin": {"https://app.example"},
		"Access-Control-Request-Method": {"POST"}, "Access-Control-Request-Headers": {"content-type,connect-protocol-version"}}, nil)
	if resp.StatusCode != 204 || resp.Header.Get("Access-Control-Allow-Origin") != "*" || resp.Header.Get("Access-Control-Allow-Methods") == "" {
		t.Fatalf("preflight = %d %v", resp.StatusCode, resp.Header)
	}
	resp, _ = sb.do(t, "GET", "/health", http.Header{"Origin": {"https://app.example"}}, nil)
	if resp.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Fatalf("GET /health headers %v, want Access-Control-Allow-Origin *", resp.Header)
	}
}

// TestUnsupported: envd endpoints Airlock lacks answer 501 naming the gap.
func TestUnsupported(t *testing.T) {
	sb := startAgent(t)
	resp, out := sb.do(t, "POST", "/files/compose", nil, strings.NewReader(`{}`))
	if resp.StatusCode != http.StatusNotImplemented || !strings.Contains(string(out), "/files/compose") {
		t.Fatalf("POST /files/compose = %d %s, want 501 naming the path", resp.StatusCode, out)
	}
}

func TestMetrics(t *testing.T) {
	sb := startAgent(t)
	resp, out := sb.do(t, "GET", "/metrics", nil, nil)
	var m map[string]float64
	if resp.StatusCode != 200 || json.Unmarshal(out, &m) != nil {
		t.Fatalf("GET /metrics = %d %s", resp.StatusCode, out)
	}
	for _, k := range []string{"cpu_count", "mem_total", "mem_used", "disk_total", "disk_used", "ts"} {
		if m[k] <= 0 {
			t.Errorf("metrics %s = %v, want > 0 (%s)", k, m[k], out)
		}
	}
	if _, ok := m["cpu_used_pct"]; !ok || m["mem_used"] > m["mem_total"] {
		t.Errorf("metrics %s", out)
	}
}

// startHTTPServer runs python3 -m http.server in dir on a free port.
func startHTTPServer(t *testing.T, dir string) int {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("needs python3 for a web server to proxy to")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(py, "-m", "http.server", "--bind", "127.0.0.1", strconv.Itoa(port))
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ctx := testCtx(t)
	for {
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			c.Close()
			return port
		}
		if ctx.Err() != nil {
			t.Fatalf("python http.server did not start: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestPorts(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hello.txt"), []byte("hello from port"), 0o644); err != nil {
		t.Fatal(err)
	}
	port := startHTTPServer(t, dir)
	for _, sb := range []*sandbox{startAgent(t), startInProcess(t)} {
		t.Run(sb.name, func(t *testing.T) {
			get := func(path string) (*http.Response, string) {
				req, _ := http.NewRequestWithContext(testCtx(t), "GET", sb.root+path, nil)
				resp, err := sb.hc.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp, string(b)
			}
			if resp, body := get(fmt.Sprintf("/ports/%d/hello.txt?x=1", port)); resp.StatusCode != 200 || body != "hello from port" {
				t.Errorf("GET through /ports = %d %q", resp.StatusCode, body)
			}
			if resp, body := get(fmt.Sprintf("/ports/%d/", port)); resp.StatusCode != 200 || !strings.Contains(body, "hello.txt") {
				t.Errorf("GET / through /ports = %d %q", resp.StatusCode, body)
			}
			if resp, _ := get("/ports/1/"); resp.StatusCode != http.StatusBadGateway {
				t.Errorf("GET to a closed port = %d, want 502", resp.StatusCode)
			}
			if resp, _ := get("/ports/notaport/"); resp.StatusCode != http.StatusBadRequest {
				t.Errorf("GET to a bad port = %d, want 400", resp.StatusCode)
			}
		})
	}
}

// echoUpgradeServer answers an HTTP/1.1 upgrade to "echo" (as WebSocket
// servers do with 101) and then echoes bytes.
func echoUpgradeServer(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "want Upgrade: echo", 400)
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		_ = brw.Flush()
		_, _ = io.Copy(c, brw)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

// TestUpgrade: an HTTP/1.1 upgrade (WebSocket's handshake) goes through
// /ports when the agent is reached over HTTP/1.1.
func TestUpgrade(t *testing.T) {
	port := echoUpgradeServer(t)
	sb := startInProcess(t)
	u, _ := url.Parse(sb.root)
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /ports/%d/ws HTTP/1.1\r\nHost: sandbox\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", port)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade through /ports: %v %v", resp, err)
	}
	_, _ = c.Write([]byte("ping"))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo after upgrade = %q, %v", buf, err)
	}
}

// TestTunnel: over the agent's HTTP/2 channel, CONNECT 127.0.0.1:port opens
// a TCP stream into the sandbox (the data plane's route for WebSocket).
func TestTunnel(t *testing.T) {
	port := echoUpgradeServer(t)
	sb := startAgent(t)
	pr, pw := io.Pipe()
	req, _ := http.NewRequestWithContext(testCtx(t), "CONNECT", sb.root, pr)
	req.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	resp, err := sb.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT = %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	fmt.Fprintf(pw, "GET /ws HTTP/1.1\r\nHost: sandbox\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	up, err := http.ReadResponse(br, nil)
	if err != nil || up.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade through the tunnel: %v %v", up, err)
	}
	_, _ = pw.Write([]byte("pong"))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "pong" {
		t.Fatalf("echo through the tunnel = %q, %v", buf, err)
	}
	pw.Close()

	bad, _ := http.NewRequestWithContext(testCtx(t), "CONNECT", sb.root, http.NoBody)
	bad.Host = "10.0.0.1:80"
	if resp, err := sb.hc.Do(bad); err != nil || resp.StatusCode != 400 {
		t.Fatalf("CONNECT elsewhere = %v, %v; want 400", resp, err)
	}
}
