package worker

// Template defaults: an imported image's config (model.TemplateConfig:
// Env, WorkingDir, User) is the default of every command of a sandbox from
// that template, native or E2B. A command's own user and working directory
// win; env layers, lowest first, are the template's, the egress CA's
// (withCAEnv), the sandbox's and the command's. The server knows nothing
// of this (tokens carry the command as the client gave it).

import (
	"maps"
	"sync"

	"github.com/airlock/airlock/internal/model"
)

// templateConfigs caches the configs of the templates in the catalog by
// digest: a template is immutable, so an entry never goes stale.
type templateConfigs struct {
	mu sync.Mutex
	m  map[string]*model.TemplateConfig
}

// templateConfig returns the config of the template with digest, nil when
// it has none (base) or is not in the catalog.
func (w *Worker) templateConfig(digest string) *model.TemplateConfig {
	if digest == "" || w.cfg.Templates == nil {
		return nil
	}
	c := &w.tmplConfigs
	c.mu.Lock()
	defer c.mu.Unlock()
	if cfg, ok := c.m[digest]; ok {
		return cfg
	}
	ts, err := w.cfg.Templates()
	if err != nil {
		w.log.Warn("list templates for command defaults", "err", err)
		return nil
	}
	if c.m == nil || len(c.m) > 1024 {
		c.m = map[string]*model.TemplateConfig{}
	}
	for _, t := range ts {
		c.m[t.Digest] = t.Config
	}
	return c.m[digest] // a miss is looked up again next time
}

// sandboxTemplateConfig is templateConfig of sandbox sid's template.
func (w *Worker) sandboxTemplateConfig(sid string) *model.TemplateConfig {
	w.mu.Lock()
	var digest string
	if sb := w.sandboxes[sid]; sb != nil {
		digest = sb.spec.TemplateDigest
	}
	w.mu.Unlock()
	return w.templateConfig(digest)
}

// withTemplateDefaults fills c's user and working directory from cfg when
// c names none, and returns env over cfg's Env.
func withTemplateDefaults(cfg *model.TemplateConfig, c model.CommandSpec, env map[string]string) (model.CommandSpec, map[string]string) {
	if cfg == nil {
		return c, env
	}
	if c.User == "" {
		c.User = cfg.CommandUser()
	}
	if c.Cwd == "" {
		c.Cwd = cfg.WorkingDir
	}
	return c, templateEnv(cfg, env)
}

// templateEnv is env over cfg's Env (env wins).
func templateEnv(cfg *model.TemplateConfig, env map[string]string) map[string]string {
	tenv := cfg.EnvMap()
	if len(tenv) == 0 {
		return env
	}
	maps.Copy(tenv, env)
	return tenv
}
