package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/model"
)

// TestTemplateBuildCLI builds a multi-step Dockerfile with `airlock
// template build` (the path users take: the CLI packs and uploads the COPY
// inputs, the server sends the build to the worker, RUN steps run in
// gVisor), rebuilds it with one changed COPY (only that step and the
// later ones re-run, from the build's step report), checks that a clean
// rebuild of the same inputs gives the same digest, and starts a sandbox
// from the result on gVisor and on QEMU.
func TestTemplateBuildCLI(t *testing.T) {
	s := need(t)
	c := s.client()
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("Dockerfile", `FROM base
USER root
ARG GREETING=hello
RUN echo "$GREETING from RUN" > /etc/greeting
COPY app.txt /app/
RUN cat /app/app.txt /etc/greeting > /app/both
ENV APP_MODE=test
WORKDIR /app
USER user
`)
	// Unique per run: the step cache of the test cache outlives it.
	nonce := time.Now().Format(time.RFC3339Nano)
	write("app.txt", "version one "+nonce+"\n")
	cli := airlockCLI(t, s, append(os.Environ(), "AIRLOCK_URL="+s.url(), "AIRLOCK_API_KEY="+s.adminKey))
	build := func(args ...string) model.Build {
		t.Helper()
		out, code := cli("", append([]string{"template", "build", "--name", "cli-built:v1", "--json"}, append(args, dir)...)...)
		var b model.Build
		if err := json.Unmarshal([]byte(out), &b); err != nil || code != 0 {
			t.Fatalf("template build exited %d (%v): %s", code, err, out)
		}
		if b.State != model.BuildReady || !strings.HasPrefix(b.Digest, "sha256:") {
			t.Fatalf("build %s: %s %s", b.ID, b.State, b.Error)
		}
		return b
	}
	cached := func(b model.Build) []bool {
		var out []bool
		for _, st := range b.Steps {
			if st.Index >= 0 {
				out = append(out, st.Cached)
			}
		}
		return out
	}
	first := build()
	t.Logf("first build: %v, steps cached %v", first.Digest, cached(first))
	again := build()
	if again.Digest != first.Digest || strings.Contains(fmtBools(cached(again)), "F") {
		t.Errorf("an unchanged rebuild: digest %s (first %s), cached %v; want every step cached", again.Digest, first.Digest, cached(again))
	}

	write("app.txt", "version two "+nonce+"\n")
	second := build()
	// Steps: USER, ARG (none: folded), RUN, COPY, RUN, ENV, WORKDIR, USER.
	want := []bool{true, true, false, false, false, false, false}
	if got := cached(second); fmtBools(got) != fmtBools(want) {
		t.Errorf("rebuild after changing app.txt: cached %v, want %v (USER, RUN cached; COPY and later re-run)", got, want)
	}
	if second.Digest == first.Digest {
		t.Errorf("a changed COPY gave the same digest")
	}
	clean := build("--no-cache")
	if clean.Digest != second.Digest {
		t.Errorf("a clean rebuild of the same inputs gave %s, the cached build %s", clean.Digest, second.Digest)
	}

	for _, rt := range []string{"gvisor", "qemu"} {
		t.Run(rt, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
			defer cancel()
			sb, op, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "cli-built:v1", Runtime: rt}, "")
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			defer func() {
				if op, err := c.DeleteSandbox(context.Background(), sb.ID); err == nil {
					c.WaitOperation(context.Background(), op.ID)
				}
			}()
			if _, err := c.WaitOperation(ctx, op.ID); err != nil {
				t.Fatalf("%s sandbox from the built template: %v", rt, err)
			}
			r := run(t, c, sb.ID, client.CreateCommandRequest{Cmd: `cat both; echo "$APP_MODE $(pwd) $(id -un)"`}, nil)
			if want := "version two " + nonce + "\nhello from RUN\ntest /app user\n"; r.stdout != want || r.exit.ExitCode != 0 {
				t.Errorf("in the %s sandbox: %q (exit %+v, stderr %q), want %q", rt, r.stdout, r.exit, r.stderr, want)
			}
		})
	}
}

func fmtBools(b []bool) string {
	var s []string
	for _, v := range b {
		if v {
			s = append(s, "T")
		} else {
			s = append(s, "F")
		}
	}
	return strings.Join(s, "")
}
