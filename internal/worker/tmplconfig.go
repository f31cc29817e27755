package worker

// Template defaults: an imported image's config (model.TemplateConfig:
// Env, WorkingDir, User) is the default of every command of a sandbox from
// that template, native or E2B. A command's own user and working directory
// win; env layers, lowest first, are the template's, the egress CA's
// (withCAEnv), the sandbox's and the command's. The server knows nothing
// of this (tokens carry the command as the client gave it).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/workerapi"
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

// Start and ready commands (model.TemplateConfig.StartCmd, ReadyCmd): a
// sandbox booted from a template that has them runs the start command in
// the background, as the template's user in its working directory with its
// env, and then the ready command until it exits 0 (every
// readyPollInterval, up to ReadyTimeout: a Jupyter kernel on QEMU under
// TCG takes minutes) before it counts as running; a
// sandbox restored from a template image or a snapshot has its start
// command running already. The start command's output is the command
// "template-start" of the sandbox (`airlock exec`-visible, like any other).
const (
	ReadyTimeout      = 10 * time.Minute
	readyPollInterval = 100 * time.Millisecond
	// StartCommandID is the agent's id of a template's start command.
	StartCommandID = "template-start"
)

// runStartCommand starts digest's start command in the sandbox ac talks to
// (with env, the sandbox's, over the template's) and waits for its ready
// command; nothing to do without a start or ready command.
func (w *Worker) runStartCommand(ctx context.Context, ac *agentclient.Client, digest string, env map[string]string) error {
	cfg := w.templateConfig(digest)
	if cfg == nil || (cfg.StartCmd == "" && cfg.ReadyCmd == "") {
		return nil
	}
	spec := func(id, cmd string) agentapi.ProcessSpec {
		c, env := withTemplateDefaults(cfg, model.CommandSpec{}, env)
		return agentapi.ProcessSpec{ID: id, Argv: []string{"/bin/sh", "-c", cmd}, Env: env, Cwd: c.Cwd, User: c.User}
	}
	if cfg.StartCmd != "" {
		if _, err := ac.StartProcess(ctx, spec(StartCommandID, cfg.StartCmd)); err != nil {
			return fmt.Errorf("template start command: %w", err)
		}
	}
	if cfg.ReadyCmd == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	var last string
	for n := 1; ; n++ {
		exit, out, err := runToExit(ctx, ac, spec(fmt.Sprintf("template-ready-%d", n), cfg.ReadyCmd))
		if err == nil && exit.ExitCode == 0 && exit.Error == "" {
			return nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("exit %d: %s", exit.ExitCode, strings.TrimSpace(out))
		}
		if info, err := ac.GetProcess(ctx, StartCommandID); err == nil && !info.Running && cfg.StartCmd != "" {
			code := -1
			if info.ExitCode != nil {
				code = *info.ExitCode
			}
			return fmt.Errorf("the template's start command exited (%d) before its ready command passed (%s)", code, last)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the template's ready command did not pass within %s (last: %s)", ReadyTimeout, last)
		case <-time.After(readyPollInterval):
		}
	}
}

// runToExit runs p to its end and returns its exit and the last 2 KiB of
// its output.
func runToExit(ctx context.Context, ac *agentclient.Client, p agentapi.ProcessSpec) (agentapi.Exit, string, error) {
	var exit agentapi.Exit
	if _, err := ac.StartProcess(ctx, p); err != nil {
		return exit, "", err
	}
	s, err := ac.Output(ctx, p.ID, 0)
	if err != nil {
		return exit, "", err
	}
	defer s.Close()
	var tail []byte
	for {
		kind, payload, err := s.Next()
		if err != nil {
			return exit, string(tail), err
		}
		switch kind {
		case agentapi.FrameStdout, agentapi.FrameStderr:
			tail = append(tail, payload...)
			if len(tail) > 2048 {
				tail = tail[len(tail)-2048:]
			}
		case agentapi.FrameExit:
			err := json.Unmarshal(payload, &exit)
			return exit, string(tail), err
		case agentapi.FrameError:
			return exit, string(tail), fmt.Errorf("%s", payload)
		}
	}
}

// SandboxEnvFile is where a sandbox from a template with a start command
// finds its own env (JSON, name to value), written by the worker before
// the sandbox counts as running: a start command restored from a template
// image started before the sandbox existed, so it reads the env there (the
// code interpreter's server does, for its kernels).
const SandboxEnvFile = "/run/airlock-env.json"

// writeSandboxEnv writes s's env to SandboxEnvFile when its template has a
// start command.
func (w *Worker) writeSandboxEnv(ctx context.Context, ac *agentclient.Client, s workerapi.SandboxSpec) error {
	if !w.hasStartCommand(s.TemplateDigest) {
		return nil
	}
	env := s.Env
	if env == nil {
		env = map[string]string{}
	}
	b, err := json.Marshal(env)
	if err != nil {
		return err
	}
	_, err = ac.WriteFile(ctx, SandboxEnvFile, "0644", "", bytes.NewReader(b))
	return err
}
