package daemon

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
)

// tlsFlags are --tls-cert, --tls-key (serve the role's listener over TLS)
// and --tls-ca (trust this CA, besides the system's, when calling other
// Airlock processes over https).
type tlsFlags struct {
	cert, key, ca *string
}

func addTLSFlags(fs *flag.FlagSet, what string) *tlsFlags {
	return &tlsFlags{
		cert: fs.String("tls-cert", "", "PEM certificate (chain) `file`: serve "+what+" over TLS (https); needs --tls-key"),
		key:  fs.String("tls-key", "", "PEM private key `file` of --tls-cert"),
		ca:   fs.String("tls-ca", "", "PEM CA `file` to trust, besides the system's, for https calls to other Airlock processes"),
	}
}

// serverConfig returns the TLS configuration of the listener, or nil when
// --tls-cert is not set.
func (t *tlsFlags) serverConfig() (*tls.Config, error) {
	switch {
	case *t.cert == "" && *t.key == "":
		return nil, nil
	case *t.cert == "" || *t.key == "":
		return nil, errors.New("--tls-cert and --tls-key go together: give both files, or neither for plain http")
	}
	cert, err := tls.LoadX509KeyPair(*t.cert, *t.key)
	if err != nil {
		return nil, fmt.Errorf("load --tls-cert %s / --tls-key %s: %w", *t.cert, *t.key, err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}, nil
}

// trust adds --tls-ca to the roots of http.DefaultTransport, which every
// outgoing call of this process uses (worker API, data-plane calls and the
// router's proxy to workers, WebSocket dials).
func (t *tlsFlags) trust() error {
	if *t.ca == "" {
		return nil
	}
	pem, err := os.ReadFile(*t.ca)
	if err != nil {
		return fmt.Errorf("read --tls-ca: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("--tls-ca %s holds no PEM certificate", *t.ca)
	}
	tr, ok := http.DefaultTransport.(*http.Transport)
	if !ok {
		return errors.New("--tls-ca: the default HTTP transport is not an *http.Transport")
	}
	cfg := tr.TLSClientConfig.Clone()
	if cfg == nil {
		cfg = &tls.Config{}
	}
	cfg.RootCAs = pool
	tr.TLSClientConfig = cfg
	return nil
}

// listen wraps ln in TLS when cfg is set and returns it with its URL
// scheme.
func listenTLS(ln net.Listener, cfg *tls.Config) (net.Listener, string) {
	if cfg == nil {
		return ln, "http"
	}
	return tls.NewListener(ln, cfg), "https"
}

// pinnedClient is an HTTP client that accepts exactly the certificate cfg
// serves (whatever names it carries): `airlock up`'s worker calls its own
// server over loopback with it.
func pinnedClient(cfg *tls.Config) *http.Client {
	leaf := cfg.Certificates[0].Certificate[0]
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{
		InsecureSkipVerify: true, // replaced by the pin below
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 || !bytes.Equal(raw[0], leaf) {
				return errors.New("the server's certificate is not the one this process serves")
			}
			return nil
		},
	}
	return &http.Client{Transport: tr}
}

// secretFlag resolves a secret given by file (preferred: a command line is
// visible to every user of the host in ps), environment or, discouraged,
// flag value.
func secretFlag(name, value, file, env string) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("read --%s-file: %w", name, err)
		}
		s := strings.TrimSpace(string(b))
		if s == "" {
			return "", fmt.Errorf("--%s-file %s is empty", name, file)
		}
		return s, nil
	}
	if value != "" && value != os.Getenv(env) {
		fmt.Fprintf(os.Stderr, "airlock: warning: --%s on the command line is visible to every user of this host (ps); use --%s-file or $%s\n", name, name, env)
	}
	return value, nil
}

// forgetWorkers drops the credentials of the comma-separated worker ids
// (--forget-worker), so that each can register anew with the join token.
func forgetWorkers(ctx context.Context, st store.Store, ids string, progress io.Writer) error {
	for _, id := range strings.Split(ids, ",") {
		if id = strings.TrimSpace(id); id == "" {
			continue
		}
		err := st.DeleteWorkerCredential(ctx, id)
		switch {
		case errors.Is(err, model.ErrNotFound):
			fmt.Fprintf(progress, "--forget-worker %s: that worker has no credential\n", id)
		case err != nil:
			return fmt.Errorf("--forget-worker %s: %w", id, err)
		default:
			fmt.Fprintf(progress, "dropped the credential of worker %s: it may register anew with the join token\n", id)
		}
	}
	return nil
}
