package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/netpolicy"
	"github.com/airlock/airlock/internal/store"
	"github.com/airlock/airlock/internal/tlsca"
	"github.com/airlock/airlock/internal/workerapi"
)

// Secrets and the org CA (docs/network.md, "Interception and secrets").
// An org's secrets are named values its admins set (write-only: listing
// shows names and times); the egress gateway injects them into
// intercepted requests as its policies' "inject" rules say. Each org has
// an Airlock CA, generated on first use and kept in the settings table:
// its certificate is in every egress sandbox's trust store, its key and
// the secrets reach only the worker hosting a sandbox whose policy
// intercepts (Egress, in that worker's sync response).

var secretName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)

// MaxSecretBytes bounds a secret's value.
const MaxSecretBytes = 16 << 10

// PutSecret creates or replaces a secret of p's org (admin keys only).
// The value is a header value: printable, no line breaks.
func (s *Service) PutSecret(ctx context.Context, p Principal, name, value string) (model.Secret, error) {
	if !p.Admin {
		return model.Secret{}, model.Errorf(model.ErrForbidden, "secrets are set with an admin key of the org")
	}
	if !secretName.MatchString(name) {
		return model.Secret{}, model.Errorf(model.ErrUnprocessable, "secret name %.80q: use 1-63 of A-Z, a-z, 0-9, '.', '_' and '-', starting with a letter or digit", name)
	}
	if value == "" || len(value) > MaxSecretBytes {
		return model.Secret{}, model.Errorf(model.ErrUnprocessable, "value: %d bytes; want 1 to %d", len(value), MaxSecretBytes)
	}
	for i := 0; i < len(value); i++ {
		if c := value[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return model.Secret{}, model.Errorf(model.ErrUnprocessable, "value: byte %d is a control character (0x%02x); a secret is injected as a header value", i, c)
		}
	}
	now := s.now()
	sec := model.Secret{OrgID: p.OrgID, Name: name, CreatedAt: now, UpdatedAt: now}
	if err := s.st.PutSecret(ctx, sec, value); err != nil {
		return model.Secret{}, fmt.Errorf("put secret %s: %w", name, err)
	}
	list, err := s.st.ListSecrets(ctx, p.OrgID)
	if err != nil {
		return model.Secret{}, err
	}
	for _, x := range list {
		if x.Name == name {
			s.kick()
			return x, nil
		}
	}
	return sec, nil
}

// ListSecrets lists p's org's secrets, without values.
func (s *Service) ListSecrets(ctx context.Context, p Principal) ([]model.Secret, error) {
	list, err := s.st.ListSecrets(ctx, p.OrgID)
	if err != nil {
		return nil, fmt.Errorf("list secrets: %w", err)
	}
	return list, nil
}

// DeleteSecret removes a secret of p's org (admin keys only). Requests
// that would inject it are answered 502 by the gateway from then on.
func (s *Service) DeleteSecret(ctx context.Context, p Principal, name string) error {
	if !p.Admin {
		return model.Errorf(model.ErrForbidden, "secrets are removed with an admin key of the org")
	}
	if err := s.st.DeleteSecret(ctx, p.OrgID, name); errors.Is(err, model.ErrNotFound) {
		return model.Errorf(model.ErrNotFound, "there is no secret %.80q", name)
	} else if err != nil {
		return err
	}
	s.kick()
	return nil
}

// OrgCACert returns the PEM certificate of p's org's Airlock CA (what
// its sandboxes trust), generating the CA on first use.
func (s *Service) OrgCACert(ctx context.Context, p Principal) (string, error) {
	cert, _, err := s.cas.Get(ctx, s.st, p.OrgID)
	return cert, err
}

// OrgCAs reads (and on first use generates) orgs' Airlock CAs, caching
// what it read: a CA never changes once stored. The zero value is ready.
type OrgCAs struct {
	mu  sync.Mutex
	cas map[string][2]string
}

type storedCA struct {
	Cert string `json:"cert"`
	Key  string `json:"key"`
}

// Get returns org's CA certificate and key (PEM).
func (c *OrgCAs) Get(ctx context.Context, st store.Settings, org string) (certPEM, keyPEM string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ca, ok := c.cas[org]; ok {
		return ca[0], ca[1], nil
	}
	cb, kb, err := tlsca.Generate("Airlock CA "+org, time.Now())
	if err != nil {
		return "", "", err
	}
	b, err := json.Marshal(storedCA{Cert: string(cb), Key: string(kb)})
	if err != nil {
		return "", "", err
	}
	v, err := st.PutSettingIfAbsent(ctx, "egress-ca/"+org, string(b))
	if err != nil {
		return "", "", fmt.Errorf("org %s CA: %w", org, err)
	}
	var sc storedCA
	if err := json.Unmarshal([]byte(v), &sc); err != nil || sc.Cert == "" || sc.Key == "" {
		return "", "", fmt.Errorf("org %s CA: the stored value is not a CA", org)
	}
	if c.cas == nil {
		c.cas = map[string][2]string{}
	}
	c.cas[org] = [2]string{sc.Cert, sc.Key}
	return sc.Cert, sc.Key, nil
}

// EgressOf is what sb's worker's gateway needs beyond its policy
// (workerapi.Assignment.Egress): nil for a sandbox without a network
// policy; the org CA's certificate otherwise; its key and the secrets the
// policy's inject rules name when a rule intercepts.
func EgressOf(ctx context.Context, st store.Tx, cas *OrgCAs, sb model.Sandbox) (*workerapi.Egress, error) {
	if sb.Network == nil || len(sb.Network.Policy) == 0 {
		return nil, nil
	}
	cert, key, err := cas.Get(ctx, st, sb.OrgID)
	if err != nil {
		return nil, err
	}
	eg := &workerapi.Egress{CACert: cert}
	pol, err := netpolicy.Parse(sb.Network.Policy)
	if err != nil {
		return eg, nil // the gateway denies what does not compile
	}
	intercepts := false
	var names []string
	for _, r := range pol.Rules {
		if r.TLS != netpolicy.Intercept {
			continue
		}
		intercepts = true
		if r.Inject != nil {
			for _, ref := range r.Inject.Headers {
				names = append(names, ref.Secret)
			}
		}
	}
	if !intercepts {
		return eg, nil
	}
	eg.CAKey = key
	if len(names) > 0 {
		if eg.Secrets, err = st.SecretValues(ctx, sb.OrgID, names); err != nil {
			return nil, err
		}
	}
	return eg, nil
}
