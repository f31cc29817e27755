package service

import (
	"context"
	"fmt"
	"net/url"
	"sort"

	"github.com/airlock/airlock/internal/model"
)

// Route returns sandbox id of any org, for the sandbox traffic router: it
// authorizes by the sandbox's traffic or envd token (CheckTraffic), not by
// an API key, so it cannot go through GetSandbox. A missing sandbox wraps
// model.ErrNotFound.
func (s *Service) Route(ctx context.Context, id string) (model.Sandbox, error) {
	sb, err := s.st.GetSandbox(ctx, id)
	if err != nil {
		return model.Sandbox{}, fmt.Errorf("route sandbox %s: %w", id, err)
	}
	return sb, nil
}

// DataPlaneURL returns the base URL of worker id's data plane ("" if the
// worker registered none).
func (s *Service) DataPlaneURL(ctx context.Context, id string) (string, error) {
	w, err := s.st.GetWorker(ctx, id)
	if err != nil {
		return "", err // the store's words: "worker … not found"
	}
	return w.DataPlaneURL, nil
}

// DataPlaneOrigins returns the origins (scheme://host:port) of every
// registered worker's data plane, each also in its WebSocket form (ws:,
// wss:), sorted: what the web console may connect to besides its own
// origin (internal/ui puts them in its Content-Security-Policy). It needs
// no principal: worker addresses are handed to every key in attach URLs.
func (s *Service) DataPlaneOrigins(ctx context.Context) ([]string, error) {
	ws, err := s.st.ListWorkers(ctx)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, w := range ws {
		u, err := url.Parse(w.DataPlaneURL)
		if err != nil || u.Host == "" {
			continue
		}
		var alt string
		switch u.Scheme {
		case "http":
			alt = "ws"
		case "https":
			alt = "wss"
		default:
			continue
		}
		seen[u.Scheme+"://"+u.Host] = true
		seen[alt+"://"+u.Host] = true
	}
	out := make([]string, 0, len(seen))
	for o := range seen {
		out = append(out, o)
	}
	sort.Strings(out)
	return out, nil
}
