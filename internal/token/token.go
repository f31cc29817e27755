// Package token signs and verifies data-plane tokens: short-lived,
// sandbox-scoped capabilities the server hands to clients (and uses itself)
// so that workers, which never see the database, can authorize data-plane
// requests. A token is "v1.<base64url(JSON claims)>.<base64url(HMAC-SHA256)>".
//
// The server holds the installation's master key; a worker never does. Each
// worker gets its own key, WorkerKey(master, id), and a token for a sandbox
// on worker W names W (Claims.Worker) and is signed with W's key, so a
// worker cannot mint a token that another worker accepts.
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
	// Worker is the worker the token is for: Sign signs with
	// WorkerKey(key, Worker) when it is set.
	Worker string `json:"wid,omitempty"`
}

// WorkerKey derives worker workerID's data-plane key from the master key:
// HMAC-SHA256(master, "airlock worker key v1\x00" + workerID). Knowing one
// worker's key tells nothing of another's or of the master.
func WorkerKey(master []byte, workerID string) []byte {
	h := hmac.New(sha256.New, master)
	h.Write([]byte("airlock worker key v1\x00" + workerID))
	return h.Sum(nil)
}

// NewKey returns a fresh random signing key.
func NewKey() []byte {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		panic(err)
	}
	return k
}

// Sign returns the token for c, signed with key, or with
// WorkerKey(key, c.Worker) when c names a worker (key is then the master).
func Sign(key []byte, c Claims) (string, error) {
	if c.Worker != "" {
		key = WorkerKey(key, c.Worker)
	}
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
