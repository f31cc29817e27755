package model

import "time"

// NetDecision is one allowed or denied decision of a worker's egress
// gateway about a sandbox: an entry of the sandbox's network log (GET
// /v1/sandboxes/{id}/network/log) and, when denied, the data of a
// network.denied event. Every string is bounded (MaxNetName,
// MaxNetReason) before it is stored: names, SNI and Host come from the
// guest.
type NetDecision struct {
	// Seq numbers the entries of one sandbox's log on its worker, from 1,
	// without gaps; readers page and follow with after=Seq.
	Seq  int64     `json:"seq"`
	Time time.Time `json:"time"`
	Kind string    `json:"kind"` // NetKindDNS, NetKindTCP or NetKindHTTP
	// Decision is NetAllowed or NetDenied.
	Decision string `json:"decision"`
	// Name is the DNS name asked (dns) or the name the connection was
	// judged by (tcp: SNI or Host; http: the request's Host).
	Name string `json:"name,omitempty"`
	SNI  string `json:"sni,omitempty"`
	Host string `json:"host,omitempty"`
	IP   string `json:"ip,omitempty"`
	Port uint16 `json:"port,omitempty"`
	// Rule is the index of the policy rule that decided (-1: none did —
	// the default, the guard or the gateway itself).
	Rule int `json:"rule"`
	// Code is Reason in one word of a small fixed set (NetCode*), for
	// programs and metrics.
	Code string `json:"code"`
	// Reason says why in words: "rule 2 denies *.evil.example",
	// "default deny", "169.254.169.254 is link-local (metadata) and never
	// reachable".
	Reason string `json:"reason"`
}

// NetDenial is the data of a network.denied event: a denied decision,
// how many identical ones it stands for, and how many denials of the
// sandbox were not published before it (rate limits; docs/network.md).
type NetDenial struct {
	NetDecision
	// Count is how many identical denials (same kind, name, SNI, Host,
	// address, port, rule and reason) within about a second this event
	// stands for (1 or more); Seq is the first one's.
	Count int `json:"count"`
	// Suppressed is how many other denials of the sandbox were not
	// published since its previous network.denied event (rate limits);
	// the sandbox's network log has them.
	Suppressed int64 `json:"suppressed,omitempty"`
}

// Kinds and decisions of a NetDecision.
const (
	NetKindDNS  = "dns"
	NetKindTCP  = "tcp"
	NetKindHTTP = "http"

	NetAllowed = "allowed"
	NetDenied  = "denied"
)

// Reason codes of a NetDecision: a small fixed set, so that they can
// label metrics (never names or addresses).
const (
	NetCodeRule         = "rule"         // a policy rule decided
	NetCodeDefault      = "default"      // the policy's default decided
	NetCodeGuard        = "guard"        // the address is never reachable (private, link-local, metadata, host, sandbox range, unroutable)
	NetCodeRebinding    = "rebinding"    // a DNS answer's addresses are ones no connection may reach
	NetCodeAttribution  = "attribution"  // the address was not resolved for that name by this sandbox (or Host is not the destination)
	NetCodeNoName       = "no_name"      // the connection named no host, which only an address rule admits
	NetCodeProtocol     = "protocol"     // a query or request the gateway does not serve (query type, malformed TLS or HTTP, …)
	NetCodeInterception = "interception" // the rule asks for TLS interception, which is not available
	NetCodeLimit        = "limit"        // a per-sandbox bound (queries in flight, open connections)
	NetCodeUpstream     = "upstream"     // the upstream resolver failed
	NetCodeUnattached   = "unattached"   // the traffic is no attached sandbox's
	NetCodeOther        = "other"
)

// NetCodes lists every reason code.
var NetCodes = []string{NetCodeRule, NetCodeDefault, NetCodeGuard, NetCodeRebinding, NetCodeAttribution, NetCodeNoName,
	NetCodeProtocol, NetCodeInterception, NetCodeLimit, NetCodeUpstream, NetCodeUnattached, NetCodeOther}

// Bounds of a NetDecision's strings and of a sandbox's network log.
const (
	MaxNetName   = 256  // Name, SNI, Host
	MaxNetReason = 512  // Reason
	NetLogSize   = 1000 // entries a worker keeps per sandbox (the oldest go)
)
