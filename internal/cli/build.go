package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/dockerfile"
	"github.com/airlock/airlock/internal/model"
)

// buildFollowWait is how long one events call waits for news.
const buildFollowWait = 30 * time.Second

var templateBuildCmd = &command{
	name:    "template build",
	args:    "[-f Dockerfile] --name NAME[:TAG] [--build-arg K=V]... [--no-cache] [--quiet] [--json] [context-dir]",
	summary: "build a template from a Dockerfile: RUN steps run in sandboxes, every step is cached",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		file := fs.String("f", "", "the Dockerfile `path` (default: Dockerfile in the context directory)")
		nameTag := fs.String("name", "", "template `name[:tag]` of the result (tag default latest)")
		buildArgs := kvFlag{}
		fs.Var(buildArgs, "build-arg", "set an ARG: `NAME=value` (repeatable)")
		noCache := fs.Bool("no-cache", false, "run every step, ignoring the step cache")
		quiet := fs.Bool("quiet", false, "print only the result, not the steps and their output")
		asJSON := fs.Bool("json", false, "print the finished build as JSON")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) > 1 {
				return usagef("template build", "want at most one context directory, got %d arguments", len(args))
			}
			if *nameTag == "" {
				return usagef("template build", "--name is required")
			}
			dir := "."
			if len(args) == 1 {
				dir = args[0]
			}
			df := *file
			if df == "" {
				df = filepath.Join(dir, "Dockerfile")
			}
			src, err := os.ReadFile(df)
			if err != nil {
				return fmt.Errorf("read the Dockerfile: %w", err)
			}
			name, tag, _ := strings.Cut(*nameTag, ":")
			tmp, err := os.MkdirTemp("", "airlock-build-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(tmp)
			spec, files, err := dockerfile.Parse(src, dir, tmp, name, tag, buildArgs)
			if err != nil {
				return fmt.Errorf("%s: %w", df, err)
			}
			spec.Force = *noCache
			c, err := r.client()
			if err != nil {
				return err
			}
			progress := r.stderr
			if *quiet || *asJSON {
				progress = nil
			}
			b, err := runBuild(ctx, c, spec, files, func(format string, a ...any) {
				if progress != nil {
					fmt.Fprintf(progress, format, a...)
				}
			})
			if *asJSON && b.ID != "" {
				if perr := printJSON(r.stdout, b); perr != nil {
					return perr
				}
			}
			if err != nil {
				return err
			}
			if !*asJSON {
				fmt.Fprintf(r.stdout, "%s:%s %s\n", b.Spec.Name, b.Spec.Tag, b.Digest)
			}
			return nil
		}
	},
}

// runBuild uploads the files the server lacks, starts spec and follows
// its events to the end, printing them with printf; it returns the
// finished build (an error when it failed).
func runBuild(ctx context.Context, c *client.Client, spec model.BuildSpec, files []dockerfile.ContextFile, printf func(string, ...any)) (model.Build, error) {
	for _, f := range files {
		has, err := c.HasBuildFile(ctx, f.Hash)
		if err != nil {
			return model.Build{}, fmt.Errorf("check build file %s: %w", f.Hash, err)
		}
		if has {
			continue
		}
		fh, err := os.Open(f.Path)
		if err != nil {
			return model.Build{}, err
		}
		printf("uploading %s (%d bytes)\n", f.Hash[:12], f.Size)
		err = c.PutBuildFile(ctx, f.Hash, fh, f.Size)
		fh.Close()
		if err != nil {
			return model.Build{}, fmt.Errorf("upload build file %s: %w", f.Hash, err)
		}
	}
	b, err := c.StartBuild(ctx, spec)
	if err != nil {
		return b, fmt.Errorf("start the build: %w", err)
	}
	printf("build %s on %s\n", b.ID, b.Worker)
	total := len(spec.Steps)
	after := 0
	for {
		res, err := c.BuildEventsAfter(ctx, b.ID, after, buildFollowWait)
		if err != nil {
			return b, fmt.Errorf("follow build %s: %w", b.ID, err)
		}
		for _, ev := range res.Events {
			after = max(after, ev.Seq)
			switch ev.Type {
			case "step":
				if ev.Step == nil {
					continue
				}
				n := fmt.Sprintf("%d/%d", ev.Step.Index+1, total)
				if ev.Step.Index < 0 {
					n = "0/" + fmt.Sprint(total)
				}
				cached := ""
				if ev.Step.Cached {
					cached = "  (cached)"
				}
				printf("step %s  %s%s\n", n, ev.Step.Text, cached)
			case "output":
				printf("  | %s\n", ev.Text)
			case "info", "step_done":
				printf("  %s\n", ev.Text)
			case "error":
				printf("error: %s\n", ev.Text)
			}
		}
		if len(res.Events) == 0 && (res.State == model.BuildReady || res.State == model.BuildFailed) {
			break
		}
	}
	b, err = c.GetBuild(ctx, b.ID)
	if err != nil {
		return b, err
	}
	if b.State != model.BuildReady {
		return b, errors.New("build " + b.ID + " failed: " + b.Error)
	}
	return b, nil
}
