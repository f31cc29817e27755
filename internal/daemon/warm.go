package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
)

// warmFlag collects repeated --warm template=size flags: the warm pools to
// configure at start (as `airlock pool set template size` would).
type warmFlag []warmPool

type warmPool struct {
	template string
	size     int
}

func (w *warmFlag) String() string {
	if w == nil {
		return ""
	}
	parts := make([]string, len(*w))
	for i, p := range *w {
		parts[i] = fmt.Sprintf("%s=%d", p.template, p.size)
	}
	return strings.Join(parts, ",")
}

func (w *warmFlag) Set(s string) error {
	i := strings.LastIndexByte(s, '=')
	if i <= 0 {
		return fmt.Errorf("want template=size (e.g. base=4), got %q", s)
	}
	n, err := strconv.Atoi(s[i+1:])
	if err != nil || n < 0 || n > service.MaxPoolSize {
		return fmt.Errorf("size in %q must be a number from 0 to %d", s, service.MaxPoolSize)
	}
	*w = append(*w, warmPool{template: s[:i], size: n})
	return nil
}

const warmUsage = "keep `template=size` running sandboxes of a template ready for creates (a warm pool with 1 vCPU / 512 MiB members; repeatable)"

// applyWarm configures the --warm pools. A template that does not exist yet
// (no worker has registered it) is retried every retry until ctx ends;
// other errors are returned.
func applyWarm(ctx context.Context, svc *service.Service, pools warmFlag, retry time.Duration, log *slog.Logger) error {
	op := service.Principal{OrgID: service.DefaultOrgID, Admin: true}
	for _, p := range pools {
		for {
			got, err := svc.SetPool(ctx, op, p.template, service.PoolParams{Size: p.size})
			if err == nil {
				log.Info("warm pool configured", "template", got.Template, "digest", got.Digest, "size", got.Size)
				break
			}
			if !errors.Is(err, model.ErrUnprocessable) || !strings.Contains(err.Error(), "not found") || retry <= 0 {
				return fmt.Errorf("configure warm pool %s: %w", p.template, err)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(retry):
			}
		}
	}
	return nil
}
