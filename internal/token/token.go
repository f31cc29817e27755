// Package token signs and verifies data-plane tokens: short-lived,
// sandbox-scoped capabilities the server hands to clients (and uses itself)
// so that workers, which never see the database, can authorize data-plane
// requests. A token is "v1.<base64url(JSON claims)>.<base64url(HMAC-SHA256)>".
package token

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/model"
)

// Scopes.
const (
	ScopeCommand = "command" // attach to one command session (Command set)
	ScopeFiles   = "files"   // file operations and command listing on one sandbox
	ScopeEnvd    = "envd"    // E2B envd and sandbox-port traffic to one sandbox
	// ScopeSnapshot: the server exporting snapshot Snapshot of the sandbox,
	// importing an archive as a snapshot of it, or dropping its snapshots.
	ScopeSnapshot = "snapshot"
)

// ErrInvalid is returned for a malformed, forged or expired token.
var ErrInvalid = errors.New("token: invalid or expired")

// Claims are what a token grants.
type Claims struct {
	SandboxID string             `json:"sid"`
	OrgID     string             `json:"org"`
	Scope     string             `json:"scope"`
	Command   *model.CommandSpec `json:"cmd,omitempty"`
	Snapshot  string             `json:"snap,omitempty"` // ScopeSnapshot export: the snapshot id
	Expires   int64              `json:"exp"`            // unix seconds
}

// NewKey returns a fresh random signing key.
func NewKey() []byte {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		panic(err)
	}
	return k
}

// Sign returns the token for c.
func Sign(key []byte, c Claims) (string, error) {
	body, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("token: encode claims: %w", err)
	}
	p := base64.RawURLEncoding.EncodeToString(body)
	return "v1." + p + "." + mac(key, p), nil
}

// Verify checks tok and returns its claims.
func Verify(key []byte, tok string, now time.Time) (Claims, error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 || parts[0] != "v1" {
		return Claims{}, ErrInvalid
	}
	if !hmac.Equal([]byte(mac(key, parts[1])), []byte(parts[2])) {
		return Claims{}, ErrInvalid
	}
	body, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return Claims{}, ErrInvalid
	}
	var c Claims
	if err := json.Unmarshal(body, &c); err != nil {
		return Claims{}, ErrInvalid
	}
	if now.Unix() >= c.Expires {
		return Claims{}, ErrInvalid
	}
	return c, nil
}

func mac(key []byte, payload string) string {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(payload))
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}
