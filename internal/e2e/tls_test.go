package e2e

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// writeTestPKI writes a CA and a certificate for 127.0.0.1 it signed.
func writeTestPKI(t *testing.T, dir string) (caFile, certFile, keyFile string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "airlock e2e CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTpl, caTpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "airlock"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	write := func(name, typ string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("cert.pem", "CERTIFICATE", der), write("key.pem", "EC PRIVATE KEY", kb)
}

// TestUpOverTLS: `airlock up --tls-cert/--tls-key` serves the API and the
// data plane over https only; the CLI, trusting the CA (SSL_CERT_FILE),
// creates a sandbox, runs a command (WebSocket over TLS to the data plane)
// and copies a file through it; plain http is refused; and nothing the
// daemon prints (stdout or stderr) contains the admin key.
func TestUpOverTLS(t *testing.T) {
	s := need(t)
	dir := t.TempDir()
	t.Cleanup(func() { syscall.Unmount(filepath.Join(dir, "runsc", "null-netns"), syscall.MNT_DETACH) })
	for _, d := range []string{"cache", "bin"} {
		if err := os.Symlink(filepath.Join(s.workerDir, d), filepath.Join(dir, d)); err != nil {
			t.Fatal(err)
		}
	}
	caFile, certFile, keyFile := writeTestPKI(t, t.TempDir())
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	url := "https://" + addr
	logPath := filepath.Join(dir, "up.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	up := exec.Command(filepath.Join(s.bin, "airlock"), "up", "--listen", addr, "--data-dir", dir, "--qemu=false",
		"--tls-cert", certFile, "--tls-key", keyFile)
	up.Stdout, up.Stderr = logf, logf
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	defer func() { kill(up, syscall.SIGTERM) }()

	pool := x509.NewCertPool()
	pemCA, _ := os.ReadFile(caFile)
	pool.AppendCertsFromPEM(pemCA)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for {
		resp, err := hc.Get(url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 && readTrim(filepath.Join(dir, "admin.key")) != "" {
				break
			}
		}
		if ctx.Err() != nil {
			b, _ := os.ReadFile(logPath)
			t.Fatalf("airlock up not healthy over https:\n%s", b)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain http answered %d, want 400", resp.StatusCode)
		}
	}

	adminKey := readTrim(filepath.Join(dir, "admin.key"))
	env := append(os.Environ(), "AIRLOCK_URL="+url, "AIRLOCK_API_KEY="+adminKey, "SSL_CERT_FILE="+caFile)
	cli := func(args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(filepath.Join(s.bin, "airlock"), args...)
		cmd.Env = env
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("airlock %v: %v", args, err)
		}
		if code := cmd.ProcessState.ExitCode(); code != 0 {
			t.Logf("airlock %v: exit %d: %s", args, code, errb.String())
		}
		return out.String(), cmd.ProcessState.ExitCode()
	}
	out, code := cli("sandbox", "create", "--json")
	if code != 0 {
		t.Fatalf("sandbox create over https: exit %d: %s", code, out)
	}
	var created struct{ Sandbox struct{ ID string } }
	if err := json.Unmarshal([]byte(out), &created); err != nil || created.Sandbox.ID == "" {
		t.Fatalf("sandbox create --json: %v: %s", err, out)
	}
	id := created.Sandbox.ID
	if out, _ := cli("exec", id, "--", "echo", "over tls"); out != "over tls\n" {
		t.Errorf("exec over wss printed %q", out)
	}
	local := filepath.Join(t.TempDir(), "f.txt")
	os.WriteFile(local, []byte("tls files\n"), 0o600)
	if out, code := cli("cp", local, id+":/home/user/f.txt"); code != 0 {
		t.Fatalf("cp in over https: %s", out)
	}
	if out, _ := cli("exec", id, "--", "cat", "/home/user/f.txt"); out != "tls files\n" {
		t.Errorf("file copied over https reads %q", out)
	}
	cli("sandbox", "rm", id)
	kill(up, syscall.SIGTERM)
	logb, _ := os.ReadFile(logPath)
	if strings.Contains(string(logb), adminKey) {
		t.Errorf("airlock up printed the admin key:\n%s", logb)
	}
	if !strings.Contains(string(logb), "AIRLOCK_URL="+url) {
		t.Errorf("airlock up did not print AIRLOCK_URL=%s:\n%s", url, logb)
	}
}
