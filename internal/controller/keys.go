package controller

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

// KeyringSetting is the settings key of the data-plane keyring: the current
// master key and, during a rotation's grace period, the previous one.
const KeyringSetting = "dataplane_signing_keys"

// DefaultKeyGrace is how long the previous data-plane key stays valid after
// a rotation: as long as the longest-lived session token (an hour), so no
// live session breaks.
const DefaultKeyGrace = time.Hour

type keyring struct {
	Current  ringKey  `json:"current"`
	Previous *ringKey `json:"previous,omitempty"`
}

type ringKey struct {
	Key      string     `json:"key"` // base64
	Created  time.Time  `json:"created"`
	RetireAt *time.Time `json:"retire_at,omitempty"`
}

func (k ringKey) bytes() ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(k.Key)
	if err != nil || len(b) == 0 {
		return nil, fmt.Errorf("controller: keyring: a key is not base64: %w", errors.Join(err, model.ErrInvalid))
	}
	return b, nil
}

// keyring reads the keyring, creating it on first use around the
// installation's first key (token.SigningKeySetting), so tokens signed before
// keyrings existed stay valid.
func (c *Controller) keyring(ctx context.Context) (keyring, string, error) {
	first, err := token.SigningKey(ctx, c.st)
	if err != nil {
		return keyring{}, "", err
	}
	init, err := json.Marshal(keyring{Current: ringKey{Key: base64.StdEncoding.EncodeToString(first), Created: c.now()}})
	if err != nil {
		return keyring{}, "", err
	}
	raw, err := c.st.PutSettingIfAbsent(ctx, KeyringSetting, string(init))
	if err != nil {
		return keyring{}, "", fmt.Errorf("controller: keyring: %w", err)
	}
	var kr keyring
	if err := json.Unmarshal([]byte(raw), &kr); err != nil {
		return keyring{}, "", fmt.Errorf("controller: keyring: %w", errors.Join(err, model.ErrInvalid))
	}
	return kr, raw, nil
}

// CurrentSigningKey returns the master key new data-plane tokens are signed
// with (the keyring's current key).
func (c *Controller) CurrentSigningKey(ctx context.Context) ([]byte, error) {
	kr, _, err := c.keyring(ctx)
	if err != nil {
		return nil, err
	}
	return kr.Current.bytes()
}

// RotateSigningKey makes a fresh master key current. The previous current
// key stays valid for grace (≤ 0: DefaultKeyGrace), so tokens handed out
// before keep working until they would have expired anyway; a key two
// rotations old is dropped at once. Workers receive the new keys with their
// next Sync. It returns the new key's id (token.KeyID).
func (c *Controller) RotateSigningKey(ctx context.Context, grace time.Duration) (string, error) {
	if grace <= 0 {
		grace = DefaultKeyGrace
	}
	for range 5 {
		kr, raw, err := c.keyring(ctx)
		if err != nil {
			return "", err
		}
		now := c.now()
		retire := now.Add(grace)
		prev := kr.Current
		prev.RetireAt = &retire
		fresh := token.NewKey()
		next := keyring{Current: ringKey{Key: base64.StdEncoding.EncodeToString(fresh), Created: now}, Previous: &prev}
		b, err := json.Marshal(next)
		if err != nil {
			return "", err
		}
		err = c.st.SwapSetting(ctx, KeyringSetting, raw, string(b))
		if errors.Is(err, model.ErrConflict) {
			continue // another server rotated at the same time: again, from its keyring
		}
		if err != nil {
			return "", fmt.Errorf("controller: rotate signing key: %w", err)
		}
		old, _ := prev.bytes()
		c.log.Info("controller: data-plane signing key rotated", "key", token.KeyID(fresh), "previous", token.KeyID(old), "previous_valid_until", retire)
		return token.KeyID(fresh), nil
	}
	return "", model.Errorf(model.ErrConflict, "rotate signing key: the keyring kept changing; try again")
}

// workerKeys are worker id's verification keys: its derived key of the
// current master and, until it retires, of the previous one.
func (c *Controller) workerKeys(ctx context.Context, id string) ([]workerapi.SigningKey, error) {
	kr, _, err := c.keyring(ctx)
	if err != nil {
		return nil, err
	}
	var out []workerapi.SigningKey
	for _, k := range []*ringKey{&kr.Current, kr.Previous} {
		if k == nil || k.RetireAt != nil && !c.now().Before(*k.RetireAt) {
			continue
		}
		master, err := k.bytes()
		if err != nil {
			return nil, err
		}
		sk := workerapi.SigningKey{ID: token.KeyID(master), Key: base64.StdEncoding.EncodeToString(token.WorkerKey(master, id))}
		if k.RetireAt != nil {
			sk.NotAfter = *k.RetireAt
		}
		out = append(out, sk)
	}
	return out, nil
}
