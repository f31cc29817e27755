// Package egress is the core of a worker's egress gateway, in user
// space: the only DNS resolver a sandbox can reach, and the transparent
// proxy every TCP connection of a sandbox is redirected to. One Gateway
// serves every sandbox of its worker. The kernel data path (veth,
// anti-spoofing, the nftables redirect of the sandbox's TCP to
// ServeProxy's port and of its DNS to ServeDNS's) and the policy
// language (a Policy implementation, netpolicy's) live elsewhere.
//
// # Identification by source address
//
// A sandbox is known by the source address of its packets on this
// worker (Attach). Nothing the sandbox sends names it otherwise; the
// data path's anti-spoofing rules (in the sandbox's namespace: drop what
// does not come from the sandbox's own address) are what make the source
// address trustworthy. A query or connection from an address no sandbox
// holds is refused.
//
// # DNS attribution
//
// ServeDNS forwards to Config.Upstreams only A, AAAA and CNAME queries
// for names the sandbox's Policy.Name allows, in a fresh query (new id,
// EDNS0 with our buffer size and none of the sandbox's options: no
// client subnet, cookie or DO bit). Everything else is answered by the
// gateway: a denied name, another query type (TXT, MX, ANY, HTTPS/SVCB,
// which would carry ECH keys and address hints around attribution, PTR
// …), an invalid name, an unknown source → REFUSED; more than one
// question → FORMERR; another opcode → NOTIMP. The answer handed back is
// rebuilt from the upstream's: the CNAME chain from the asked name and
// the addresses at its end (at most 32; an upstream answer of more than
// 256 records is SERVFAIL; answers cannot exceed 64 KiB: UDP reads a
// 1232-byte buffer, TCP has a 16-bit length), no authority or additional
// section. Each address is recorded for the sandbox as handed out for
// the name it asked, until now + TTL, the TTL clamped to [MinTTL,
// MaxTTL] (5 s, 1 h) both in the record and in the answer so the
// sandbox's cache never outlives the record. A CNAME chain is
// attributed to the asked name, and only the asked name is judged by the
// policy: the sandbox will connect with that name as SNI or Host, and
// CDN-hosted names are CNAMEs to names no policy would list. The
// upstream resolvers are the operator's and trusted; the sandbox's own
// DNS traffic never reaches anyone else.
//
// DNS uses github.com/miekg/dns, the Go DNS library of the field
// (CoreDNS, Consul, Kubernetes' DNS are built on it): message parsing,
// truncation and both transports are its well-trodden code, not ours.
//
// # Admission
//
// ServeProxy takes the connection's original destination (Config.
// OriginalDst, by default SO_ORIGINAL_DST) and reads, without consuming
// them, the first bytes the client sends, bounded (16 KiB, 10 s): a TLS
// ClientHello gives the SNI (parsed by crypto/tls itself), an HTTP/1.x
// request the Host (origin-form only: CONNECT, absolute-URI (proxy
// form), a missing or repeated Host, Upgrade, ambiguous body framing,
// bare CR/LF are refused). The connection is admitted only when
// Policy.Conn(name, ip, port, "tcp") allows it AND, when that allow came
// from a domain rule (Decision.ByName), the destination ip is one the
// gateway's DNS handed to this sandbox for that name and the record is
// unexpired: this is the defence against forged DNS answers (a sandbox
// that invents an address for an allowed name has no record) and against
// shared-IP fronting (an allowed SNI sent to an address handed out for
// another name). A connection that names nothing (no SNI, not HTTP) is
// judged by Conn("", ip, port, …): only an address rule or a default
// allow admits it; when one would, a client that sends nothing within
// 300 ms is admitted without a name, so server-speaks-first protocols
// (SSH, SMTP) work. Admitted connections are dialled to the original
// ip:port (the name is never resolved again), the peeked bytes replayed
// and both directions spliced (*net.TCPConn.ReadFrom uses splice(2)),
// with half-closes passed on. On plain HTTP every request is parsed as
// it passes and one whose Host differs from the connection's is judged
// again; a denied one cuts the connection. TLS is passed through; a rule
// that asks for interception is denied for now ("interception not
// available yet").
//
// A denied connection is reset at once (SO_LINGER 0, so an RST) and a
// denied name answers REFUSED: a silent drop would leave the sandbox's
// tools hanging until their own timeouts, where a reset or REFUSED makes
// them fail at once with an error an agent can act on; the event
// (Config.OnEvent) says which name or address was refused and why.
//
// Update swaps a sandbox's policy: new queries and connections follow
// it at once, and open connections it denies (judged by their admitted
// name and address) are reset before Update returns. Detach resets every
// connection of the sandbox and forgets its records.
//
// # Concurrency
//
// One goroutine pair per connection, one per query (at most 128 in
// flight per sandbox); the only shared state on the data path is a
// read-locked map from address to sandbox and per-sandbox mutexes held
// for map operations, never across I/O.
package egress
