package worker

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

// loadSecret returns the worker's own secret: the one held, else the one
// in Config.SecretFile, else "".
func (w *Worker) loadSecret() string {
	if sp := w.secret.Load(); sp != nil {
		return *sp
	}
	if w.cfg.SecretFile == "" {
		return ""
	}
	b, err := os.ReadFile(w.cfg.SecretFile)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			w.log.Warn("read the worker secret", "file", w.cfg.SecretFile, "err", err)
		}
		return ""
	}
	s := strings.TrimSpace(string(b))
	if s != "" {
		w.secret.Store(&s)
	}
	return s
}

// storeSecret keeps the secret the server issued (in Config.SecretFile,
// 0600, written atomically) and uses it from now on.
func (w *Worker) storeSecret(s string) error {
	if w.cfg.SecretFile != "" {
		tmp := w.cfg.SecretFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(s+"\n"), 0o600); err != nil {
			return fmt.Errorf("keep the worker secret: %w", err)
		}
		if err := os.Rename(tmp, w.cfg.SecretFile); err != nil {
			return fmt.Errorf("keep the worker secret: %w", err)
		}
	}
	w.secret.Store(&s)
	w.log.Info("received this worker's own credential", "file", w.cfg.SecretFile)
	return nil
}

// setKeys installs the worker's verification keys: keys when the server
// sends them (current and, during a rotation, previous, by master key id),
// else the one key single (an older server).
func (w *Worker) setKeys(single string, keys []workerapi.SigningKey) error {
	var ks token.Keys
	for _, k := range keys {
		b, err := decodeKey(k.Key)
		if err != nil {
			return fmt.Errorf("signing key %s: %w", k.ID, err)
		}
		ks = append(ks, token.Key{ID: k.ID, Key: b, NotAfter: k.NotAfter})
	}
	if len(ks) == 0 {
		b, err := decodeKey(single)
		if err != nil {
			return err
		}
		ks = token.Keys{{Key: b}}
	}
	w.key.Store(&ks)
	return nil
}

// verifyKeys are the keys data-plane tokens are checked with.
type verifyKeys = token.Keys
