package model

import "strings"

// TemplateConfig is what an imported OCI image's config says about running
// commands in it. Env, WorkingDir and User are the defaults of every command
// of a sandbox from the template (a command's own values win, and the
// sandbox's env wins over Env); Entrypoint and Cmd are kept for a start
// command and are not run by themselves.
type TemplateConfig struct {
	Env        []string `json:"env,omitempty"` // KEY=value, in the image's order
	WorkingDir string   `json:"working_dir,omitempty"`
	// User is the image's user: name, uid, name:group or uid:gid; "" is root.
	User       string   `json:"user,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	// StartCmd is started in the background (a shell command, as User in
	// WorkingDir with Env) whenever a sandbox from the template starts,
	// and ReadyCmd run until it exits 0 before the sandbox counts as
	// running; a recipe's START and READY (internal/image/build).
	StartCmd string `json:"start_cmd,omitempty"`
	ReadyCmd string `json:"ready_cmd,omitempty"`
}

// EnvMap returns Env as a map; a later entry of a name wins, as in the
// image, and an entry without "=" is left out.
func (c *TemplateConfig) EnvMap() map[string]string {
	if c == nil || len(c.Env) == 0 {
		return nil
	}
	m := make(map[string]string, len(c.Env))
	for _, kv := range c.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			m[k] = v
		}
	}
	return m
}

// CommandUser is the user a command runs as by default: the user part of
// User (the guest agent takes a name or a uid and uses that user's own
// group), or "0", root by uid, for an image that names none (as Docker
// runs it; by uid so that an image without /etc/passwd works too). A nil
// config has no default: "".
func (c *TemplateConfig) CommandUser() string {
	if c == nil {
		return ""
	}
	u, _, _ := strings.Cut(c.User, ":")
	if u == "" {
		return "0"
	}
	return u
}
