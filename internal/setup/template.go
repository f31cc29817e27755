package setup

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/image"
	"github.com/airlock/airlock/internal/model"
)

// The Debian template: Debian 12 minbase, the default user and the agent,
// which the shipped recipes (templates/, base first) build on.
const (
	DebianName = "debian"
	DebianTag  = "bookworm"
	debianDist = "bookworm"
	layerName  = "debian-bookworm"
)

// debootstrapPackages are added to minbase.
var debootstrapPackages = []string{"bash", "coreutils", "procps", "python3", "ca-certificates", "curl", "git"}

// guestAgentPath is where every template carries the agent.
const guestAgentPath = "usr/local/bin/airlock-agent"

// index maps the sha256 of an agent binary to the digest of the Debian
// template built with it.
type index struct {
	Agents map[string]string `json:"agents"`
}

func indexPath(dir string) string { return filepath.Join(dir, "templates", "index.json") }

func readIndex(dir string) index {
	var ix index
	if b, err := os.ReadFile(indexPath(dir)); err == nil {
		json.Unmarshal(b, &ix)
	}
	if ix.Agents == nil {
		ix.Agents = map[string]string{}
	}
	return ix
}

// EnsureDebianTemplate returns the Debian template (debian:bookworm, the parent of the shipped base recipe) built from the cached Debian
// layer and the agent binary at agentPath, and its root filesystem
// directory. The first call debootstraps the layer (about a minute); a call
// with an agent already seen returns from the index without rehashing.
func EnsureDebianTemplate(ctx context.Context, dir, agentPath string, progress io.Writer) (model.Template, string, error) {
	t, rootfs, _, err := ensureDebianTemplate(ctx, dir, agentPath, progress)
	return t, rootfs, err
}

// ensureDebianTemplate also reports whether it built anything.
func ensureDebianTemplate(ctx context.Context, dir, agentPath string, progress io.Writer) (t model.Template, rootfs string, built bool, err error) {
	if err := checkStatic(agentPath); err != nil {
		// A cgo build of the agent links the C library dynamically. The Debian
		// layer has that library, so it still runs; say so, since the agent is
		// meant to be static (CGO_ENABLED=0, as scripts/build.sh builds it).
		fmt.Fprintf(progress, "template: warning: %s: %v; it will use the template's C library\n", agentPath, err)
	}
	agentSum, err := fileSHA256(agentPath)
	if err != nil {
		return t, "", false, fmt.Errorf("debian template: %w", err)
	}
	if t, rootfs, ok := cachedTemplate(dir, agentSum); ok && t.Name == DebianName && t.SourceKey != "" {
		return t, rootfs, false, nil
	}

	unlock, err := lock(dir)
	if err != nil {
		return t, "", false, fmt.Errorf("debian template: %w", err)
	}
	defer unlock()
	if t, rootfs, ok := cachedTemplate(dir, agentSum); ok {
		if t.Name != DebianName || t.SourceKey == "" {
			// Named base by an earlier version, which shipped it as base.
			t.Name, t.Tag, t.SourceKey = DebianName, DebianTag, layerKey(filepath.Join(dir, "cache", layerName))
			if err := image.RenameTemplate(dir, t); err != nil {
				return t, "", false, fmt.Errorf("debian template: %w", err)
			}
		}
		return t, rootfs, false, nil
	}

	layer, err := ensureDebianLayer(ctx, dir, progress)
	if err != nil {
		return t, "", false, fmt.Errorf("debian template: %w", err)
	}
	t, err = buildTemplate(ctx, dir, layer, agentPath, progress)
	if err != nil {
		return t, "", false, fmt.Errorf("debian template: %w", err)
	}
	ix := readIndex(dir)
	ix.Agents[agentSum] = t.Digest
	b, _ := json.MarshalIndent(ix, "", "  ")
	if err := writeFileAtomic(indexPath(dir), b, 0o644); err != nil {
		return t, "", false, fmt.Errorf("debian template: write index: %w", err)
	}
	return t, image.TemplateRootFS(dir, t.Digest), true, nil
}

// cachedTemplate looks the agent up in the index.
func cachedTemplate(dir, agentSum string) (model.Template, string, bool) {
	digest, ok := readIndex(dir).Agents[agentSum]
	if !ok {
		return model.Template{}, "", false
	}
	t, err := image.ReadTemplate(dir, digest)
	if err != nil || t.Digest != digest {
		return model.Template{}, "", false
	}
	return t, image.TemplateRootFS(dir, digest), true
}

// ensureDebianLayer debootstraps dir/cache/debian-bookworm once.
func ensureDebianLayer(ctx context.Context, dir string, progress io.Writer) (string, error) {
	cache := filepath.Join(dir, "cache")
	layer := filepath.Join(cache, layerName)
	done := layer + ".done"
	if _, err := os.Stat(done); err == nil {
		if _, err := os.Stat(layer); err == nil {
			return layer, nil
		}
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", err
	}
	debootstrap, err := ensureDebootstrap(ctx, progress)
	if err != nil {
		return "", err
	}
	// Leftovers of an interrupted build (we hold the lock, so nobody else's).
	olds, _ := filepath.Glob(filepath.Join(cache, "."+layerName+".tmp-*"))
	for _, o := range olds {
		os.RemoveAll(o)
	}
	os.RemoveAll(layer)
	tmp, err := os.MkdirTemp(cache, "."+layerName+".tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}

	progressf(progress, "template: debootstrap %s minbase with %s (once; about a minute)", debianDist, strings.Join(debootstrapPackages, ","))
	logPath := filepath.Join(cache, "debootstrap.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, debootstrap, "--variant=minbase",
		"--include="+strings.Join(debootstrapPackages, ","), debianDist, tmp)
	cmd.Stdout, cmd.Stderr = logf, logf
	err = cmd.Run()
	logf.Close()
	if err != nil {
		b, _ := os.ReadFile(logPath)
		if len(b) > 2048 {
			b = b[len(b)-2048:]
		}
		return "", fmt.Errorf("debootstrap (log %s): %w: %s", logPath, err, strings.TrimSpace(string(b)))
	}
	if err := addDefaultUser(tmp); err != nil {
		return "", fmt.Errorf("add default user: %w", err)
	}
	if err := stripAPT(tmp); err != nil {
		return "", fmt.Errorf("strip apt caches: %w", err)
	}
	if err := os.Rename(tmp, layer); err != nil {
		return "", err
	}
	if err := writeFileAtomic(done, []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o644); err != nil {
		return "", err
	}
	progressf(progress, "template: Debian layer ready at %s", layer)
	return layer, nil
}

// ensureDebootstrap finds debootstrap, installing the Debian package if needed.
func ensureDebootstrap(ctx context.Context, progress io.Writer) (string, error) {
	if p, err := exec.LookPath("debootstrap"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/debootstrap", "/sbin/debootstrap"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	aptGet, err := exec.LookPath("apt-get")
	if err != nil {
		return "", fmt.Errorf("debootstrap is not installed and apt-get is missing; install debootstrap: %w", err)
	}
	progressf(progress, "template: installing debootstrap with apt-get")
	cmd := exec.CommandContext(ctx, aptGet, "-o", "DPkg::Lock::Timeout=120", "install", "-y", "--no-install-recommends", "debootstrap")
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("apt-get install debootstrap: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return exec.LookPath("debootstrap")
}

// addDefaultUser creates user uid 1000 gid 1000, home /home/user, shell
// /bin/bash, by editing passwd, group and shadow (no chroot needed).
func addDefaultUser(root string) error {
	u, uid, gid, home := agentapi.DefaultUser, agentapi.DefaultUID, agentapi.DefaultGID, agentapi.DefaultHome
	lines := map[string]string{
		"etc/passwd":  fmt.Sprintf("%s:x:%d:%d::%s:/bin/bash", u, uid, gid, home),
		"etc/group":   fmt.Sprintf("%s:x:%d:", u, gid),
		"etc/shadow":  fmt.Sprintf("%s:!:20000:0:99999:7:::", u),
		"etc/gshadow": fmt.Sprintf("%s:!::", u),
	}
	for _, name := range []string{"etc/passwd", "etc/group", "etc/shadow", "etc/gshadow"} {
		p := filepath.Join(root, name)
		b, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) && name == "etc/gshadow" {
			continue
		}
		if err != nil {
			return err
		}
		if bytes.Contains(b, []byte("\n"+u+":")) || bytes.HasPrefix(b, []byte(u+":")) {
			continue
		}
		if len(b) > 0 && b[len(b)-1] != '\n' {
			b = append(b, '\n')
		}
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if err := os.WriteFile(p, append(b, lines[name]+"\n"...), fi.Mode().Perm()); err != nil {
			return err
		}
	}
	homeDir := filepath.Join(root, home)
	if err := os.MkdirAll(homeDir, 0o750); err != nil {
		return err
	}
	skel := filepath.Join(root, "etc/skel")
	entries, _ := os.ReadDir(skel)
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(skel, e.Name()))
		if err != nil {
			return err
		}
		dst := filepath.Join(homeDir, e.Name())
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			return err
		}
		if err := os.Lchown(dst, uid, gid); err != nil {
			return err
		}
	}
	if err := os.Chmod(homeDir, 0o750); err != nil {
		return err
	}
	return os.Lchown(homeDir, uid, gid)
}

// stripAPT removes downloaded packages and package lists (~110 MiB).
func stripAPT(root string) error {
	var errs []error
	for _, pattern := range []string{"var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*"} {
		matches, _ := filepath.Glob(filepath.Join(root, pattern))
		for _, m := range matches {
			if filepath.Base(m) == "partial" || filepath.Base(m) == "lock" {
				continue
			}
			if err := os.RemoveAll(m); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// buildTemplate hardlink-copies the layer, adds the agent, digests the tree
// and moves it to templates/<hex>.
func buildTemplate(ctx context.Context, dir, layer, agentPath string, progress io.Writer) (model.Template, error) {
	var t model.Template
	tdir := filepath.Join(dir, "templates")
	if err := os.MkdirAll(tdir, 0o755); err != nil {
		return t, err
	}
	olds, _ := filepath.Glob(filepath.Join(tdir, ".build-*"))
	for _, o := range olds {
		os.RemoveAll(o)
	}
	tmp, err := os.MkdirTemp(tdir, ".build-")
	if err != nil {
		return t, err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return t, err
	}
	progressf(progress, "template: assembling %s:%s", DebianName, DebianTag)
	rootfs := filepath.Join(tmp, "rootfs")
	if out, err := exec.CommandContext(ctx, "cp", "-al", layer, rootfs).CombinedOutput(); err != nil {
		return t, fmt.Errorf("hardlink-copy layer: %w: %s", err, strings.TrimSpace(string(out)))
	}
	// A copy, not a link: the layer stays untouched and the template owns
	// its agent. Remove first so a linked file from the layer is not written.
	dst := filepath.Join(rootfs, guestAgentPath)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return t, err
	}
	if err := os.Remove(dst); err != nil && !errors.Is(err, os.ErrNotExist) {
		return t, err
	}
	if err := copyFile(agentPath, dst, 0o755); err != nil {
		return t, fmt.Errorf("copy agent: %w", err)
	}
	progressf(progress, "template: computing content digest")
	digest, size, err := image.Digest(rootfs)
	if err != nil {
		return t, err
	}
	t = model.Template{Name: DebianName, Tag: DebianTag, Digest: digest, SizeBytes: size, CreatedAt: time.Now().UTC(), SourceKey: layerKey(layer)}
	if existing, err := image.ReadTemplate(dir, digest); err == nil && existing.Digest == digest {
		progressf(progress, "template: %s already present", digest)
		if existing.Name != t.Name || existing.Tag != t.Tag || existing.SourceKey != t.SourceKey {
			// Named base by an earlier version, which shipped it as base.
			existing.Name, existing.Tag, existing.SourceKey = t.Name, t.Tag, t.SourceKey
			if err := image.RenameTemplate(dir, existing); err != nil {
				return t, err
			}
		}
		return existing, nil
	}
	if err := image.AddTemplate(dir, tmp, t); err != nil {
		return t, err
	}
	progressf(progress, "template: %s:%s is %s (%d MiB)", DebianName, DebianTag, digest, size>>20)
	return t, nil
}

func copyFile(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Chmod(perm); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Lchown(dst, 0, 0)
}

// layerKey names the Debian layer apart from any agent: its package list
// and when it was made (it is made once per data directory).
func layerKey(layer string) string {
	done, _ := os.ReadFile(layer + ".done")
	h := sha256.New()
	fmt.Fprintf(h, "debootstrap %s minbase\npackages %s\nmade %s\n", debianDist, strings.Join(debootstrapPackages, ","), strings.TrimSpace(string(done)))
	return "debootstrap:" + hex.EncodeToString(h.Sum(nil))
}
