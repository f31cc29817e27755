package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/airlock/airlock/client"
)

// Location is one side of a copy: a local path ("-" for stdin/stdout) or a
// path inside a sandbox.
type Location struct {
	SandboxID string // empty for a local path
	Path      string
}

// Remote reports whether l is inside a sandbox.
func (l Location) Remote() bool { return l.SandboxID != "" }

func (l Location) String() string {
	if l.Remote() {
		return l.SandboxID + ":" + l.Path
	}
	return l.Path
}

// ParseLocation parses "<sandbox-id>:<path>" or a local path. A sandbox id
// starts with "sb-"; anything else (including "./sb-x:y", "/a:b" or "C:x")
// is local, so local names with a colon stay usable with a "./" prefix.
func ParseLocation(s string) (Location, error) {
	id, p, ok := strings.Cut(s, ":")
	if !ok || !strings.HasPrefix(id, "sb-") || strings.ContainsAny(id, "/\\") {
		if s == "" {
			return Location{}, errors.New("empty path")
		}
		return Location{Path: s}, nil
	}
	if len(id) <= len("sb-") {
		return Location{}, fmt.Errorf("%q: empty sandbox id", s)
	}
	if p == "" {
		return Location{}, fmt.Errorf("%q: empty path after the sandbox id", s)
	}
	return Location{SandboxID: id, Path: p}, nil
}

var cpCmd = &command{
	name:    "cp",
	args:    "<src> <dst>   (exactly one side is <sandbox-id>:<path>; a local \"-\" is stdin or stdout)",
	summary: "copy a file into or out of a sandbox, streaming",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 2 {
				return usagef("cp", "want <src> <dst>, got %d arguments", len(args))
			}
			src, err := ParseLocation(args[0])
			if err != nil {
				return usagef("cp", "source: %v", err)
			}
			dst, err := ParseLocation(args[1])
			if err != nil {
				return usagef("cp", "destination: %v", err)
			}
			if src.Remote() == dst.Remote() {
				return usagef("cp", "exactly one of source and destination must be <sandbox-id>:<path>")
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			if dst.Remote() {
				return upload(ctx, r, c, src.Path, dst)
			}
			return download(ctx, r, c, src, dst.Path)
		}
	},
}

func filesClient(ctx context.Context, c *client.Client, sandboxID string) (*client.FilesClient, error) {
	sess, err := c.FilesSession(ctx, sandboxID)
	if err != nil {
		return nil, fmt.Errorf("open files session on %s: %w", sandboxID, err)
	}
	return &client.FilesClient{URL: sess.URL, SandboxID: sandboxID, Token: sess.Token}, nil
}

func upload(ctx context.Context, r *runner, c *client.Client, local string, dst Location) error {
	var (
		in   io.Reader
		mode fs.FileMode = 0o644
		name string
	)
	if local == "-" {
		in = r.env.Stdin
	} else {
		f, err := os.Open(local)
		if err != nil {
			return fmt.Errorf("open source: %w", err)
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return fmt.Errorf("stat source: %w", err)
		}
		if st.IsDir() {
			return fmt.Errorf("%s is a directory; cp copies single files", local)
		}
		in, mode, name = f, st.Mode().Perm(), filepath.Base(local)
	}
	fc, err := filesClient(ctx, c, dst.SandboxID)
	if err != nil {
		return err
	}
	target := dst.Path
	if name != "" {
		// Copying into a directory keeps the file's name, like cp(1).
		if strings.HasSuffix(target, "/") {
			target = path.Join(target, name)
		} else if fi, err := fc.Stat(ctx, target); err == nil && fi.Type == "dir" {
			target = path.Join(target, name)
		}
	}
	if _, err := fc.Write(ctx, target, in, fmt.Sprintf("%04o", mode), ""); err != nil {
		return fmt.Errorf("write %s:%s: %w", dst.SandboxID, target, err)
	}
	return nil
}

func download(ctx context.Context, r *runner, c *client.Client, src Location, local string) error {
	fc, err := filesClient(ctx, c, src.SandboxID)
	if err != nil {
		return err
	}
	if local == "-" {
		body, err := fc.Read(ctx, src.Path)
		if err != nil {
			return fmt.Errorf("read %s: %w", src, err)
		}
		defer body.Close()
		if _, err := io.Copy(r.stdout, body); err != nil {
			return fmt.Errorf("copy %s to stdout: %w", src, err)
		}
		return nil
	}
	info, err := fc.Stat(ctx, src.Path)
	if err != nil {
		return fmt.Errorf("%s: %w", src, err)
	}
	if info.Type == "dir" {
		return fmt.Errorf("%s is a directory; cp copies single files", src)
	}
	if st, err := os.Stat(local); err == nil && st.IsDir() {
		local = filepath.Join(local, path.Base(src.Path))
	}
	mode := fs.FileMode(0o644)
	if m, err := strconv.ParseUint(info.Mode, 8, 32); err == nil {
		mode = fs.FileMode(m).Perm()
	}
	body, err := fc.Read(ctx, src.Path)
	if err != nil {
		return fmt.Errorf("read %s: %w", src, err)
	}
	defer body.Close()
	f, err := os.OpenFile(local, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return fmt.Errorf("create destination: %w", err)
	}
	if _, err := io.Copy(f, body); err != nil {
		f.Close()
		return fmt.Errorf("copy %s to %s: %w", src, local, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", local, err)
	}
	return nil
}
