package service

import (
	"context"
	"fmt"

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
