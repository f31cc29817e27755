package cli

import (
	"archive/tar"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
)

// TemplateImport is one `airlock template import` or `pull`, as the
// importer gets it.
type TemplateImport struct {
	Source string // an OCI layout directory, or a tar (OCI layout or docker save); with Pull, an image reference
	// Pull fetches Source from its registry (Insecure: over plain HTTP).
	Pull, Insecure bool
	Name, Tag      string
	DataDir        string // the worker's data directory, whose catalog gets the template
	Agent          string // the guest agent to put in it; "" for the importer's default
	Ref            string // which image of several
	Progress       io.Writer
}

// TemplateImported is what the importer did.
type TemplateImported struct {
	Template model.Template `json:"template"`
	Existing bool           `json:"existing"` // it was in the catalog already
	Notes    []string       `json:"notes,omitempty"`
}

// ImportFunc imports an image into a worker's template catalog.
// cmd/airlock sets Env.ImportTemplate to internal/image/oci's: image code
// is worker code, which the CLI does not link.
type ImportFunc func(ctx context.Context, req TemplateImport) (TemplateImported, error)

// templateSeenWait bounds how long import waits for the server to list the
// new template (the worker reports its catalog every few seconds, on its
// next sync).
const templateSeenWait = 2 * time.Minute

var templateImportCmd = &command{
	name:    "template import",
	args:    "<archive|dir> --name NAME[:TAG] [--upload] [--data-dir DIR] [--agent PATH] [--ref REF] [--no-wait] [--json]",
	summary: "import an OCI image (layout dir or tar, or a docker save archive) as a template of the worker on this machine, or --upload it through the API",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		f := importFlags(fs, "template `name[:tag]` (tag default latest)")
		ref := fs.String("ref", "", "which image of an archive with several: its ref.name annotation or repo:tag")
		upload := fs.Bool("upload", false, "send the image to the server (POST /v1/templates), which has a worker import it: no root or worker data directory needed here (operator key)")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 1 {
				return usagef("template import", "want exactly one image archive or layout directory, got %d arguments", len(args))
			}
			if *f.nameTag == "" {
				return usagef("template import", "--name is required")
			}
			if *upload {
				return uploadImport(ctx, r, args[0], *f.nameTag, *ref, *f.asJSON)
			}
			return f.run(ctx, r, TemplateImport{Source: args[0], Ref: *ref})
		}
	},
}

// uploadImport sends src (an archive, or a layout directory tarred on the
// fly) to the server's POST /v1/templates.
func uploadImport(ctx context.Context, r *runner, src, nameTag, ref string, asJSON bool) error {
	c, err := r.client()
	if err != nil {
		return err
	}
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	var body io.Reader
	size := int64(-1)
	if fi.IsDir() {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(tarDir(pw, src)) }()
		defer pr.Close()
		body = pr
	} else {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		body, size = f, fi.Size()
	}
	name, tag, _ := strings.Cut(nameTag, ":")
	t, err := c.ImportTemplate(ctx, name, tag, ref, body, size)
	if err != nil {
		return fmt.Errorf("import %s: %w", src, err)
	}
	if asJSON {
		return printJSON(r.stdout, TemplateImported{Template: t})
	}
	fmt.Fprintf(r.stdout, "%s:%s %s\n", t.Name, t.Tag, t.Digest)
	return nil
}

// tarDir writes directory dir (an OCI image layout) as a tar: its regular
// files and directories, paths relative to dir.
func tarDir(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if !info.IsDir() && !info.Mode().IsRegular() {
			return nil // a layout holds only files and directories
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if info.IsDir() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

var templatePullCmd = &command{
	name:    "template pull",
	args:    "<image-ref> [--name NAME[:TAG]] [--insecure] [--data-dir DIR] [--agent PATH] [--no-wait] [--json]",
	summary: "pull an image from an OCI registry as a template of the worker on this machine",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		f := importFlags(fs, "template `name[:tag]` (default: the image's last path component and tag)")
		insecure := fs.Bool("insecure", false, "reach the registry over plain HTTP (localhost and private addresses already are)")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 1 {
				return usagef("template pull", "want exactly one image reference, got %d arguments", len(args))
			}
			if *f.nameTag == "" {
				n, ok := refName(args[0])
				if !ok {
					return usagef("template pull", "cannot name a template after %q: pass --name", args[0])
				}
				*f.nameTag = n
			}
			return f.run(ctx, r, TemplateImport{Source: args[0], Pull: true, Insecure: *insecure})
		}
	},
}

// refName is the template name:tag for an image reference:
// "registry:5000/team/app:1.2" is app:1.2, "alpine" alpine:latest; a
// reference by digest only has none.
func refName(ref string) (string, bool) {
	if strings.Contains(ref, "@") {
		return "", false
	}
	last := ref[strings.LastIndex(ref, "/")+1:]
	n, tag, _ := strings.Cut(last, ":")
	if n == "" {
		return "", false
	}
	if tag == "" {
		tag = "latest"
	}
	return strings.ToLower(n) + ":" + tag, true
}

// importCmdFlags are the flags import and pull share.
type importCmdFlags struct {
	nameTag, dataDir, agent *string
	noWait, asJSON          *bool
}

func importFlags(fs *flag.FlagSet, nameUsage string) importCmdFlags {
	return importCmdFlags{
		nameTag: fs.String("name", "", nameUsage),
		dataDir: fs.String("data-dir", "", "the worker's data `directory` (default $AIRLOCK_DATA_DIR, else ~/.local/share/airlock)"),
		agent:   fs.String("agent", "", "guest agent `binary` to put in the template (default: the one in the newest base template there)"),
		noWait:  fs.Bool("no-wait", false, "return once imported, without waiting for the server to list it"),
		asJSON:  fs.Bool("json", false, "print {\"template\", \"existing\", \"notes\"} as JSON"),
	}
}

// run imports req (Source, Pull, Insecure, Ref set) with the flags.
func (f importCmdFlags) run(ctx context.Context, r *runner, req TemplateImport) error {
	if r.env.ImportTemplate == nil {
		return errors.New("template import is not available in this build (the importer is linked by cmd/airlock)")
	}
	req.Name, req.Tag, _ = strings.Cut(*f.nameTag, ":")
	if req.Tag == "" {
		req.Tag = "latest"
	}
	req.DataDir = *f.dataDir
	if req.DataDir == "" {
		req.DataDir = DataDir(r.env.getenv)
	}
	req.Agent = *f.agent
	req.Progress = r.stderr
	if *f.asJSON {
		req.Progress = io.Discard
	}
	res, err := r.env.ImportTemplate(ctx, req)
	if err != nil {
		return err
	}
	t := res.Template
	if !*f.asJSON {
		for _, note := range res.Notes {
			fmt.Fprintf(r.stderr, "note: %s\n", note)
		}
	}
	if !*f.noWait {
		if err := waitTemplateListed(ctx, r, t); err != nil {
			fmt.Fprintf(r.stderr, "note: %v\n", err)
		}
	}
	if *f.asJSON {
		return printJSON(r.stdout, res)
	}
	fmt.Fprintf(r.stdout, "%s:%s %s\n", t.Name, t.Tag, t.Digest)
	return nil
}

// waitTemplateListed waits until the server resolves t's name:tag to its
// digest; an error says why it does not (yet).
func waitTemplateListed(ctx context.Context, r *runner, t model.Template) error {
	c, err := r.client()
	if err != nil {
		return fmt.Errorf("not waiting for the server to list %s:%s: %w", t.Name, t.Tag, err)
	}
	ctx, cancel := context.WithTimeout(ctx, templateSeenWait)
	defer cancel()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		ts, err := c.ListTemplates(ctx)
		if err == nil {
			for _, s := range ts {
				if s.Name == t.Name && s.Tag == t.Tag && s.Digest == t.Digest {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("the server at %s does not list %s:%s yet (%v); its worker reports the template at its next sync", c.BaseURL, t.Name, t.Tag, err)
			}
			return fmt.Errorf("the server does not list %s:%s as %s after %s: is a worker running on this data directory?", t.Name, t.Tag, t.Digest, templateSeenWait)
		case <-tick.C:
		}
	}
}

var templateGetCmd = &command{
	name:    "template get",
	args:    "<name[:tag]|digest> [--json]",
	summary: "show one template: digest, size, config and the workers that hold it",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		asJSON := fs.Bool("json", false, "print the template as JSON")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 1 {
				return usagef("template get", "want exactly one template reference, got %d arguments", len(args))
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			t, err := c.GetTemplate(ctx, args[0])
			if err != nil {
				return fmt.Errorf("get template %s: %w", args[0], err)
			}
			if *asJSON {
				return printJSON(r.stdout, t)
			}
			printTemplate(r.stdout, t)
			return nil
		}
	},
}

var templateRemoveCmd = &command{
	name:    "template rm",
	args:    "<name[:tag]|digest> [--json]",
	summary: "delete a template; refused while sandboxes or warm pools use it (operator key)",
	setup: func(fs *flag.FlagSet) func(context.Context, *runner, []string) error {
		asJSON := fs.Bool("json", false, "print the deleted template as JSON")
		return func(ctx context.Context, r *runner, args []string) error {
			if len(args) != 1 {
				return usagef("template rm", "want exactly one template reference, got %d arguments", len(args))
			}
			c, err := r.client()
			if err != nil {
				return err
			}
			t, err := c.DeleteTemplate(ctx, args[0])
			if err != nil {
				return fmt.Errorf("delete template %s: %w", args[0], err)
			}
			if *asJSON {
				return printJSON(r.stdout, t)
			}
			name := t.Digest
			if t.Name != "" {
				name = t.Name + ":" + t.Tag + " " + t.Digest
			}
			fmt.Fprintf(r.stdout, "deleted %s\n", name)
			if len(t.Workers) > 0 {
				fmt.Fprintf(r.stderr, "note: removed from %s at their next sync\n", strings.Join(t.Workers, ", "))
			}
			return nil
		}
	},
}

func printTemplate(w io.Writer, t apitypes.Template) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	if t.Name != "" {
		row("Name", t.Name+":"+t.Tag)
	} else {
		row("Name", "(none: no tag points at this content any more)")
	}
	row("Digest", t.Digest)
	if t.SizeBytes > 0 {
		row("Size", size(t.SizeBytes))
	}
	if !t.CreatedAt.IsZero() {
		row("Created", stamp(t.CreatedAt))
	}
	if cfg := t.Config; cfg != nil {
		if cfg.User != "" {
			row("User", cfg.User)
		}
		if cfg.WorkingDir != "" {
			row("Working dir", cfg.WorkingDir)
		}
		for i, kv := range cfg.Env {
			k := ""
			if i == 0 {
				k = "Env"
			}
			fmt.Fprintf(tw, "%s\t%s\n", k+":", kv)
		}
		if len(cfg.Entrypoint) > 0 {
			row("Entrypoint", strings.Join(cfg.Entrypoint, " "))
		}
		if len(cfg.Cmd) > 0 {
			row("Cmd", strings.Join(cfg.Cmd, " "))
		}
	}
	workers := strings.Join(t.Workers, ", ")
	if workers == "" {
		workers = "none"
	}
	row("Workers", workers)
	tw.Flush()
}
