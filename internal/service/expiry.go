package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/airlock/airlock/internal/model"
)

// MaxSandboxTimeout bounds a sandbox's time to live as set by
// SetSandboxTimeout.
const MaxSandboxTimeout = 24 * time.Hour

// SetSandboxTimeout sets when the sandbox expires: now + d. With extendOnly
// an expiry already later than that is kept (a sandbox without expiry keeps
// none). The sandbox must exist and not be deleted or being deleted.
func (s *Service) SetSandboxTimeout(ctx context.Context, p Principal, id string, d time.Duration, extendOnly bool) (model.Sandbox, error) {
	if d <= 0 || d > MaxSandboxTimeout {
		return model.Sandbox{}, model.Errorf(model.ErrUnprocessable, "timeout is %s; it must be more than 0 and at most %s", d, MaxSandboxTimeout)
	}
	for range maxUpdateRetries {
		sb, err := s.GetSandbox(ctx, p, id)
		if err != nil {
			return model.Sandbox{}, err
		}
		if sb.State == model.StateDeleted || sb.DesiredState == model.StateDeleted {
			return model.Sandbox{}, model.Errorf(model.ErrNotFound, "sandbox %s not found", id)
		}
		exp := s.now().Add(d)
		if extendOnly && (sb.ExpiresAt == nil || sb.ExpiresAt.After(exp)) {
			return sb, nil
		}
		sb.ExpiresAt = &exp
		sb.TimeoutS = int((d + time.Second - 1) / time.Second)
		updated, err := s.st.UpdateSandbox(ctx, sb)
		if errors.Is(err, model.ErrConflict) {
			continue
		}
		if err != nil {
			return model.Sandbox{}, fmt.Errorf("set timeout of sandbox %s: %w", id, err)
		}
		s.publish(ctx, &updated, nil)
		return updated, nil
	}
	return model.Sandbox{}, model.Errorf(model.ErrConflict, "sandbox %s is changing too fast to set its timeout; retry", id)
}
