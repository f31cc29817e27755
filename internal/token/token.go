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
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
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
	// ScopeBuild: the server sending a template build (SandboxID is the
	// build's id) to the worker.
	ScopeBuild = "build"
	// ScopeTemplateImport: the server streaming an image archive
	// (SandboxID is the import's id) to the worker.
	ScopeTemplateImport = "template-import"
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
	// Kid names the master key the token is signed with (KeyID), so that
	// verifiers pick it among current and previous keys during a rotation.
	// Sign sets it.
	Kid string `json:"kid,omitempty"`
}

// KeyID is the public name of a master key: the first 8 bytes of its
// SHA-256, in hex.
func KeyID(master []byte) string {
	h := sha256.Sum256(master)
	return hex.EncodeToString(h[:8])
}

// Key is one verification key: the key itself, the id of the master key it
// is (or is derived from), and when it stops being accepted (zero: while
// it is current).
type Key struct {
	ID       string
	Key      []byte
	NotAfter time.Time
}

// Keys are the keys a verifier accepts: during a rotation the current one
// and, until its NotAfter, the previous one.
type Keys []Key

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

// SigningKeySetting is the store setting that holds the installation's
// first master key (base64). The server's keyring starts from it and keeps
// it for E2B envd access tokens, which live as long as their sandbox.
const SigningKeySetting = "dataplane_signing_key"

// Settings is what SigningKey needs of the store (store.Settings has it).
type Settings interface {
	PutSettingIfAbsent(ctx context.Context, key, value string) (string, error)
}

// SigningKey returns the installation's first master key from st, storing a
// fresh one if there is none yet. Every server agrees on it, because only
// the first PutSettingIfAbsent wins. The controller's keyring and the
// service's default key (service.StoreSigningKey) both read it here.
func SigningKey(ctx context.Context, st Settings) ([]byte, error) {
	v, err := st.PutSettingIfAbsent(ctx, SigningKeySetting, base64.StdEncoding.EncodeToString(NewKey()))
	if err != nil {
		return nil, fmt.Errorf("token: signing key: %w", err)
	}
	key, err := base64.StdEncoding.DecodeString(v)
	if err != nil || len(key) == 0 {
		return nil, fmt.Errorf("token: signing key: stored value is not base64: %w", errors.Join(err, model.ErrInvalid))
	}
	return key, nil
}

// Sign returns the token for c, signed with key, or with
// WorkerKey(key, c.Worker) when c names a worker (key is then the master).
// The token names key (Claims.Kid).
func Sign(key []byte, c Claims) (string, error) {
	c.Kid = KeyID(key)
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

// Verify checks tok with one key, or with the one of keys its Kid names
// (a key with an empty ID stands for any kid; a key past its NotAfter is
// not used), and returns its claims.
func Verify[K []byte | Keys](key K, tok string, now time.Time) (Claims, error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 || parts[0] != "v1" {
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
	// c is not trusted until the MAC checks: its kid only picks the key.
	ok := false
	switch k := any(key).(type) {
	case []byte:
		ok = hmac.Equal([]byte(mac(k, parts[1])), []byte(parts[2]))
	case Keys:
		for _, kk := range k {
			if kk.ID != "" && kk.ID != c.Kid || !kk.NotAfter.IsZero() && !now.Before(kk.NotAfter) {
				continue
			}
			if hmac.Equal([]byte(mac(kk.Key, parts[1])), []byte(parts[2])) {
				ok = true
				break
			}
		}
	}
	if !ok {
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
