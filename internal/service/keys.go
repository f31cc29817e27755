package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/token"
)

// MaxKeyLifetime bounds a key's expires_at: a key that must outlive it has
// no expiry (and is revoked by hand).
const MaxKeyLifetime = 10 * 365 * 24 * time.Hour

// usable refuses a revoked or expired key, naming it, so that its holder
// knows which key to replace. Every request reads the key from the store
// (nothing is cached), so a revocation on one server is refused by every
// server from its next request on.
func (s *Service) usable(k model.APIKey) error {
	if k.RevokedAt != nil {
		return model.Errorf(model.ErrUnauthorized, "API key %s (%s…) was revoked at %s; ask an admin of org %s for a new key",
			k.ID, k.Prefix, k.RevokedAt.UTC().Format(time.RFC3339), k.OrgID)
	}
	if k.ExpiresAt != nil && !s.now().Before(*k.ExpiresAt) {
		return model.Errorf(model.ErrUnauthorized, "API key %s (%s…) expired at %s; ask an admin of org %s for a new key",
			k.ID, k.Prefix, k.ExpiresAt.UTC().Format(time.RFC3339), k.OrgID)
	}
	return nil
}

// keyExpiry validates a requested expiry (nil: none).
func (s *Service) keyExpiry(at *time.Time) (*time.Time, error) {
	if at == nil {
		return nil, nil
	}
	t := at.UTC()
	now := s.now()
	if !t.After(now) {
		return nil, model.Errorf(model.ErrUnprocessable, "expires_at %s is not in the future", t.Format(time.RFC3339))
	}
	if t.Sub(now) > MaxKeyLifetime {
		return nil, model.Errorf(model.ErrUnprocessable, "expires_at %s is more than %d days away; leave it out for a key that does not expire",
			t.Format(time.RFC3339), int(MaxKeyLifetime/(24*time.Hour)))
	}
	return &t, nil
}

// keyAdmin checks that p may list or revoke keys of orgID: admins of that
// org, and operators.
func keyAdmin(p Principal, orgID, verb string) error {
	if !p.Admin || (p.OrgID != orgID && !p.Operator()) {
		return model.Errorf(model.ErrForbidden, "%s keys of org %s needs an admin key of that org", verb, orgID)
	}
	return nil
}

// ListKeys returns the keys of orgID, revoked and expired ones included,
// oldest first; secrets are never stored, so never listed.
func (s *Service) ListKeys(ctx context.Context, p Principal, orgID string) ([]model.APIKey, error) {
	if err := keyAdmin(p, orgID, "listing"); err != nil {
		return nil, err
	}
	if _, err := s.st.GetOrg(ctx, orgID); errors.Is(err, model.ErrNotFound) {
		return nil, model.Errorf(model.ErrNotFound, "org %s not found", orgID)
	} else if err != nil {
		return nil, fmt.Errorf("get org %s: %w", orgID, err)
	}
	keys, err := s.st.ListAPIKeys(ctx, orgID)
	if err != nil {
		return nil, fmt.Errorf("list keys of %s: %w", orgID, err)
	}
	return keys, nil
}

// RevokeKey revokes key keyID of orgID at once: every server refuses it
// from its next request on. Revoking a revoked key is a no-op that returns
// it. An operator cannot revoke the last usable admin key of the default
// org with that key itself (nobody could administer the installation).
func (s *Service) RevokeKey(ctx context.Context, p Principal, orgID, keyID string) (model.APIKey, error) {
	if err := keyAdmin(p, orgID, "revoking"); err != nil {
		return model.APIKey{}, err
	}
	if orgID == DefaultOrgID && keyID == p.KeyID {
		keys, err := s.st.ListAPIKeys(ctx, orgID)
		if err != nil {
			return model.APIKey{}, fmt.Errorf("list keys of %s: %w", orgID, err)
		}
		others := 0
		for _, k := range keys {
			if k.Admin && k.ID != keyID && s.usable(k) == nil {
				others++
			}
		}
		if others == 0 {
			return model.APIKey{}, withHint(model.Errorf(model.ErrConflict,
				"key %s is the last usable admin key of org %s; create another admin key first", keyID, orgID),
				Hint{Kind: HintCreateAdminKey, OrgID: orgID})
		}
	}
	k, err := s.st.RevokeAPIKey(ctx, orgID, keyID, s.now())
	if errors.Is(err, model.ErrNotFound) {
		return model.APIKey{}, model.Errorf(model.ErrNotFound, "org %s has no key %s", orgID, keyID)
	}
	if err != nil {
		return model.APIKey{}, fmt.Errorf("revoke key %s: %w", keyID, err)
	}
	s.logger().Info("API key revoked", "key", k.ID, "org", k.OrgID, "by", p.KeyID)
	return k, nil
}

// SignWorkerToken signs c with the current data-plane key (c.Worker names
// the worker whose key it is derived with): for the sandbox router, whose
// own key signs only the envd access tokens it hands to clients.
func (s *Service) SignWorkerToken(ctx context.Context, c token.Claims) (string, error) {
	return s.sign(ctx, c)
}
