package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/egress/egresstest"
	"github.com/airlock/airlock/internal/testenv"
)

// TestEgressIntercept: a gVisor sandbox whose policy intercepts TLS to
// www.test.airlock reaches it with curl (HTTP/1.1 and HTTP/2) and python3
// urllib, verifying the gateway's leaf against its trust store (the org
// CA is in the system bundle and SSL_CERT_FILE from the start); the
// upstream receives the Authorization header from the org's secret, whose
// value is nowhere in the guest (env, files, /proc); a Host other than
// the SNI is refused; an upstream with a certificate the gateway does not
// trust is answered 502 and logged.
func TestEgressIntercept(t *testing.T) { egressIntercept(t, "gvisor") }

// TestEgressInterceptQEMU is TestEgressIntercept on a QEMU sandbox (TCG),
// whose policy becomes an intercepting one after it started (the worker
// wrote the org CA into the guest's bundle at start).
func TestEgressInterceptQEMU(t *testing.T) {
	testenv.RequireQEMU(t)
	egressIntercept(t, "qemu")
}

func egressIntercept(t *testing.T, rt string) {
	s := need(t)
	in := egresstest.Start(t, egresstest.Config{})
	c, logPath := egressUp(t, s, in, "public", rt, "--egress-ca-bundle", in.CAFile)

	b := make([]byte, 12)
	rand.Read(b)
	secret := "Bearer e2e-" + hex.EncodeToString(b)
	req, _ := http.NewRequest("PUT", c.BaseURL+"/v1/secrets/api", strings.NewReader(`{"value":"`+secret+`"}`))
	req.Header.Set("Authorization", "Bearer "+c.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("put secret: %d %s", resp.StatusCode, body)
	}

	www, bad := egresstest.Name(egresstest.WWW), egresstest.Name(egresstest.BadTLS)
	policy := `{"version":1,"default":"deny","rules":[
		{"action":"allow","domains":["` + www + `"],"ports":[443],"tls":"intercept","inject":{"headers":{"Authorization":{"secret":"api"}}}},
		{"action":"allow","domains":["` + bad + `"],"ports":[443],"tls":"intercept"}]}`
	var id string
	if rt == "qemu" {
		id = newQEMUSandbox(t, c)
		if _, err := c.SetSandboxNetwork(context.Background(), id, apitypes.NetworkRequest{Policy: []byte(policy)}); err != nil {
			t.Fatal(err)
		}
		// The gateway has the CA key once the assignment reached the worker.
		for i := 0; i < 50; i++ {
			if out, _, _ := timed(t, c, id, "curl -sS -o /dev/null -w '%{http_code}' https://"+www+"/ready"); out == "200" {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	} else {
		id = newSandbox(t, c, client.CreateSandboxRequest{Network: &apitypes.NetworkRequest{Policy: []byte(policy)}}).ID
	}

	t.Run("curl and python reach the upstream, which gets the header", func(t *testing.T) {
		out, rc, ms := timed(t, c, id, "curl -sS -v --http1.1 -H 'Authorization: Bearer guest' https://"+www+"/h1 2>&1 | grep -E 'issuer|airlock-inet|HTTP/'")
		t.Logf("curl --http1.1 (%d ms): %s", ms, out)
		if rc != 0 || !strings.Contains(out, "airlock-inet") || !strings.Contains(out, "Airlock CA") {
			t.Fatalf("curl through interception: rc %d %q\n%s", rc, out, egressLog(logPath))
		}
		out, rc, _ = timed(t, c, id, "curl -sS --http2 -o /dev/null -w '%{http_version}' https://"+www+"/h2")
		if rc != 0 || out != "2" {
			t.Fatalf("curl --http2: rc %d %q", rc, out)
		}
		out, rc, _ = timed(t, c, id, `python3 -c "import urllib.request; print(urllib.request.urlopen('https://`+www+`/py', timeout=20).read().decode())"`)
		if rc != 0 || !strings.Contains(out, "airlock-inet") {
			t.Fatalf("python urllib: rc %d %q", rc, out)
		}
		seen := map[string]string{}
		for _, r := range in.Requests() {
			if r.Host == www && r.TLS {
				seen[r.Path] = r.Header.Get("Authorization")
			}
		}
		for _, p := range []string{"/h1", "/h2", "/py"} {
			if seen[p] != secret {
				t.Errorf("upstream request %s had Authorization %q, want the secret", p, seen[p])
			}
		}
	})

	t.Run("the secret is nowhere in the guest", func(t *testing.T) {
		// The needle goes to /dev/shm (not searched) so that no command
		// line of the search carries it.
		needle := strings.TrimPrefix(secret, "Bearer ")
		putFile(t, c, id, "/dev/shm/needle", needle+"\n")
		r := sh(t, c, id, `n=/dev/shm/needle
echo "env=$(env | grep -cF -f $n)"
echo "proc=$(cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' '\n' | grep -cF -f $n)"
echo "files=$(grep -rslF -f $n /etc /root /home /tmp /var /run /opt /usr/local 2>/dev/null | wc -l)"
rm -f $n; env`)
		for _, want := range []string{"env=0", "proc=0", "files=0"} {
			if !strings.Contains(r.stdout, want+"\n") {
				t.Fatalf("secret visible in the guest (want %s):\n%s", want, r.stdout)
			}
		}
		if !strings.Contains(r.stdout, "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt") {
			t.Errorf("SSL_CERT_FILE not set in the guest's environment:\n%s", r.stdout)
		}
	})

	t.Run("Host other than the SNI is refused", func(t *testing.T) {
		out, _, _ := timed(t, c, id, "curl -sS --http1.1 -o /dev/null -w '%{http_code}' -H 'Host: "+egresstest.Name(egresstest.Other)+"' https://"+www+"/front")
		if out != "421" {
			t.Fatalf("fronted request: %q", out)
		}
		for _, r := range in.Requests() {
			if r.Path == "/front" {
				t.Fatalf("fronted request reached the upstream: %+v", r)
			}
		}
	})

	t.Run("untrusted upstream certificate", func(t *testing.T) {
		out, _, _ := timed(t, c, id, "curl -sS https://"+bad+"/ -w ' code=%{http_code}'")
		if !strings.Contains(out, "code=502") || !strings.Contains(out, "not trusted") {
			t.Fatalf("bad upstream: %q", out)
		}
		if l := egressLog(logPath); !strings.Contains(l, "not trusted") {
			t.Errorf("no denial logged:\n%s", l)
		}
	})

	t.Run("an update to passthrough stops injecting", func(t *testing.T) {
		pass := `{"version":1,"default":"deny","rules":[{"action":"allow","domains":["` + www + `"],"ports":[443]}]}`
		if _, err := c.SetSandboxNetwork(context.Background(), id, apitypes.NetworkRequest{Policy: []byte(pass)}); err != nil {
			t.Fatal(err)
		}
		putFile(t, c, id, "/tmp/ca.pem", string(in.CAPEM))
		// Within a second or so the gateway passes TLS through: the
		// guest then sees the upstream's own certificate.
		var out string
		for i := 0; i < 20; i++ {
			out, _, _ = timed(t, c, id, "curl -sS --cacert /tmp/ca.pem https://"+www+"/pass; sleep 0.2")
			if strings.Contains(out, "airlock-inet") {
				break
			}
		}
		if !strings.Contains(out, "airlock-inet") {
			t.Fatalf("passthrough after update: %q", out)
		}
		for _, r := range in.Requests() {
			if r.Path == "/pass" && r.Header.Get("Authorization") != "" {
				t.Fatalf("passthrough request carried Authorization %q", r.Header.Get("Authorization"))
			}
		}
	})
}
