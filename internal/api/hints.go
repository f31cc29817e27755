package api

import (
	"fmt"
	"strings"

	"github.com/airlock/airlock/internal/service"
)

// hintText words the next step a service error suggests for /v1 and CLI
// users: the route and the airlock command that take it ("" when err has
// none). writeError appends it to the error's message.
func hintText(err error) string {
	h, ok := service.HintOf(err)
	if !ok {
		return ""
	}
	id := h.SandboxID
	switch h.Kind {
	case service.HintWake:
		return fmt.Sprintf(" (POST /v1/sandboxes/%s/wake or `airlock sandbox wake %s`)", id, id)
	case service.HintWait:
		return fmt.Sprintf(" (`airlock op wait %s`)", id)
	case service.HintListTemplates:
		return "; GET /v1/templates lists them"
	case service.HintListCheckpoints:
		return fmt.Sprintf("; GET /v1/sandboxes/%s/checkpoints lists them", id)
	case service.HintRaiseQuota:
		return fmt.Sprintf(" (`airlock org set %s %s N`)", h.OrgID, quotaFlag(h.Quota))
	case service.HintGrantFeatures:
		return fmt.Sprintf(" (PATCH /v1/orgs/%s {\"features\":[%s]} or `airlock org set %s --features %s`)",
			h.OrgID, quoteList(h.Features), h.OrgID, strings.Join(h.Features, ","))
	case service.HintCreateAdminKey:
		return fmt.Sprintf(" (airlock key create --org %s --admin)", h.OrgID)
	case service.HintExportArchive:
		return " (a checkpoint archive is the tar stream of GET /v1/sandboxes/{id}/checkpoints/{name}/export)"
	case service.HintTrafficToken:
		return fmt.Sprintf(" (the token is traffic_token of GET /v1/sandboxes/%s; public traffic is public_traffic: true)", id)
	}
	return ""
}

// quotaFlag is the `airlock org set` flag that sets quota (a model.Quotas
// field by its /v1 name): "vcpus" → "--max-vcpus", "memory_mib" →
// "--max-memory-mib".
func quotaFlag(quota string) string { return "--max-" + strings.ReplaceAll(quota, "_", "-") }

func quoteList(vs []string) string {
	q := make([]string, len(vs))
	for i, v := range vs {
		q[i] = fmt.Sprintf("%q", v)
	}
	return strings.Join(q, ",")
}
