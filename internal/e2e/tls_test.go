package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock/airlock/internal/daemon/tlstest"
)

// TestUpOverTLS: `airlock up --tls-cert/--tls-key` serves the API and the
// data plane over https only; the CLI, trusting the CA (SSL_CERT_FILE),
// creates a sandbox, runs a command (WebSocket over TLS to the data plane)
// and copies a file through it; plain http is refused; and nothing the
// daemon prints (stdout or stderr) contains the admin key.
func TestUpOverTLS(t *testing.T) {
	s := need(t)
	u := newUp(t, s, "https")
	dir, addr, url, logPath := u.dir, u.addr, u.url, u.logPath
	caFile, certFile, keyFile := tlstest.WritePKI(t, t.TempDir())
	// The CLI trusts the CA through SSL_CERT_FILE; the health check here, through hc.
	pool := x509.NewCertPool()
	pemCA, _ := os.ReadFile(caFile)
	pool.AppendCertsFromPEM(pemCA)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	up := u.start(t, s, hc, "--qemu=false", "--tls-cert", certFile, "--tls-key", keyFile)
	defer func() { kill(up, syscall.SIGTERM) }()
	if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain http answered %d, want 400", resp.StatusCode)
		}
	}

	adminKey := readTrim(filepath.Join(dir, "admin.key"))
	env := append(os.Environ(), "AIRLOCK_URL="+url, "AIRLOCK_API_KEY="+adminKey, "SSL_CERT_FILE="+caFile)
	cli := airlockCLI(t, s, env)
	out, code := cli("", "sandbox", "create", "--json")
	if code != 0 {
		t.Fatalf("sandbox create over https: exit %d: %s", code, out)
	}
	var created struct{ Sandbox struct{ ID string } }
	if err := json.Unmarshal([]byte(out), &created); err != nil || created.Sandbox.ID == "" {
		t.Fatalf("sandbox create --json: %v: %s", err, out)
	}
	id := created.Sandbox.ID
	if out, _ := cli("", "exec", id, "--", "echo", "over tls"); out != "over tls\n" {
		t.Errorf("exec over wss printed %q", out)
	}
	local := filepath.Join(t.TempDir(), "f.txt")
	os.WriteFile(local, []byte("tls files\n"), 0o600)
	if out, code := cli("", "cp", local, id+":/home/user/f.txt"); code != 0 {
		t.Fatalf("cp in over https: %s", out)
	}
	if out, _ := cli("", "exec", id, "--", "cat", "/home/user/f.txt"); out != "tls files\n" {
		t.Errorf("file copied over https reads %q", out)
	}
	cli("", "sandbox", "rm", id)
	kill(up, syscall.SIGTERM)
	logb, _ := os.ReadFile(logPath)
	if strings.Contains(string(logb), adminKey) {
		t.Errorf("airlock up printed the admin key:\n%s", logb)
	}
	if !strings.Contains(string(logb), "AIRLOCK_URL="+url) {
		t.Errorf("airlock up did not print AIRLOCK_URL=%s:\n%s", url, logb)
	}
}
