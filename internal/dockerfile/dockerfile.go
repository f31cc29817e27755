// Package dockerfile reads a Dockerfile into a template recipe
// (model.BuildSpec) and packs each COPY's sources from the build context
// into a tar named by its sha256, for `airlock template build` to upload
// and the server's builder (internal/image/build) to run. It links no
// worker code: the CLI uses it.
package dockerfile

import (
	"archive/tar"
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"

	"github.com/airlock/airlock/internal/model"
)

// The Dockerfile frontend reads a Dockerfile (with BuildKit's parser and
// instruction reader, so its syntax is Docker's own: continuation lines,
// JSON and shell forms, ENV and ARG substitution) into a recipe, and packs
// each COPY's sources from the context directory into a tar named by its
// sha256. Supported: one stage — FROM (a template), RUN, COPY and ADD of
// local files (--chown, --chmod), ENV, ARG (--build-arg), WORKDIR, USER,
// CMD, ENTRYPOINT, LABEL and EXPOSE (accepted, no effect) — and two
// instructions of Airlock's own, START <shell command> and READY <shell
// command> (model.BuildSpec.StartCmd, ReadyCmd). Anything else is refused
// with the line it is on.

// ContextFile is one COPY's files, packed.
type ContextFile struct {
	Hash string // sha256 hex of the tar
	Path string // the tar, in the directory Parse was given
	Size int64
}

// Limits of what a Dockerfile build packs from its context.
const (
	MaxDockerfileBytes = 1 << 20
	MaxContextBytes    = model.MaxBuildFileBytes // what one upload may be
	MaxContextEntries  = 1_000_000
)

// Parse reads df into a recipe named name:tag, packing COPY
// sources from contextDir into tars under tmp. buildArgs override ARG
// defaults. The errors match model.ErrInvalid and name the line.
func Parse(df []byte, contextDir, tmp, name, tag string, buildArgs map[string]string) (model.BuildSpec, []ContextFile, error) {
	spec := model.BuildSpec{Name: name, Tag: tag}
	if len(df) > MaxDockerfileBytes {
		return spec, nil, model.Errorf(model.ErrInvalid, "the Dockerfile is over %d bytes", MaxDockerfileBytes)
	}
	res, err := parser.Parse(strings.NewReader(string(df)))
	if err != nil {
		return spec, nil, model.Errorf(model.ErrInvalid, "Dockerfile: %v", err)
	}
	ctxRoot, err := os.OpenRoot(contextDir)
	if err != nil {
		return spec, nil, fmt.Errorf("build context: %w", err)
	}
	defer ctxRoot.Close()
	ignore, err := readDockerignore(ctxRoot)
	if err != nil {
		return spec, nil, err
	}
	lex := shell.NewLex(res.EscapeToken)
	args := map[string]string{} // ARGs in scope
	var argOrder []string
	var env []string // ENV so far, for substitution
	var files []ContextFile
	seen := map[string]bool{}
	from := false
	used := map[string]bool{}

	vars := func() shell.EnvGetter {
		all := make([]string, 0, len(args)+len(env))
		for _, k := range argOrder {
			all = append(all, k+"="+args[k])
		}
		return shell.EnvsFromSlice(append(all, env...))
	}
	expand := func(w string) (string, error) {
		out, _, err := lex.ProcessWord(w, vars())
		return out, err
	}
	for _, node := range res.AST.Children {
		line := node.StartLine
		bad := func(format string, a ...any) error {
			return model.Errorf(model.ErrInvalid, "Dockerfile line %d: %s", line, fmt.Sprintf(format, a...))
		}
		keyword := strings.ToUpper(node.Value)
		if keyword == "START" || keyword == "READY" {
			if !from {
				return spec, nil, bad("%s before FROM", keyword)
			}
			cmd := strings.TrimSpace(node.Original[len(node.Value):])
			if cmd == "" {
				return spec, nil, bad("%s needs a shell command", keyword)
			}
			if keyword == "START" {
				spec.StartCmd = cmd
			} else {
				spec.ReadyCmd = cmd
			}
			continue
		}
		ins, err := instructions.ParseInstruction(node)
		if err != nil {
			return spec, nil, bad("%v", err)
		}
		if ex, ok := ins.(instructions.SupportsSingleWordExpansion); ok {
			if _, isRun := ins.(*instructions.RunCommand); !isRun {
				if err := ex.Expand(expand); err != nil {
					return spec, nil, bad("%v", err)
				}
			}
		}
		text := strings.TrimSpace(node.Original)
		switch c := ins.(type) {
		case *instructions.ArgCommand:
			for _, kv := range c.Args {
				v := ""
				if kv.Value != nil {
					v = *kv.Value
				}
				if bv, ok := buildArgs[kv.Key]; ok {
					v = bv
					used[kv.Key] = true
				}
				if _, ok := args[kv.Key]; !ok {
					argOrder = append(argOrder, kv.Key)
				}
				args[kv.Key] = v
			}
		case *instructions.Stage:
			if from {
				return spec, nil, bad("a second FROM: multi-stage builds are not supported")
			}
			base, err := expand(c.BaseName)
			if err != nil {
				return spec, nil, bad("%v", err)
			}
			if base == "scratch" {
				return spec, nil, bad("FROM scratch: build FROM a template (base, debian:bookworm, or one you imported)")
			}
			if c.Platform != "" {
				return spec, nil, bad("FROM --platform is not supported")
			}
			spec.From, from = base, true
		default:
			if !from {
				return spec, nil, bad("%s before FROM", keyword)
			}
			step, err := stepOf(ins, text, expand, args, argOrder)
			if err != nil {
				return spec, nil, bad("%v", err)
			}
			if step == nil {
				continue // LABEL, EXPOSE, …
			}
			if step.Kind == model.StepEnv {
				for i := 0; i+1 < len(step.Args); i += 2 {
					env = append(env, step.Args[i]+"="+step.Args[i+1])
				}
			}
			if cp, ok := ins.(*instructions.CopyCommand); ok {
				f, err := packCopy(ctxRoot, ignore, cp.SourcePaths, cp.DestPath, tmp, step)
				if err != nil {
					return spec, nil, bad("%v", err)
				}
				if !seen[f.Hash] {
					seen[f.Hash] = true
					files = append(files, f)
				}
			}
			if add, ok := ins.(*instructions.AddCommand); ok {
				for _, src := range add.SourcePaths {
					if strings.Contains(src, "://") || strings.HasPrefix(src, "git@") {
						return spec, nil, bad("ADD of a URL is not supported: fetch it in a RUN step (the sandbox has the network)")
					}
				}
				f, err := packCopy(ctxRoot, ignore, add.SourcePaths, add.DestPath, tmp, step)
				if err != nil {
					return spec, nil, bad("%v", err)
				}
				if !seen[f.Hash] {
					seen[f.Hash] = true
					files = append(files, f)
				}
			}
			spec.Steps = append(spec.Steps, *step)
		}
	}
	if !from {
		return spec, nil, model.Errorf(model.ErrInvalid, "the Dockerfile has no FROM")
	}
	for k := range buildArgs {
		if !used[k] {
			return spec, nil, model.Errorf(model.ErrInvalid, "--build-arg %s: the Dockerfile declares no ARG %s", k, k)
		}
	}
	if err := spec.Validate(); err != nil {
		return spec, nil, err
	}
	return spec, files, nil
}

// stepOf maps one instruction onto a step (nil: accepted, no effect).
func stepOf(ins any, text string, expand func(string) (string, error), args map[string]string, argOrder []string) (*model.BuildStep, error) {
	switch c := ins.(type) {
	case *instructions.RunCommand:
		if len(c.FlagsUsed) > 0 {
			return nil, fmt.Errorf("RUN --%s is not supported", c.FlagsUsed[0])
		}
		if len(c.Files) > 0 {
			return nil, errors.New("RUN with a here-document is not supported")
		}
		if c.PrependShell {
			cmd := strings.Join(c.CmdLine, " ")
			// ARGs are in a RUN's environment (and so in its cache key), as
			// in Docker.
			var pre strings.Builder
			for _, k := range argOrder {
				fmt.Fprintf(&pre, "%s=%s ", k, shellQuote(args[k]))
			}
			if pre.Len() > 0 {
				cmd = "export " + strings.TrimSpace(pre.String()) + "; " + cmd
			}
			return &model.BuildStep{Kind: model.StepRun, Args: []string{cmd}, Text: text}, nil
		}
		// The exec form is run as written, as Docker does (no shell, no
		// substitution).
		return &model.BuildStep{Kind: model.StepRun, Args: slices.Clone(c.CmdLine), Exec: true, Text: text}, nil
	case *instructions.CopyCommand:
		if c.From != "" {
			return nil, errors.New("COPY --from is not supported (one stage only)")
		}
		if c.Link || c.Parents || len(c.ExcludePatterns) > 0 {
			return nil, errors.New("COPY --link, --parents and --exclude are not supported")
		}
		if len(c.SourceContents) > 0 {
			return nil, errors.New("COPY of a here-document is not supported")
		}
		return &model.BuildStep{Kind: model.StepCopy, Chown: c.Chown, Chmod: c.Chmod, Text: text}, nil
	case *instructions.AddCommand:
		if c.Link || len(c.ExcludePatterns) > 0 || c.Checksum != "" {
			return nil, errors.New("ADD --link, --exclude and --checksum are not supported")
		}
		if len(c.SourceContents) > 0 {
			return nil, errors.New("ADD of a here-document is not supported")
		}
		return &model.BuildStep{Kind: model.StepCopy, Chown: c.Chown, Chmod: c.Chmod, Text: text}, nil
	case *instructions.EnvCommand:
		s := &model.BuildStep{Kind: model.StepEnv, Text: text}
		for _, kv := range c.Env {
			s.Args = append(s.Args, kv.Key, kv.Value)
		}
		return s, nil
	case *instructions.WorkdirCommand:
		return &model.BuildStep{Kind: model.StepWorkdir, Args: []string{c.Path}, Text: text}, nil
	case *instructions.UserCommand:
		return &model.BuildStep{Kind: model.StepUser, Args: []string{c.User}, Text: text}, nil
	case *instructions.CmdCommand:
		return &model.BuildStep{Kind: model.StepCmd, Args: cmdArgs(c.ShellDependantCmdLine), Exec: !c.PrependShell, Text: text}, nil
	case *instructions.EntrypointCommand:
		return &model.BuildStep{Kind: model.StepEntrypoint, Args: cmdArgs(c.ShellDependantCmdLine), Exec: !c.PrependShell, Text: text}, nil
	case *instructions.LabelCommand, *instructions.ExposeCommand, *instructions.MaintainerCommand, *instructions.StopSignalCommand:
		return nil, nil
	default:
		if c, ok := ins.(instructions.Command); ok {
			return nil, fmt.Errorf("%s is not supported", strings.ToUpper(c.Name()))
		}
		return nil, fmt.Errorf("%s is not supported", strings.Fields(text)[0])
	}
}

func cmdArgs(c instructions.ShellDependantCmdLine) []string {
	if c.PrependShell {
		return []string{strings.Join(c.CmdLine, " ")}
	}
	return slices.Clone(c.CmdLine)
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// packCopy packs a COPY's sources into a tar under tmp and fills in step's
// destination: a directory source is copied by its content, a file by its
// name; one file to a destination without a trailing slash is ToFile.
func packCopy(root *os.Root, ignore []string, sources []string, dest, tmp string, step *model.BuildStep) (ContextFile, error) {
	type item struct{ src, name string } // context path, name in the tar
	var items []item
	for _, s := range sources {
		pat := path.Clean(strings.TrimPrefix(filepath.ToSlash(s), "/"))
		if pat == ".." || strings.HasPrefix(pat, "../") {
			return ContextFile{}, fmt.Errorf("COPY source %q is outside the build context", s)
		}
		matches := []string{pat}
		if strings.ContainsAny(pat, "*?[") {
			m, err := fs.Glob(root.FS(), pat)
			if err != nil {
				return ContextFile{}, fmt.Errorf("COPY source %q: %v", s, err)
			}
			matches = m
		}
		if len(matches) == 0 {
			return ContextFile{}, fmt.Errorf("COPY source %q matches nothing in the build context", s)
		}
		for _, m := range matches {
			if ignored(ignore, m) {
				continue
			}
			fi, err := root.Lstat(m)
			if err != nil {
				return ContextFile{}, fmt.Errorf("COPY source %q: not in the build context", s)
			}
			if fi.IsDir() {
				items = append(items, item{m, "."})
			} else {
				items = append(items, item{m, path.Base(m)})
			}
		}
	}
	if len(items) == 0 {
		return ContextFile{}, errors.New("COPY sources are all excluded by .dockerignore")
	}
	step.Args = []string{dest}
	if len(items) == 1 && items[0].name != "." && !strings.HasSuffix(dest, "/") && len(sources) == 1 && !strings.ContainsAny(sources[0], "*?[") {
		step.ToFile = true
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return ContextFile{}, err
	}
	f, err := os.CreateTemp(tmp, "copy-*.tar")
	if err != nil {
		return ContextFile{}, err
	}
	defer f.Close()
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, h)}
	tw := tar.NewWriter(cw)
	entries := 0
	for _, it := range items {
		err := fs.WalkDir(root.FS(), it.src, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if p != it.src && ignored(ignore, p) {
				if d.IsDir() {
					return fs.SkipDir
				}
				return nil
			}
			rel := it.name
			if p != it.src {
				r := strings.TrimPrefix(p, it.src+"/")
				if it.src == "." {
					r = p
				}
				rel = path.Join(it.name, r)
			}
			if rel == "." {
				return nil
			}
			entries++
			if entries > MaxContextEntries || cw.n > MaxContextBytes {
				return fmt.Errorf("the COPY sources are over %d entries or %d bytes", MaxContextEntries, MaxContextBytes)
			}
			return addEntry(tw, root, p, rel)
		})
		if err != nil {
			os.Remove(f.Name())
			return ContextFile{}, fmt.Errorf("pack COPY sources: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		os.Remove(f.Name())
		return ContextFile{}, err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	step.FilesHash = sum
	final := filepath.Join(tmp, sum+".tar")
	if err := os.Rename(f.Name(), final); err != nil {
		return ContextFile{}, err
	}
	return ContextFile{Hash: sum, Path: final, Size: cw.n}, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// addEntry writes context path p as tar entry rel: its mode and content
// (owners are the COPY's business, times are left out so that the tar,
// and the cache key, depend on content only).
func addEntry(tw *tar.Writer, root *os.Root, p, rel string) error {
	fi, err := root.Lstat(p)
	if err != nil {
		return err
	}
	hdr := &tar.Header{Name: rel, Mode: int64(fi.Mode().Perm()), Format: tar.FormatPAX}
	switch {
	case fi.IsDir():
		hdr.Typeflag, hdr.Name = tar.TypeDir, rel+"/"
		return tw.WriteHeader(hdr)
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := root.Readlink(p)
		if err != nil {
			return err
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		return tw.WriteHeader(hdr)
	case fi.Mode().IsRegular():
		hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		f, err := root.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.CopyN(tw, f, fi.Size())
		return err
	default:
		return nil // sockets, devices, fifos: not copied
	}
}

// readDockerignore reads the context's .dockerignore patterns.
func readDockerignore(root *os.Root) ([]string, error) {
	f, err := root.Open(".dockerignore")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(io.LimitReader(f, 1<<20))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		out = append(out, path.Clean(strings.TrimPrefix(l, "/")))
	}
	return out, sc.Err()
}

// ignored reports whether context path p matches a .dockerignore pattern
// (path.Match per pattern, on p and each of its parents; "!" exceptions
// re-include, the last match wins).
func ignored(patterns []string, p string) bool {
	out := false
	for _, pat := range patterns {
		neg := strings.HasPrefix(pat, "!")
		pat = strings.TrimPrefix(pat, "!")
		for q := p; q != "." && q != "/"; q = path.Dir(q) {
			if ok, _ := path.Match(pat, q); ok {
				out = !neg
				break
			}
		}
	}
	return out
}
