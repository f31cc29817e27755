package daemon

import (
	"strings"

	"github.com/airlock/airlock/internal/egress"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/worker"
)

// egressRecorder takes every decision of the worker's egress gateway
// (egress.Config.OnEvent, called inline on the deciding goroutine): it
// counts it in the metrics and appends it to the sandbox's network log
// (worker.NetLog, which queues denials for network.denied events). Both
// are short, non-blocking steps.
type egressRecorder struct {
	log     *worker.NetLog
	metrics *metrics // nil: no --metrics-addr
}

func (r *egressRecorder) record(ev egress.Event) {
	d := netDecision(ev)
	if r.metrics != nil {
		r.metrics.egressDecision(d.Kind, d.Decision, d.Code)
	}
	if r.log != nil && ev.SandboxID != "" {
		r.log.Record(ev.SandboxID, d)
	}
}

// netDecision is ev as a network log entry (the worker bounds its strings).
func netDecision(ev egress.Event) model.NetDecision {
	d := model.NetDecision{
		Time: ev.Time, Kind: ev.Kind, Decision: model.NetDenied,
		Name: ev.Name, SNI: ev.SNI, Host: ev.Host, Port: ev.Port,
		Rule: ev.Rule, Code: reasonCode(ev.Allowed, ev.Rule, ev.Reason), Reason: ev.Reason,
	}
	switch d.Kind {
	case model.NetKindDNS, model.NetKindTCP, model.NetKindHTTP:
	default:
		d.Kind = model.NetKindTCP // the gateway has no other; a metrics label stays in the set
	}
	if ev.Allowed {
		d.Decision = model.NetAllowed
	}
	if ev.IP.IsValid() {
		d.IP = ev.IP.String()
	}
	if d.Rule < -1 {
		d.Rule = -1
	}
	return d
}

// reasonPrefixes wrap another reason: the code is the wrapped one's.
var reasonPrefixes = []string{"policy updated: ", "Host changed on a kept-alive connection: "}

// reasonCode maps the gateway's reason (egress and netpolicy words) onto
// the small fixed set of model.NetCode*, which metrics use as a label.
// The words are the gateway's own; TestReasonCode pins each family with
// reasons the real policy code produces, so a rewording shows up there.
// Reasons that quote what the guest sent (a name, an SNI, a Host) are
// told apart by how they start, before any test of what they contain.
func reasonCode(allowed bool, rule int, reason string) string {
	r := reason
	for _, p := range reasonPrefixes {
		r = strings.TrimPrefix(r, p)
	}
	pre := func(ps ...string) bool {
		for _, p := range ps {
			if strings.HasPrefix(r, p) {
				return true
			}
		}
		return false
	}
	has := func(subs ...string) bool {
		for _, s := range subs {
			if strings.Contains(r, s) {
				return true
			}
		}
		return false
	}
	switch {
	case allowed && rule >= 0:
		return model.NetCodeRule
	case allowed && pre("default allow"):
		return model.NetCodeDefault
	case allowed:
		return model.NetCodeOther
	case r == "not allowed by policy" || r == "name not allowed by policy":
		return model.NetCodeRule
	case pre("default allow admits tcp only"):
		return model.NetCodeProtocol
	case pre("rule "):
		return model.NetCodeRule
	case pre("default "):
		return model.NetCodeDefault
	case pre("interception", "secret "), has("no org CA", "intercepted now", "no longer intercepted"):
		return model.NetCodeInterception
	case pre("Host "):
		return model.NetCodeAttribution // an IP literal Host that is not the destination
	case pre("no rule allows udp"):
		return model.NetCodeProtocol
	case pre("absolute URI for "):
		return model.NetCodeProtocol
	case pre("name ", "invalid ", "malformed ", "not a valid host name", "protocol ", "request ", "CONNECT ", "Transfer-Encoding ", "chunked ", "HTTP ", "TLS "):
		return model.NetCodeProtocol
	case pre("upstream resolver failed", "dial: "):
		return model.NetCodeUpstream
	case pre("query from ", "connection from ", "sandbox detached"):
		return model.NetCodeUnattached
	case pre("nothing sent within", "client closed before naming a host", "a domain rule cannot admit a connection that names no host"):
		return model.NetCodeNoName
	case pre("too many queries in flight", "sandbox has "):
		return model.NetCodeLimit
	case has("DNS rebinding"):
		return model.NetCodeRebinding
	case has("was not resolved for"):
		return model.NetCodeAttribution
	case has("is IPv6, which only a CIDR rule admits", "is never admitted"):
		return model.NetCodeProtocol
	case has("never reachable", "no CIDR rule names it", "no destination address", "the gateway itself"):
		return model.NetCodeGuard
	case has("is not served", "questions in one query", "nothing recognisable", "Host headers", "both Content-Length",
		"closed inside", "without a ClientHello", "protocol upgrade", "folded", "larger than", "incomplete"):
		return model.NetCodeProtocol
	}
	return model.NetCodeOther
}
