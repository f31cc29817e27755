package cli

import (
	"bytes"
	"strings"
	"testing"
)

// runStdin runs the CLI with stdin against the server with the admin key.
func (e *apiEnv) runStdin(stdin string, args ...string) (code int, stdout, stderr string) {
	e.t.Helper()
	var out, errb bytes.Buffer
	env := map[string]string{"AIRLOCK_URL": e.url, "AIRLOCK_API_KEY": e.key, "HOME": e.t.TempDir()}
	code = Main(e.ctx, args, Env{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errb, Getenv: func(k string) string { return env[k] }})
	return code, out.String(), errb.String()
}

func TestSecretCommands(t *testing.T) {
	e := newAPIEnv(t)
	if code, out, errOut := e.runStdin("sk-cli-value\n", "secret", "set", "openai"); code != 0 || !strings.Contains(out, "secret openai set") {
		t.Fatalf("secret set: %d %q %q", code, out, errOut)
	}
	if code, _, errOut := e.runStdin("", "secret", "set", "empty"); code == 0 || !strings.Contains(errOut, "empty") {
		t.Errorf("empty value: %d %q", code, errOut)
	}
	if code, _, errOut := e.runStdin("v", "secret", "set", "bad/name"); code == 0 || !strings.Contains(errOut, "secret name") {
		t.Errorf("bad name: %d %q", code, errOut)
	}
	out := e.mustRun("secret", "ls")
	if !strings.Contains(out, "openai") || strings.Contains(out, "sk-cli-value") {
		t.Fatalf("secret ls: %q", out)
	}
	if out := e.mustRun("secret", "ls", "--json"); !strings.Contains(out, `"name": "openai"`) && !strings.Contains(out, `"name":"openai"`) {
		t.Fatalf("secret ls --json: %q", out)
	}
	e.mustRun("secret", "rm", "openai")
	if code, _, errOut := e.run("secret", "rm", "openai"); code == 0 || !strings.Contains(errOut, "no secret") {
		t.Errorf("rm again: %d %q", code, errOut)
	}
}
