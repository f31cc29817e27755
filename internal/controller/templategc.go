package controller

import (
	"context"
	"fmt"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
)

// Template garbage collection: content a worker holds that no name:tag
// points at any more (its tag moved to a newer build or import, or an
// older base from before an agent upgrade), that no sandbox (running,
// paused or suspended: their snapshots need it) or warm pool uses, is
// deleted as DELETE /v1/templates/sha256:… would: recorded, and removed by
// each worker that holds it at its next sync, unless that worker's copy
// is younger than TemplateGCGrace (a report still on its way). Builds and
// imports keep their own content tagged, so only superseded content goes.
const (
	TemplateGCInterval = 5 * time.Minute
	TemplateGCGrace    = 10 * time.Minute
)

// collectTemplates records the deletion of every untagged, unused template
// digest the workers report, and returns them.
func (c *Controller) collectTemplates(ctx context.Context) ([]string, error) {
	now := c.now()
	workers, err := c.st.ListWorkers(ctx)
	if err != nil {
		return nil, fmt.Errorf("list workers: %w", err)
	}
	keep := map[string]bool{}
	ts, err := c.st.ListTemplates(ctx)
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	for _, t := range ts {
		keep[t.Digest] = true
	}
	pools, err := c.st.ListPools(ctx)
	if err != nil {
		return nil, fmt.Errorf("list pools: %w", err)
	}
	for _, p := range pools {
		keep[p.Digest] = true
	}
	sbs, err := store.ListAllSandboxes(ctx, c.st, store.SandboxFilter{})
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	for _, sb := range sbs {
		if sb.State != model.StateDeleted {
			keep[sb.TemplateDigest] = true
		}
	}
	gone, err := c.st.ListTemplateDeletions(ctx)
	if err != nil {
		return nil, fmt.Errorf("list template deletions: %w", err)
	}
	var collected []string
	for _, w := range workers {
		for _, d := range w.Templates {
			if keep[d] || !gone[d].IsZero() {
				continue
			}
			if err := c.st.DeleteTemplate(ctx, d, now.Add(-TemplateGCGrace)); err != nil {
				return collected, fmt.Errorf("delete untagged template %s: %w", d, err)
			}
			gone[d] = now
			collected = append(collected, d)
		}
	}
	if len(collected) > 0 {
		c.log.Info("controller: untagged templates collected", "digests", collected)
		c.ev.Wake()
	}
	return collected, nil
}
