package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/airlock/airlock/internal/dockerfile"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/worker"
	"github.com/airlock/airlock/templates"
)

// The shipped templates (templates/: base, code-interpreter) are built on
// each worker by its own builder from the recipes embedded in the binary,
// at every start: a step already built is cached (the first start pays the
// apt-get of base, minutes; later starts take seconds). base is built
// before the worker runs, so that sandboxes never start from a half-made
// base; the others in the background once it runs (a create of
// code-interpreter before it is there is "template not found"). A worker
// that cannot build base (no egress on this machine, no gVisor) serves the
// Debian template under the name base instead, and says so.

// shippedUsage documents --build-templates.
const shippedUsage = "comma-separated shipped templates to build from their recipes at start (base, code-interpreter; \"\" for none: base is then the bare Debian template)"

// defaultShipped is every shipped template.
const defaultShipped = "base,code-interpreter"

// buildShipped builds the shipped templates named in which ("base" first,
// synchronously; the rest in the background).
func buildShipped(ctx context.Context, w *worker.Worker, which map[string]bool, progress io.Writer, log *slog.Logger) {
	if progress == nil {
		progress = io.Discard
	}
	if !which["base"] {
		log.Info("base is the bare Debian template (--build-templates does not name base)")
		if _, err := w.BuildLocal(ctx, model.BuildSpec{Name: "base", From: "debian:bookworm"}, nil, func(model.BuildEvent) {}); err != nil {
			log.Error("no base template", "err", err)
		}
	} else if err := buildOne(ctx, w, "base", true, progress, log); err != nil {
		which = nil // the others build on base
		log.Warn("the base template was not built from its recipe; base is the bare Debian template (no pip, Node.js or compilers)", "err", err)
		fmt.Fprintf(progress, "template: base: %v; serving the bare Debian template as base\n", err)
		if _, ferr := w.BuildLocal(ctx, model.BuildSpec{Name: "base", From: "debian:bookworm"}, nil, func(model.BuildEvent) {}); ferr != nil {
			log.Error("no base template", "err", ferr)
		}
	}
	var rest []string
	for _, s := range templates.All {
		if s.Name != "base" && which[s.Name] {
			rest = append(rest, s.Name)
		}
	}
	if len(rest) == 0 {
		return
	}
	w.Background(func() {
		for _, name := range rest {
			if err := buildOne(ctx, w, name, true, io.Discard, log); err != nil && ctx.Err() == nil {
				log.Warn("shipped template not built", "template", name, "err", err)
			}
		}
	})
}

// buildOne builds shipped template name from its embedded recipe (a
// no-op when !on).
func buildOne(ctx context.Context, w *worker.Worker, name string, on bool, progress io.Writer, log *slog.Logger) error {
	if !on {
		return fmt.Errorf("not asked for (--build-templates)")
	}
	var dir string
	for _, s := range templates.All {
		if s.Name == name {
			dir = s.Dir
		}
	}
	tmp, err := os.MkdirTemp("", "airlock-shipped-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	df, err := templates.WriteContext(dir, tmp)
	if err != nil {
		return err
	}
	src, err := os.ReadFile(df)
	if err != nil {
		return err
	}
	spec, cfs, err := dockerfile.Parse(src, tmp, tmp+"/.files", name, "latest", nil)
	if err != nil {
		return fmt.Errorf("recipe %s: %w", name, err)
	}
	files := map[string]string{}
	for _, f := range cfs {
		files[f.Hash] = f.Path
	}
	ran := false
	t, err := w.BuildLocal(ctx, spec, files, func(ev model.BuildEvent) {
		switch {
		case ev.Type == "step" && ev.Step != nil && !ev.Step.Cached && ev.Step.Index >= 0:
			ran = true
			fmt.Fprintf(progress, "template: %s: step %d/%d %s\n", name, ev.Step.Index+1, len(spec.Steps), firstLine(ev.Step.Text))
		case ev.Type == "output":
			log.Debug("template build", "template", name, "stream", ev.Stream, "line", ev.Text)
		}
	})
	if err != nil {
		return err
	}
	if ran {
		fmt.Fprintf(progress, "template: %s:%s is %s (%d MiB)\n", t.Name, t.Tag, t.Digest, t.SizeBytes>>20)
	}
	log.Info("shipped template ready", "template", name, "digest", t.Digest, "built", ran)
	return nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 100 {
		s = s[:100] + "…"
	}
	return s
}
