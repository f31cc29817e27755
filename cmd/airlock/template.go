package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/airlock/airlock/internal/cli"
	"github.com/airlock/airlock/internal/image/oci"
)

// importTemplate is `airlock template import` and `pull`
// (cli.Env.ImportTemplate):
// the image goes into the catalog of the worker's data directory, which
// the worker reports to the server at its next sync.
func importTemplate(ctx context.Context, req cli.TemplateImport) (cli.TemplateImported, error) {
	agent := req.Agent
	if agent == "" {
		a, err := oci.BaseAgent(req.DataDir)
		if err != nil {
			return cli.TemplateImported{}, err
		}
		agent = a
	}
	o := oci.Options{Name: req.Name, Tag: req.Tag, Agent: agent, Ref: req.Ref, Progress: req.Progress}
	var rep oci.Report
	var err error
	if req.Pull {
		rep, err = oci.Pull(ctx, req.DataDir, req.Source, o, oci.PullOptions{Insecure: req.Insecure})
	} else {
		rep, err = oci.Import(ctx, req.DataDir, req.Source, o)
	}
	if err != nil {
		return cli.TemplateImported{}, err
	}
	out := cli.TemplateImported{Template: rep.Template, Existing: rep.Existing}
	if rep.DevicesSkipped > 0 {
		out.Notes = append(out.Notes, fmt.Sprintf("%d device nodes not created (%s): a sandbox's /dev is its own", rep.DevicesSkipped, strings.Join(rep.Devices, ", ")))
	}
	if rep.XattrsSkipped > 0 {
		out.Notes = append(out.Notes, fmt.Sprintf("%d extended attributes not kept (only user.* and security.capability are, where the file system takes them)", rep.XattrsSkipped))
	}
	return out, nil
}
