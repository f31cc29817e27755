package controller

import (
	"testing"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/scheduler"
)

// lastPlacer places on the candidate with the highest ID (the default picks
// the lowest among equals) and records what it was asked; with no
// candidate it says so in its own words.
type lastPlacer struct{ asked []scheduler.Request }

func (p *lastPlacer) Place(c scheduler.Cluster, req scheduler.Request) (string, error) {
	p.asked = append(p.asked, req)
	id := ""
	for _, w := range c.Workers {
		id = max(id, w.ID)
	}
	if id == "" {
		return "", model.Errorf(model.ErrUnavailable, "the custom placer has no candidate")
	}
	return id, nil
}

// TestCustomPlacer: Config.Placer replaces the default placement, and
// Controller.Placer hands out that same placer (the service's imports use
// it).
func TestCustomPlacer(t *testing.T) {
	p := &lastPlacer{}
	e := newEnv(t, func(c *Config) { c.Placer = p })
	if e.c.Placer() != scheduler.Placer(p) {
		t.Fatalf("Controller.Placer = %v, want the configured placer", e.c.Placer())
	}
	e.createSandbox("sb0", 512)
	e.reconcile()
	e.wantSandbox("sb0", model.StatePending, "", "the custom placer has no candidate")

	e.worker("w1").register(baseTemplate) // equal workers: the default takes w1
	e.worker("w2").register(baseTemplate)
	e.createSandbox("sb1", 512)
	e.reconcile()
	e.wantSandbox("sb0", model.StateStarting, "w2", "")
	e.wantSandbox("sb1", model.StateStarting, "w2", "")
	if len(p.asked) == 0 || p.asked[len(p.asked)-1].TemplateDigest != baseDigest {
		t.Fatalf("placer asked %+v, want requests for template %s", p.asked, baseDigest)
	}

	// Without Config.Placer, the default places the same sandboxes on w1.
	d := newEnv(t)
	d.worker("w1").register(baseTemplate)
	d.worker("w2").register(baseTemplate)
	d.createSandbox("sb1", 512)
	d.reconcile()
	d.wantSandbox("sb1", model.StateStarting, "w1", "")
	if _, ok := d.c.Placer().(scheduler.Default); !ok {
		t.Fatalf("default Controller.Placer is %T, want scheduler.Default", d.c.Placer())
	}
}
