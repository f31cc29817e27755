package service

// Templates as first-class objects (issue "Templates"): one template by
// reference, with its config and the workers that hold it, and deletion.
//
// A template is content, named by its digest; a name:tag points at one
// digest and moves when an import under that name:tag brings other
// content (the old content stays on its workers, untagged, and is
// reachable by digest). GET and DELETE take what creates take: "name"
// (tag latest), "name:tag" or "sha256:<hex>"; DELETE resolves the
// reference to a digest and deletes that content, with every name:tag
// pointing at it. Templates are installation-wide: any key may read one,
// only operators (admin keys of the default org) may delete one.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
)

// BaseTemplate is the built-in template's name (internal/setup builds it
// on every worker): it cannot be deleted.
const BaseTemplate = "base"

// maxTemplateUsers bounds how many users a refused deletion names.
const maxTemplateUsers = 20

// TemplateStatus is one template with the workers that report holding it.
// Name and Tag are empty for content no name:tag points at any more (a
// tag moved away from it); the server then knows only its digest.
type TemplateStatus struct {
	model.Template
	Workers []string `json:"workers"`
}

// GetTemplate returns the template ref names (name, name:tag or digest)
// and the workers that hold it; ErrNotFound if there is none.
func (s *Service) GetTemplate(ctx context.Context, p Principal, ref string) (TemplateStatus, error) {
	return s.templateStatus(ctx, ref)
}

func (s *Service) templateStatus(ctx context.Context, ref string) (TemplateStatus, error) {
	if ref == "" {
		return TemplateStatus{}, model.Errorf(model.ErrUnprocessable, "a template reference is required: name, name:tag or sha256:<digest>")
	}
	workers, err := s.st.ListWorkers(ctx)
	if err != nil {
		return TemplateStatus{}, fmt.Errorf("list workers: %w", err)
	}
	holders := func(digest string) []string {
		out := []string{}
		for _, w := range workers {
			if slices.Contains(w.Templates, digest) {
				out = append(out, w.ID)
			}
		}
		slices.Sort(out)
		return out
	}
	tpl, _, err := s.resolveTemplate(ctx, ref)
	if errors.Is(err, errTemplateNotFound) {
		// Content no name points at any more is still a template while a
		// worker holds it (and it is not being deleted).
		if strings.HasPrefix(ref, digestPrefix) {
			if hs := holders(ref); len(hs) > 0 {
				deleted, derr := s.st.ListTemplateDeletions(ctx)
				if derr != nil {
					return TemplateStatus{}, fmt.Errorf("list template deletions: %w", derr)
				}
				if _, gone := deleted[ref]; !gone {
					return TemplateStatus{Template: model.Template{Digest: ref}, Workers: hs}, nil
				}
			}
		}
		return TemplateStatus{}, withHint(model.Errorf(model.ErrNotFound, "template %q not found", ref), Hint{Kind: HintListTemplates})
	}
	if err != nil {
		return TemplateStatus{}, err
	}
	return TemplateStatus{Template: tpl, Workers: holders(tpl.Digest)}, nil
}

// DeleteTemplate deletes the template ref names (operators only): the
// content its reference resolves to, and every name:tag pointing at it.
// It is refused (ErrConflict, naming them) while anything uses the
// content: a sandbox not deleted (of any org; its checkpoints and suspend
// snapshot were taken on the template) or a warm pool; and always for the
// built-in base template. Otherwise the deletion is recorded and every
// worker that holds the template removes it (its tree, its ext4 image, its
// template images) at its next sync; the returned status lists them.
func (s *Service) DeleteTemplate(ctx context.Context, p Principal, ref string) (TemplateStatus, error) {
	if err := s.requireOperator(p, "deleting templates"); err != nil {
		return TemplateStatus{}, err
	}
	ts, err := s.templateStatus(ctx, ref)
	if err != nil {
		return TemplateStatus{}, err
	}
	what := ref
	if ts.Name != "" {
		what = fmt.Sprintf("%s:%s (%s)", ts.Name, ts.Tag, ts.Digest)
	}
	if ts.Name == BaseTemplate {
		return TemplateStatus{}, model.Errorf(model.ErrConflict, "template %s is the built-in base template, which every worker builds and sandboxes default to; it cannot be deleted", what)
	}
	if base, err := s.st.GetTemplate(ctx, BaseTemplate, defaultTemplateTag); err == nil && base.Digest == ts.Digest {
		return TemplateStatus{}, model.Errorf(model.ErrConflict, "template %s is the content of the built-in base template; it cannot be deleted", what)
	}
	err = s.st.InTx(ctx, func(tx store.Tx) error {
		users, err := templateUsers(ctx, tx, ts.Digest)
		if err != nil {
			return err
		}
		if len(users) > 0 {
			more := ""
			if len(users) > maxTemplateUsers {
				more = fmt.Sprintf(" and %d more", len(users)-maxTemplateUsers)
				users = users[:maxTemplateUsers]
			}
			return model.Errorf(model.ErrConflict, "template %s is in use by %s%s; delete those first (sandboxes with DELETE /v1/sandboxes/{id}, pools with DELETE /v1/pools/{template})",
				what, strings.Join(users, ", "), more)
		}
		return tx.DeleteTemplate(ctx, ts.Digest, s.now())
	})
	if err != nil {
		return TemplateStatus{}, err
	}
	if s.ev != nil {
		s.ev.Wake() // workers' long polls: their RemoveTemplates changed
	}
	s.kick()
	return ts, nil
}

// templateUsers names what uses template digest: warm pools, then
// sandboxes not deleted (members of a listed pool are its own).
func templateUsers(ctx context.Context, st store.Tx, digest string) ([]string, error) {
	var users []string
	pools, err := st.ListPools(ctx)
	if err != nil {
		return nil, fmt.Errorf("list pools: %w", err)
	}
	pooled := false
	for _, pl := range pools {
		if pl.Digest == digest {
			users = append(users, fmt.Sprintf("warm pool %s (size %d)", pl.Template, pl.Size))
			pooled = true
		}
	}
	sbs, err := store.ListAllSandboxes(ctx, st, store.SandboxFilter{})
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	for _, sb := range sbs {
		if sb.TemplateDigest != digest || sb.State == model.StateDeleted || (pooled && sb.Pool == digest) {
			continue
		}
		u := fmt.Sprintf("sandbox %s (org %s, %s", sb.ID, sb.OrgID, sb.State)
		if n := len(sb.Checkpoints); n > 0 {
			u += fmt.Sprintf(", %d checkpoint(s)", n)
		}
		users = append(users, u+")")
	}
	return users, nil
}
