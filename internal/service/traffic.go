package service

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strings"

	"github.com/airlock/airlock/internal/model"
)

// Sandbox-port traffic (everything the E2B router forwards to a port of a
// sandbox other than envd's 49983) needs the sandbox's traffic token unless
// the sandbox was created with public traffic (native public_traffic: true,
// E2B network.allowPublicTraffic, which defaults to true there as in E2B).
//
// The token is derived, not stored: "tt_" and the base64url HMAC-SHA256 of
// the sandbox id under the data-plane signing key, with a label that keeps it
// apart from data-plane tokens (whose MAC covers base64url text, which never
// holds the label's NUL). It is valid as long as the sandbox exists, and it
// grants nothing but the sandbox's ports: the worker never accepts it.

// TrafficTokenHeader carries a sandbox's traffic token (E2B's name; header
// names are case-insensitive).
const TrafficTokenHeader = "E2b-Traffic-Access-Token"

// trafficLabel separates traffic-token MACs from every other use of the key.
const trafficLabel = "airlock traffic token v1\x00"

// TrafficToken returns the traffic token of sandbox sb.
func (s *Service) TrafficToken(ctx context.Context, sb model.Sandbox) (string, error) {
	key, err := s.signingKey(ctx)
	if err != nil {
		return "", err
	}
	return trafficToken(key, sb.ID), nil
}

func trafficToken(key []byte, sandboxID string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(trafficLabel + sandboxID))
	return "tt_" + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// CheckTraffic authorizes a request to a (non-envd) port of sb that carried
// tok in TrafficTokenHeader: nil for a public sandbox or the right token,
// else an error wrapping model.ErrUnauthorized (no token) or
// model.ErrForbidden (a wrong one) that says what to send.
func (s *Service) CheckTraffic(ctx context.Context, sb model.Sandbox, tok string) error {
	if sb.PublicTraffic {
		return nil
	}
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return withHint(model.Errorf(model.ErrUnauthorized, "sandbox %s does not accept public traffic: send its traffic token in the %s header, or create the sandbox with public traffic", sb.ID, TrafficTokenHeader),
			Hint{Kind: HintTrafficToken, SandboxID: sb.ID})
	}
	want, err := s.TrafficToken(ctx, sb)
	if err != nil {
		return err
	}
	if !hmac.Equal([]byte(tok), []byte(want)) {
		return model.Errorf(model.ErrForbidden, "the %s header does not hold the traffic token of sandbox %s", TrafficTokenHeader, sb.ID)
	}
	return nil
}

// SandboxTrafficToken returns the traffic token of the caller's sandbox id
// ("" for a sandbox with public traffic, which needs none).
func (s *Service) SandboxTrafficToken(ctx context.Context, p Principal, sb model.Sandbox) (string, error) {
	if sb.OrgID != p.OrgID {
		return "", model.Errorf(model.ErrNotFound, "sandbox %s not found", sb.ID)
	}
	if sb.PublicTraffic {
		return "", nil
	}
	return s.TrafficToken(ctx, sb)
}
