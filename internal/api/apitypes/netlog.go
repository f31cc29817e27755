package apitypes

import "github.com/airlock/airlock/internal/model"

// NetworkLogResponse is the body of GET /v1/sandboxes/{id}/network/log
// (?after=, ?limit=): the sandbox's egress decisions with seq after
// after, oldest first. Pass Next as ?after= to read on or to follow.
type NetworkLogResponse struct {
	Entries []model.NetDecision `json:"entries"`
	Next    int64               `json:"next"`
	// Missed counts entries after after that the log no longer holds (it
	// keeps the last 1,000 per sandbox).
	Missed int64 `json:"missed,omitempty"`
	// Reset: the log began again since after (its worker restarted, or
	// the sandbox moved); Entries start at its beginning.
	Reset bool `json:"reset,omitempty"`
	// Note explains an empty log (egress off, the sandbox on no worker, …).
	Note string `json:"note,omitempty"`
}
