package worker

import (
	"maps"
	"testing"

	"github.com/airlock/airlock/internal/model"
)

func TestWithTemplateDefaults(t *testing.T) {
	img := &model.TemplateConfig{Env: []string{"PATH=/opt/bin:/bin", "MODE=image", "ONLY=image"}, WorkingDir: "/srv", User: "app:staff"}
	cases := []struct {
		name      string
		cfg       *model.TemplateConfig
		cmd       model.CommandSpec
		env       map[string]string
		user, cwd string
		wantEnv   map[string]string
	}{
		{name: "base template: nothing changes", cmd: model.CommandSpec{Argv: []string{"id"}}, env: map[string]string{"A": "1"}, wantEnv: map[string]string{"A": "1"}},
		{name: "image defaults", cfg: img, cmd: model.CommandSpec{Argv: []string{"id"}}, user: "app", cwd: "/srv",
			wantEnv: map[string]string{"PATH": "/opt/bin:/bin", "MODE": "image", "ONLY": "image"}},
		{name: "the command and the sandbox win", cfg: img, cmd: model.CommandSpec{Argv: []string{"id"}, User: "root", Cwd: "/tmp"},
			env: map[string]string{"MODE": "sandbox"}, user: "root", cwd: "/tmp",
			wantEnv: map[string]string{"PATH": "/opt/bin:/bin", "MODE": "sandbox", "ONLY": "image"}},
		{name: "an image without a user runs as root", cfg: &model.TemplateConfig{}, cmd: model.CommandSpec{Argv: []string{"id"}}, user: "0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := maps.Clone(c.env)
			cmd, got := withTemplateDefaults(c.cfg, c.cmd, env)
			if cmd.User != c.user || cmd.Cwd != c.cwd {
				t.Errorf("user %q cwd %q, want %q %q", cmd.User, cmd.Cwd, c.user, c.cwd)
			}
			if !maps.Equal(got, c.wantEnv) {
				t.Errorf("env %v, want %v", got, c.wantEnv)
			}
			if !maps.Equal(env, c.env) {
				t.Errorf("the sandbox env was changed: %v", env)
			}
		})
	}
}
