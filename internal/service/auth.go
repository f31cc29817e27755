package service

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/airlock/airlock/internal/model"
)

// The org every installation starts with. Admin keys of this org operate
// the installation: they alone may create and list all orgs.
const (
	DefaultOrgID   = "org-default"
	DefaultOrgName = "default"
)

// settingBootstrapKey records the hash of the admin key Bootstrap created,
// so that it creates one only once per installation.
const settingBootstrapKey = "bootstrap_admin_key_hash"

// keyPrefix starts every native API key secret, E2BKeyPrefix every
// E2B-shaped one; 40 lowercase hex characters follow.
const (
	keyPrefix    = "al_"
	E2BKeyPrefix = "e2b_"
)

// Principal is an authenticated caller.
type Principal struct {
	OrgID string
	KeyID string
	Admin bool
}

// Operator reports whether p may administer the whole installation (an
// admin key of the default org).
func (p Principal) Operator() bool { return p.Admin && p.OrgID == DefaultOrgID }

// HashKey returns the hex sha256 of an API key secret, as stored.
func HashKey(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

func newSecret() string { return newSecretWith(keyPrefix) }

func newSecretWith(prefix string) string {
	b := make([]byte, 20)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return prefix + hex.EncodeToString(b)
}

// wellFormedKey accepts native keys (al_…) and E2B-shaped keys (e2b_…),
// each with 40 lowercase hex characters.
func wellFormedKey(s string) bool {
	prefix := keyPrefix
	if strings.HasPrefix(s, E2BKeyPrefix) {
		prefix = E2BKeyPrefix
	}
	if len(s) != len(prefix)+40 || !strings.HasPrefix(s, prefix) {
		return false
	}
	for _, c := range s[len(prefix):] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// Authenticate resolves an API key secret (the bearer token) to its
// principal and charges one request to the key's rate limit. Unknown or
// malformed keys are model.ErrUnauthorized; an exhausted limit is a
// *RateLimitError wrapping model.ErrRateLimited.
func (s *Service) Authenticate(ctx context.Context, bearer string) (Principal, error) {
	if bearer == "" {
		return Principal{}, model.Errorf(model.ErrUnauthorized, "missing API key; send \"Authorization: Bearer al_…\"")
	}
	if !wellFormedKey(bearer) {
		return Principal{}, model.Errorf(model.ErrUnauthorized, "invalid API key")
	}
	k, err := s.st.GetAPIKeyByHash(ctx, HashKey(bearer))
	if errors.Is(err, model.ErrNotFound) {
		return Principal{}, model.Errorf(model.ErrUnauthorized, "invalid API key")
	}
	if err != nil {
		return Principal{}, fmt.Errorf("look up API key: %w", err)
	}
	if err := s.usable(k); err != nil {
		return Principal{}, err
	}
	if err := s.limiter.allow(k.ID, s.rate(), s.burst(), s.now()); err != nil {
		return Principal{}, err
	}
	return Principal{OrgID: k.OrgID, KeyID: k.ID, Admin: k.Admin}, nil
}

// Bootstrap makes sure the default org exists and, on the first call in an
// installation, creates an admin key for it and returns its secret with
// created=true. Later calls return created=false and no secret (the server
// keeps only hashes).
func (s *Service) Bootstrap(ctx context.Context) (adminSecret string, created bool, err error) {
	if _, err := s.st.GetOrg(ctx, DefaultOrgID); errors.Is(err, model.ErrNotFound) {
		err := s.st.CreateOrg(ctx, model.Org{ID: DefaultOrgID, Name: DefaultOrgName, CreatedAt: s.now()})
		if err != nil && !errors.Is(err, model.ErrConflict) {
			return "", false, fmt.Errorf("bootstrap: create default org: %w", err)
		}
	} else if err != nil {
		return "", false, fmt.Errorf("bootstrap: get default org: %w", err)
	}
	if err := EnsurePoolOrg(ctx, s.st, s.now()); err != nil {
		return "", false, fmt.Errorf("bootstrap: %w", err)
	}
	secret := newSecret()
	hash := HashKey(secret)
	stored, err := s.st.PutSettingIfAbsent(ctx, settingBootstrapKey, hash)
	if err != nil {
		return "", false, fmt.Errorf("bootstrap: record admin key: %w", err)
	}
	if stored != hash {
		// Already bootstrapped. If the recorded key is missing (an earlier
		// bootstrap stopped between the two writes), say so; callers mint
		// a fresh admin key with CreateKey if they need one.
		if _, err := s.st.GetAPIKeyByHash(ctx, stored); errors.Is(err, model.ErrNotFound) {
			s.logger().Warn("bootstrap: the recorded admin key does not exist; create one with an operator principal", "setting", settingBootstrapKey)
		} else if err != nil {
			return "", false, fmt.Errorf("bootstrap: check admin key: %w", err)
		}
		return "", false, nil
	}
	key := model.APIKey{
		ID: model.NewID("key"), OrgID: DefaultOrgID, Name: "admin", Prefix: secret[:len(keyPrefix)+8],
		Hash: hash, Admin: true, CreatedAt: s.now(),
	}
	if err := s.st.CreateAPIKey(ctx, key); err != nil {
		return "", false, fmt.Errorf("bootstrap: create admin key: %w", err)
	}
	return secret, true, nil
}

// CreateOrg creates an org. Only operators (admin keys of the default org)
// may.
func (s *Service) CreateOrg(ctx context.Context, p Principal, name string) (model.Org, error) {
	if !p.Operator() {
		return model.Org{}, model.Errorf(model.ErrForbidden, "creating orgs needs an admin key of the %q org", DefaultOrgName)
	}
	name = strings.TrimSpace(name)
	if name == "" || len(name) > 128 {
		return model.Org{}, model.Errorf(model.ErrUnprocessable, "org name must be 1 to 128 characters")
	}
	org := model.Org{ID: model.NewID("org"), Name: name, CreatedAt: s.now()}
	if err := s.st.CreateOrg(ctx, org); err != nil {
		return model.Org{}, fmt.Errorf("create org: %w", err)
	}
	return org, nil
}

// ListOrgs lists every org for operators, and the caller's own org for other
// admins.
func (s *Service) ListOrgs(ctx context.Context, p Principal) ([]model.Org, error) {
	if !p.Admin {
		return nil, model.Errorf(model.ErrForbidden, "listing orgs needs an admin key")
	}
	if !p.Operator() {
		org, err := s.st.GetOrg(ctx, p.OrgID)
		if err != nil {
			return nil, fmt.Errorf("get org %s: %w", p.OrgID, err)
		}
		return []model.Org{org}, nil
	}
	orgs, err := s.st.ListOrgs(ctx)
	if err != nil {
		return nil, fmt.Errorf("list orgs: %w", err)
	}
	// The internal warm-pool org is not a tenant.
	out := orgs[:0]
	for _, o := range orgs {
		if o.ID != PoolOrgID {
			out = append(out, o)
		}
	}
	return out, nil
}

// CreateKey creates an API key in orgID and returns it with its secret,
// which is not retrievable later. Admins may create keys in their own org;
// operators in any org.
func (s *Service) CreateKey(ctx context.Context, p Principal, orgID, name string, admin bool) (model.APIKey, string, error) {
	return s.CreateKeyWith(ctx, p, orgID, KeyOptions{Name: name, Admin: admin})
}

// KeyOptions describe a key to create.
type KeyOptions struct {
	Name  string
	Admin bool
	// E2B issues an E2B-shaped secret (e2b_ and 40 hex characters), which the
	// E2B SDKs accept (the Python SDK checks the format).
	E2B bool
	// ExpiresAt, when set, is when the key stops working; it must be in the
	// future and at most MaxKeyLifetime away.
	ExpiresAt *time.Time
}

// CreateKeyWith is CreateKey with every option.
func (s *Service) CreateKeyWith(ctx context.Context, p Principal, orgID string, o KeyOptions) (model.APIKey, string, error) {
	name, admin := o.Name, o.Admin
	if !p.Admin || (p.OrgID != orgID && !p.Operator()) {
		return model.APIKey{}, "", model.Errorf(model.ErrForbidden, "creating keys in org %s needs an admin key of that org", orgID)
	}
	if orgID == PoolOrgID {
		return model.APIKey{}, "", model.Errorf(model.ErrForbidden, "org %s is internal (it owns warm-pool sandboxes); it has no keys", orgID)
	}
	if len(name) > 128 {
		return model.APIKey{}, "", model.Errorf(model.ErrUnprocessable, "key name must be at most 128 characters")
	}
	exp, err := s.keyExpiry(o.ExpiresAt)
	if err != nil {
		return model.APIKey{}, "", err
	}
	if _, err := s.st.GetOrg(ctx, orgID); errors.Is(err, model.ErrNotFound) {
		return model.APIKey{}, "", model.Errorf(model.ErrNotFound, "org %s not found", orgID)
	} else if err != nil {
		return model.APIKey{}, "", fmt.Errorf("get org %s: %w", orgID, err)
	}
	prefix := keyPrefix
	if o.E2B {
		prefix = E2BKeyPrefix
	}
	secret := newSecretWith(prefix)
	key := model.APIKey{
		ID: model.NewID("key"), OrgID: orgID, Name: name, Prefix: secret[:len(prefix)+8],
		Hash: HashKey(secret), Admin: admin, CreatedAt: s.now(), ExpiresAt: exp,
	}
	if err := s.st.CreateAPIKey(ctx, key); err != nil {
		return model.APIKey{}, "", fmt.Errorf("create key: %w", err)
	}
	return key, secret, nil
}

func (s *Service) rate() float64 {
	if s.cfg.RateLimit != 0 {
		return s.cfg.RateLimit
	}
	return DefaultRateLimit
}

func (s *Service) burst() float64 {
	if s.cfg.RateBurst > 0 {
		return float64(s.cfg.RateBurst)
	}
	return DefaultRateBurst
}

// RateLimitError is returned when a key has used up its request budget.
type RateLimitError struct {
	KeyID      string
	RetryAfter time.Duration
}

func (e *RateLimitError) Error() string {
	return fmt.Sprintf("rate limit exceeded for API key %s; retry after %s", e.KeyID, e.RetryAfter)
}

func (e *RateLimitError) Unwrap() error { return model.ErrRateLimited }

// limiter is a token bucket per API key, in memory (each server replica
// limits on its own).
type limiter struct {
	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64
	last   time.Time
}

func (l *limiter) allow(key string, rate, burst float64, now time.Time) error {
	if rate < 0 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buckets == nil {
		l.buckets = make(map[string]*bucket)
	}
	b, ok := l.buckets[key]
	if !ok {
		b = &bucket{tokens: burst, last: now}
		l.buckets[key] = b
	}
	if el := now.Sub(b.last).Seconds(); el > 0 {
		b.tokens = math.Min(burst, b.tokens+el*rate)
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return nil
	}
	wait := time.Duration(math.Ceil((1-b.tokens)/rate)) * time.Second
	return &RateLimitError{KeyID: key, RetryAfter: max(wait, time.Second)}
}
