package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Defaults of a local `airlock up`.
const (
	DefaultURL     = "http://127.0.0.1:7070"
	AdminKeyFile   = "admin.key"
	envURL         = "AIRLOCK_URL"
	envAPIKey      = "AIRLOCK_API_KEY"
	envDataDir     = "AIRLOCK_DATA_DIR"
	defaultDataSub = ".local/share/airlock"
)

// Config is where the CLI sends its requests and as whom.
type Config struct {
	URL    string
	APIKey string
}

// DataDir returns $AIRLOCK_DATA_DIR, or ~/.local/share/airlock.
func DataDir(getenv func(string) string) string {
	if d := getenv(envDataDir); d != "" {
		return d
	}
	home := getenv("HOME")
	if home == "" {
		if h, err := os.UserHomeDir(); err == nil {
			home = h
		}
	}
	return filepath.Join(home, defaultDataSub)
}

// LoadConfig resolves the API URL and key: flags first, then $AIRLOCK_URL and
// $AIRLOCK_API_KEY, then the defaults of a local `airlock up` (its URL and
// the admin key it wrote to <data-dir>/admin.key).
func LoadConfig(getenv func(string) string, urlFlag, keyFlag string) (Config, error) {
	c := Config{URL: urlFlag, APIKey: keyFlag}
	if c.URL == "" {
		c.URL = getenv(envURL)
	}
	if c.URL == "" {
		c.URL = DefaultURL
	}
	c.URL = strings.TrimRight(c.URL, "/")
	if c.APIKey == "" {
		c.APIKey = getenv(envAPIKey)
	}
	if c.APIKey == "" {
		path := filepath.Join(DataDir(getenv), AdminKeyFile)
		b, err := os.ReadFile(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return Config{}, fmt.Errorf("no API key: set $%s, pass --api-key, or start `airlock up` (which writes %s)", envAPIKey, path)
		case err != nil:
			return Config{}, fmt.Errorf("read API key: %w", err)
		}
		c.APIKey = strings.TrimSpace(string(b))
		if c.APIKey == "" {
			return Config{}, fmt.Errorf("no API key: %s is empty; set $%s or pass --api-key", path, envAPIKey)
		}
	}
	return c, nil
}
