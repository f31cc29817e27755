package controller

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/workerapi"
)

// Rate limits of network.denied events, per server. A sandbox's guest
// controls how many denials there are, and every event is a row in the
// event log and a wake-up of every waiter, so a sandbox publishes at most
// netEventBurst at once and then one per netEventEvery (10 a minute), and
// a server at most netGlobalBurst at once and then netGlobalRate a second
// across sandboxes. Denials not published are counted on the sandbox's
// next event (model.NetDenial.Suppressed); its network log has them all.
// (The worker has already merged identical denials and limited each
// sandbox to a burst of 20, then one a second: worker/netlog.go.)
const (
	netEventBurst  = 20
	netEventEvery  = 6 * time.Second
	netGlobalBurst = 200
	netGlobalRate  = 20 // per second
	netMaxBuckets  = 8192
)

// netLimiter holds the token buckets of network.denied events.
type netLimiter struct {
	mu     sync.Mutex
	sb     map[string]*netBucket
	global netBucket
}

type netBucket struct {
	tokens     float64
	at         time.Time
	suppressed int64
}

// take refills b to now at one token per every (at most burst) and takes
// one if it can.
func (b *netBucket) take(now time.Time, burst float64, every time.Duration) bool {
	if b.at.IsZero() {
		b.tokens, b.at = burst, now
	} else if el := now.Sub(b.at); el > 0 {
		b.tokens = min(burst, b.tokens+float64(el)/float64(every))
		b.at = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// allow decides whether sandbox id may publish denial d now; if so it
// returns d's Suppressed with the ones the server held back since the
// sandbox's previous event added.
func (l *netLimiter) allow(id string, now time.Time, d model.NetDenial) (suppressed int64, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sb == nil {
		l.sb = map[string]*netBucket{}
	}
	b := l.sb[id]
	if b == nil {
		if len(l.sb) >= netMaxBuckets {
			l.sweep(now)
		}
		b = &netBucket{}
		l.sb[id] = b
	}
	if !b.take(now, netEventBurst, netEventEvery) {
		b.suppressed += int64(max(d.Count, 1)) + d.Suppressed
		return 0, false
	}
	if !l.global.take(now, netGlobalBurst, time.Second/netGlobalRate) {
		b.tokens++ // not the sandbox's fault
		b.suppressed += int64(max(d.Count, 1)) + d.Suppressed
		return 0, false
	}
	suppressed, b.suppressed = b.suppressed+d.Suppressed, 0
	return suppressed, true
}

// sweep forgets buckets that are full again and hold back nothing (they
// are as new), then, if still too many, any; l.mu is held.
func (l *netLimiter) sweep(now time.Time) {
	for id, b := range l.sb {
		if b.suppressed == 0 && b.tokens+float64(now.Sub(b.at))/float64(netEventEvery) >= netEventBurst {
			delete(l.sb, id)
		}
	}
	for id := range l.sb {
		if len(l.sb) < netMaxBuckets {
			break
		}
		delete(l.sb, id)
	}
}

// networkDenied publishes the egress denials worker wid sent in a Sync as
// network.denied events of their sandboxes, under the rate limits above.
// A denial of a sandbox not assigned to wid is dropped: a worker speaks
// only for its own sandboxes.
func (c *Controller) networkDenied(ctx context.Context, wid string, ds []workerapi.NetDenial) {
	if len(ds) > workerapi.MaxNetDenials {
		c.log.Warn("controller: too many network denials in one sync; the rest dropped", "worker", wid, "denials", len(ds), "limit", workerapi.MaxNetDenials)
		ds = ds[:workerapi.MaxNetDenials]
	}
	owned := map[string]*model.Sandbox{} // nil: not wid's
	for _, d := range ds {
		sb, seen := owned[d.SandboxID]
		if !seen {
			got, err := c.st.GetSandbox(ctx, d.SandboxID)
			switch {
			case errors.Is(err, model.ErrNotFound):
			case err != nil:
				c.log.Warn("controller: network denial: get sandbox", "worker", wid, "sandbox", d.SandboxID, "err", err)
				continue
			case got.WorkerID == wid && got.State != model.StateDeleted:
				sb = &got
			}
			owned[d.SandboxID] = sb
			if sb == nil {
				c.log.Debug("controller: network denial of a sandbox not on this worker; dropped", "worker", wid, "sandbox", d.SandboxID)
			}
		}
		if sb == nil {
			continue
		}
		n := boundDenial(d.NetDenial)
		sup, ok := c.net.allow(sb.ID, c.now(), n)
		if !ok {
			continue
		}
		n.Suppressed = sup
		if err := c.ev.NetworkDenied(ctx, sb.OrgID, sb.ID, n); err != nil {
			c.log.Warn("controller: publish network denial", "sandbox", sb.ID, "err", err)
		}
	}
}

// boundDenial bounds what a worker sent (it bounds it itself; one that
// does not must not store megabytes of guest text in the event log).
func boundDenial(d model.NetDenial) model.NetDenial {
	d.Name = workerapi.Truncate(d.Name, model.MaxNetName)
	d.SNI = workerapi.Truncate(d.SNI, model.MaxNetName)
	d.Host = workerapi.Truncate(d.Host, model.MaxNetName)
	d.IP = workerapi.Truncate(d.IP, 64)
	d.Kind = workerapi.Truncate(d.Kind, 64)
	d.Code = workerapi.Truncate(d.Code, 64)
	d.Decision = model.NetDenied
	d.Reason = workerapi.Truncate(d.Reason, model.MaxNetReason)
	d.Count = max(d.Count, 1)
	d.Suppressed = max(d.Suppressed, 0)
	return d
}
