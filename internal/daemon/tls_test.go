package daemon

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/daemon/tlstest"
	"github.com/airlock/airlock/internal/workerapi"
)

// TestServerServesTLSAndWorkerTrustsCA: `airlock server --tls-cert/--tls-key`
// serves the API and the worker API over https only (the worker token and
// every key used to cross the network in cleartext), the join token comes
// from --worker-token-file (not the command line), and a worker trusting
// the CA with --tls-ca registers over https, while a client without the CA
// is refused by certificate verification.
func TestServerServesTLSAndWorkerTrustsCA(t *testing.T) {
	caFile, certFile, keyFile := tlstest.WritePKI(t, t.TempDir())
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "join.token")
	if err := os.WriteFile(tokenFile, []byte("join-from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx := t.Context()
	done := make(chan error, 1)
	t.Cleanup(func() { <-done }) // the server stops with the test's context
	go func() {
		done <- serverCmd(ctx, []string{"--listen", addr, "--data-dir", filepath.Join(dir, "data"),
			"--worker-token-file", tokenFile, "--tls-cert", certFile, "--tls-key", keyFile})
	}()

	// The worker's side: --tls-ca makes the default transport trust the CA.
	var caOnly string = caFile
	wf := &tlsFlags{cert: new(string), key: new(string), ca: &caOnly}
	if err := wf.trust(); err != nil {
		t.Fatal(err)
	}
	url := "https://" + addr
	for {
		resp, err := http.Get(url + "/healthz")
		if err == nil {
			resp.Body.Close()
			break
		}
		select {
		case err := <-done:
			t.Fatalf("server stopped: %v", err)
		case <-ctx.Done():
			t.Fatal("server did not answer https")
		case <-time.After(20 * time.Millisecond):
		}
	}
	// Plain http on the same port is not served.
	if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain http answered %d, want 400 (TLS required)", resp.StatusCode)
		}
	}
	// A client without the CA fails verification.
	bare := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{}}}
	if _, err := bare.Get(url + "/healthz"); err == nil || !errors.As(err, new(*tls.CertificateVerificationError)) {
		t.Errorf("client without the CA: %v, want a certificate verification error", err)
	}
	// Register over https with the join token from the file.
	body, _ := json.Marshal(workerapi.RegisterRequest{ID: "w-tls", DataPlaneURL: "https://127.0.0.1:7071"})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/internal/v1/workers/register", strings.NewReader(string(body)))
	req.Header.Set("Authorization", "Bearer join-from-file")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("register over https: %v", err)
	}
	defer resp.Body.Close()
	var out workerapi.RegisterResponse
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&out) != nil || out.WorkerSecret == "" {
		t.Fatalf("register over https: %s %+v", resp.Status, out)
	}
}

// TestTLSFlagsNeedBoth: a certificate without its key (or the other way
// round) is refused with what to do.
func TestTLSFlagsNeedBoth(t *testing.T) {
	cert, empty := "cert.pem", ""
	f := &tlsFlags{cert: &cert, key: &empty, ca: &empty}
	if _, err := f.serverConfig(); err == nil || !strings.Contains(err.Error(), "--tls-cert and --tls-key go together") {
		t.Errorf("cert without key: %v", err)
	}
}
