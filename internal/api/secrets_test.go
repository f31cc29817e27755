package api_test

import (
	"crypto/x509"
	"encoding/pem"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/model"
)

func TestSecretsAPI(t *testing.T) {
	e := newEnv(t)
	base := e.srv.URL
	oc, _ := e.orgClient("sec", true)
	admin := oc.APIKey
	mc, _ := e.orgClient("sec-member", false)
	other := mc.APIKey

	const value = "Bearer sk-very-secret-value"
	if st, _, eb := raw(t, "PUT", base+"/v1/secrets/openai", admin, `{"value":"`+value+`"}`); st != 200 {
		t.Fatalf("put: %d %q", st, eb.Message)
	}
	for _, tc := range []struct {
		name, path, body string
		want             int
	}{
		{"bad name", "/v1/secrets/bad!name", `{"value":"x"}`, 422},
		{"empty value", "/v1/secrets/empty", `{"value":""}`, 422},
		{"line break in value", "/v1/secrets/crlf", `{"value":"a\r\nX-Evil: 1"}`, 422},
		{"unknown field", "/v1/secrets/x", `{"value":"x","extra":1}`, 400},
	} {
		if st, _, eb := raw(t, "PUT", base+tc.path, admin, tc.body); st != tc.want {
			t.Errorf("%s: %d %q, want %d", tc.name, st, eb.Message, tc.want)
		}
	}
	if st, _, _ := raw(t, "PUT", base+"/v1/secrets/x", other, `{"value":"x"}`); st != 403 {
		t.Errorf("non-admin key puts a secret: %d, want 403", st)
	}

	req, _ := http.NewRequest("GET", base+"/v1/secrets", nil)
	req.Header.Set("Authorization", "Bearer "+admin)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"openai"`) || strings.Contains(string(body), "sk-very-secret") {
		t.Fatalf("list: %d %s", resp.StatusCode, body)
	}
	var theirs struct{ Secrets []model.Secret }
	getJSON(t, base+"/v1/secrets", other, &theirs)
	if len(theirs.Secrets) != 0 {
		t.Fatalf("another org sees %+v", theirs.Secrets)
	}

	// The org's CA: a CA certificate, the same on every call, another
	// org's another.
	ca := func(key string) *x509.Certificate {
		req, _ := http.NewRequest("GET", base+"/v1/network/ca", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		blk, _ := pem.Decode(b)
		if resp.StatusCode != 200 || blk == nil {
			t.Fatalf("ca: %d %q", resp.StatusCode, b)
		}
		if strings.Contains(string(b), "PRIVATE") {
			t.Fatal("the CA's private key was served")
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil || !c.IsCA {
			t.Fatalf("ca: %v %+v", err, c)
		}
		return c
	}
	a1, a2, b1 := ca(admin), ca(admin), ca(other)
	if !a1.Equal(a2) || a1.Equal(b1) {
		t.Fatal("an org's CA changed between calls, or two orgs share one")
	}

	if st, _, _ := raw(t, "DELETE", base+"/v1/secrets/openai", other, ""); st != 403 {
		t.Errorf("non-admin deletes: %d", st)
	}
	if st, _, _ := raw(t, "DELETE", base+"/v1/secrets/openai", admin, ""); st != 204 {
		t.Errorf("delete: %d", st)
	}
	if st, _, _ := raw(t, "DELETE", base+"/v1/secrets/openai", admin, ""); st != 404 {
		t.Errorf("delete again: %d", st)
	}
}
