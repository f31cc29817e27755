package agentclient_test

import (
	"context"
	"errors"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/model"
)

// symlinkAttack plants, as the unprivileged user name, a symlink in a
// directory that user owns, pointing at a directory only root may write,
// then drives the file API through it. Nothing may land in, change in or
// vanish from the protected directory.
func symlinkAttack(ctx context.Context, t *testing.T, c *agentclient.Client, run func(argv ...string) int, name, home, secret string) {
	t.Helper()
	if code := run("ln", "-s", secret, filepath.Join(home, "link")); code != 0 {
		t.Fatalf("plant symlink as %s: exit %d", name, code)
	}
	if code := run("ln", "-s", filepath.Join(secret, "victim"), filepath.Join(home, "file")); code != 0 {
		t.Fatalf("plant file symlink as %s: exit %d", name, code)
	}
	refused := func(op string, err error) {
		t.Helper()
		if !errors.Is(err, model.ErrInvalid) || !strings.Contains(err.Error(), "symlink") {
			t.Errorf("%s through a symlink planted by %s: %v, want a 400 naming the symlink", op, name, err)
		}
	}
	link := filepath.Join(home, "link")
	_, err := c.WriteFile(ctx, filepath.Join(link, "evil"), "0644", name, strings.NewReader("pwned"))
	refused("write", err)
	_, err = c.WriteFile(ctx, filepath.Join(link, "sub", "evil"), "0644", name, strings.NewReader("pwned"))
	refused("write with new parents", err)
	_, err = c.Mkdir(ctx, agentapi.Mkdir{Path: filepath.Join(link, "dir"), Owner: name})
	refused("mkdir", err)
	refused("remove", c.Remove(ctx, filepath.Join(link, "victim"), false))
	_, err = c.WriteFile(ctx, filepath.Join(home, "mine"), "", name, strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Move(ctx, filepath.Join(home, "mine"), filepath.Join(link, "moved"))
	refused("move into", err)
	_, err = c.Move(ctx, filepath.Join(link, "victim"), filepath.Join(home, "stolen"))
	refused("move out of", err)

	// A symlink as the last component is replaced, not followed.
	if _, err := c.WriteFile(ctx, filepath.Join(home, "file"), "", name, strings.NewReader("mine")); err != nil {
		t.Fatalf("write over a symlink: %v", err)
	}
	fi, err := c.Stat(ctx, filepath.Join(home, "file"))
	if err != nil || fi.Type != "file" {
		t.Fatalf("after writing over the symlink: %+v %v, want a regular file", fi, err)
	}
}

// TestFileAPISymlinkPlantedByUser: code running as an unprivileged user
// plants symlinks to a root-only directory; the root agent's file API,
// asked to write, mkdir, move or remove through them, refuses each (400)
// and the protected directory keeps exactly what it had. On the old agent
// the write landed in the protected directory, owned by the user.
func TestFileAPISymlinkPlantedByUser(t *testing.T) {
	h := startAgent(t)
	ctx := testCtx(t)
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("needs a 'nobody' user in /etc/passwd")
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	if err := os.Chmod(h.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(h.dir, "home")
	secret := filepath.Join(h.dir, "secret")
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, uid, gid); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(secret, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secret, "victim"), []byte("root's"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(argv ...string) int {
		return h.run(ctx, agentapi.ProcessSpec{User: "nobody", Cwd: "/", Argv: argv}).exit.ExitCode
	}
	symlinkAttack(ctx, t, h.client, run, "nobody", home, secret)

	ents, _ := os.ReadDir(secret)
	if len(ents) != 1 || ents[0].Name() != "victim" {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("the protected directory holds %v, want only victim", names)
	}
	if b, _ := os.ReadFile(filepath.Join(secret, "victim")); string(b) != "root's" {
		t.Fatalf("victim now holds %q", b)
	}

	// A symlink root made is followed (templates have them: /bin -> usr/bin).
	real := filepath.Join(h.dir, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, filepath.Join(h.dir, "rootlink")); err != nil {
		t.Fatal(err)
	}
	fi, err := h.client.WriteFile(ctx, filepath.Join(h.dir, "rootlink", "sub", "f"), "0640", "nobody", strings.NewReader("ok"))
	if err != nil || fi.Path != filepath.Join(h.dir, "rootlink", "sub", "f") || fi.Mode != "0640" || fi.UID != uid {
		t.Fatalf("write through a root-owned symlink: %+v %v", fi, err)
	}
	if b, err := os.ReadFile(filepath.Join(real, "sub", "f")); err != nil || string(b) != "ok" {
		t.Fatalf("file behind the root-owned symlink: %q %v", b, err)
	}
	if st, err := os.Stat(filepath.Join(real, "sub")); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("new parent: %v %v, want 0755", st, err)
	}
}
