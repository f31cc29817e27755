package e2bcompat

import (
	"fmt"
	"strings"

	"github.com/airlock/airlock/internal/service"
)

// message is err's message for E2B SDK users: the service's neutral words
// and, when the error suggests a next step, that step as an E2B user takes
// it (an SDK call or E2B route; for what only an operator does, the airlock
// command, as elsewhere in this adapter).
func message(err error) string {
	msg := err.Error()
	h, ok := service.HintOf(err)
	if !ok {
		return msg
	}
	id := h.SandboxID
	switch h.Kind {
	case service.HintWake:
		msg += fmt.Sprintf(" (resume it with Sandbox.connect: POST /sandboxes/%s/connect)", id)
	case service.HintListTemplates:
		msg += " (`airlock template ls` lists them)"
	case service.HintRaiseQuota:
		msg += fmt.Sprintf(" (`airlock org set %s --max-%s N`)", h.OrgID, strings.ReplaceAll(h.Quota, "_", "-"))
	case service.HintTrafficToken:
		// The sandbox router serves native sandboxes too.
		msg += fmt.Sprintf(" (the token is trafficAccessToken of the E2B API, or traffic_token of GET /v1/sandboxes/%s; public traffic is network.allowPublicTraffic in E2B, public_traffic: true on /v1)", id)
	}
	return msg
}
