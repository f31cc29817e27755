package service

import (
	"errors"

	"github.com/airlock/airlock/internal/model"
)

// HintKind names the next step an error suggests.
type HintKind string

// The next steps the service's errors suggest. Each names what to do, not
// how: the adapters word it for their own clients (a /v1 route and a CLI
// command for the REST API, the E2B call for E2B SDK users, or nothing).
const (
	HintWake            HintKind = "wake"             // wake sandbox SandboxID, then retry
	HintWait            HintKind = "wait"             // wait for SandboxID's operation to finish, then retry
	HintListTemplates   HintKind = "list-templates"   // the installed templates list the valid ones
	HintListCheckpoints HintKind = "list-checkpoints" // SandboxID's checkpoints list the valid names
	HintRaiseQuota      HintKind = "raise-quota"      // an operator raises quota Quota of org OrgID
	HintGrantFeatures   HintKind = "grant-features"   // an operator gives org OrgID the feature gates Features
	HintCreateAdminKey  HintKind = "create-admin-key" // create another admin key of org OrgID first
	HintExportArchive   HintKind = "export-archive"   // an import takes an archive a checkpoint export wrote
	HintTrafficToken    HintKind = "traffic-token"    // where SandboxID's traffic token and the public-traffic setting are
)

// Hint is a next step with what its wording needs.
type Hint struct {
	Kind      HintKind
	SandboxID string
	OrgID     string
	Quota     string   // a model.Quotas field by its /v1 name (e.g. "vcpus")
	Features  []string // the gates the org needs, all of them
}

// HintError is a service error that suggests a next step. Error is the
// message in neutral words (no route, no command); Unwrap returns the
// cause, which wraps a model sentinel. Adapters find it with HintOf and
// add their own wording of Hint.
type HintError struct {
	Err  error
	Hint Hint
}

func (e *HintError) Error() string { return e.Err.Error() }
func (e *HintError) Unwrap() error { return e.Err }

// withHint attaches h to err.
func withHint(err error, h Hint) error { return &HintError{Err: err, Hint: h} }

// HintOf returns the next step err suggests, if any.
func HintOf(err error) (Hint, bool) {
	var he *HintError
	if errors.As(err, &he) {
		return he.Hint, true
	}
	return Hint{}, false
}

// noCheckpoint is the error for a checkpoint name sandbox id does not have.
func noCheckpoint(id, name string) error {
	return withHint(model.Errorf(model.ErrNotFound, "sandbox %s has no checkpoint named %q", id, name), Hint{Kind: HintListCheckpoints, SandboxID: id})
}
