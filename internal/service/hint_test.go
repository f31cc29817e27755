package service_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
)

// TestErrorsNameNoTransport: the service's errors are in neutral words (no
// /v1 route, no airlock command, which E2B users would see too); the next
// step they suggest is a typed Hint that each adapter words.
func TestErrorsNameNoTransport(t *testing.T) {
	s := newService(t)
	ctx := t.Context()
	if _, _, err := s.Bootstrap(ctx); err != nil {
		t.Fatal(err)
	}
	p := service.Principal{OrgID: service.DefaultOrgID, Admin: true}
	now := time.Now().UTC()
	if err := s.TestStore().PutTemplate(ctx, model.Template{Name: "base", Tag: "latest", Digest: "sha256:" + strings.Repeat("a", 64), CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	sb, _, err := s.CreateSandbox(ctx, p, service.CreateParams{}, "")
	if err != nil {
		t.Fatal(err)
	}
	_, _, errTemplate := s.CreateSandbox(ctx, p, service.CreateParams{Template: "nope"}, "")
	_, errBusy := s.PauseSandbox(ctx, p, sb.ID) // its create is still open
	_, errGate := s.CreateCheckpoint(ctx, p, sb.ID, "c1")
	for _, tc := range []struct {
		name     string
		err      error
		sentinel error
		want     service.Hint
	}{
		{"unknown template", errTemplate, model.ErrUnprocessable, service.Hint{Kind: service.HintListTemplates}},
		{"operation in progress", errBusy, model.ErrConflict, service.Hint{Kind: service.HintWait, SandboxID: sb.ID}},
		{"feature gate", errGate, model.ErrForbidden, service.Hint{Kind: service.HintGrantFeatures, OrgID: service.DefaultOrgID, Features: []string{model.FeatureSnapshots}}},
	} {
		if !errors.Is(tc.err, tc.sentinel) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.sentinel)
			continue
		}
		if msg := tc.err.Error(); strings.Contains(msg, "/v1") || strings.Contains(msg, "airlock ") {
			t.Errorf("%s: message %q names a route or a command", tc.name, msg)
		}
		h, ok := service.HintOf(tc.err)
		if !ok || h.Kind != tc.want.Kind || h.SandboxID != tc.want.SandboxID || h.OrgID != tc.want.OrgID || strings.Join(h.Features, ",") != strings.Join(tc.want.Features, ",") {
			t.Errorf("%s: hint %+v (%v), want %+v", tc.name, h, ok, tc.want)
		}
	}
}
