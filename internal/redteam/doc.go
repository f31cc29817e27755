// Package redteam is the egress red-team suite (its tests; this file only
// documents it). Every case is an attempt, made as root from inside a real
// sandbox, to get past the egress gateway (internal/egress) and its data
// path (internal/network's egress networks); each must fail, and where
// the gateway is involved it must have logged the attempt as denied.
//
// Two tiers:
//
//   - TestRedTeamGVisor: a real `airlock up --egress --egress-profile
//     public` whose gateway resolves through a test internet
//     (internal/egress/egresstest), two gVisor sandboxes, the attempts run
//     in them by probe.py (python3 of the base template) through the API;
//     denials are read from the daemon's "egress denied" log lines.
//   - TestRedTeamDomainPolicy: the cases that only mean something under a
//     domain policy (forged DNS answers, shared-IP fronting, disallowed
//     SNI, Host changed mid-connection), which `airlock up` cannot apply
//     yet (one profile for all sandboxes, public or none): a real egress
//     network (network.Setup, Config.Egress) and a real gateway with a
//     NetworkPolicyV1 allowing a few test names, the attempts run by the
//     same probe.py as root in the guest namespace on the host kernel —
//     where, unlike in gVisor, raw sockets exist, so spoofed packets are
//     really sent.
//
// Nothing leaves the machine: public destinations are only the test
// internet's (198.18.0.0/15), other addresses are denied by the gateway
// before it dials, and UDP, ICMP and DNS to foreign resolvers are dropped
// or redirected in the gateway namespace.
//
// Set AIRLOCK_REDTEAM_REPORT=<file> to get the result table in Markdown.
package redteam
