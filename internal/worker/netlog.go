package worker

// The network log: every egress decision of the worker's gateway about a
// sandbox, in memory, the last model.NetLogSize per sandbox (the oldest
// dropped), numbered from 1 so that readers page and follow with after=.
// It lives as long as the worker holds the sandbox (paused and suspended
// included) and goes with it: a deleted sandbox, one that moved to another
// worker, or a worker restart starts a log anew (readers see Reset).
//
// Denials are also queued for the server, which publishes them as
// network.denied events on the sandbox's stream. The queue is bounded and
// rate-limited per sandbox, so that a guest hammering denied names costs
// the Sync (and the server's event log) little: identical denials waiting
// to be sent are merged (Count), a sandbox queues at most netBurst at once
// and then one a second, and holds at most netPendingMax; whatever is not
// queued is counted (Suppressed) on the next one that is. A queued denial
// wakes the sync loop after netCoalesce, so that denials in a burst travel
// together and arrive within about a second, and at most every netSyncGap,
// so that guests cannot make the worker sync (and the server read every
// sandbox's state) more often than that.

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

// Bounds of the denials queued for the server.
const (
	netBurst      = 20                     // denials a sandbox may queue at once
	netRefill     = time.Second            // then one per netRefill
	netPendingMax = 32                     // denials of one sandbox waiting for a Sync
	netCoalesce   = 50 * time.Millisecond  // a queued denial syncs after this
	netSyncGap    = 500 * time.Millisecond // and no sooner after the last Sync that carried denials
)

// NetLog holds the network logs of a worker's sandboxes. Record is called
// inline by the egress gateway on the goroutine that decided, so it only
// takes short locks and never blocks. Use NewNetLog; a nil *NetLog keeps
// nothing.
type NetLog struct {
	now func() time.Time

	mu   sync.RWMutex
	logs map[string]*netRing

	pmu    sync.Mutex
	pend   map[string]*netPending
	notify chan struct{} // a denial was queued
	sent   time.Time     // when Take last returned denials (guarded by pmu)
}

// NewNetLog returns an empty network log.
func NewNetLog() *NetLog {
	return &NetLog{now: time.Now, logs: map[string]*netRing{}, pend: map[string]*netPending{}, notify: make(chan struct{}, 1)}
}

// netRing is one sandbox's log: entry Seq s is buf[(s-1) % NetLogSize].
type netRing struct {
	mu   sync.Mutex
	buf  []model.NetDecision
	last int64 // Seq of the newest entry (0: none yet)
}

// netPending is one sandbox's denials waiting for a Sync, and its rate
// limit (a token bucket).
type netPending struct {
	ds         []model.NetDenial
	suppressed int64 // denials not queued since the last queued one
	tokens     float64
	at         time.Time // of the last refill
}

// Record appends decision d of sandbox id's gateway to its log (Seq is
// assigned here) and, when denied, queues it for the server. Strings are
// bounded first: names, SNI and Host come from the guest.
func (n *NetLog) Record(id string, d model.NetDecision) {
	if n == nil || id == "" {
		return
	}
	d.Name = workerapi.Truncate(d.Name, model.MaxNetName)
	d.SNI = workerapi.Truncate(d.SNI, model.MaxNetName)
	d.Host = workerapi.Truncate(d.Host, model.MaxNetName)
	d.IP = workerapi.Truncate(d.IP, 64)
	d.Reason = workerapi.Truncate(d.Reason, model.MaxNetReason)
	if d.Time.IsZero() {
		d.Time = n.now()
	}
	n.mu.RLock()
	r := n.logs[id]
	n.mu.RUnlock()
	if r == nil {
		n.mu.Lock()
		if r = n.logs[id]; r == nil {
			r = &netRing{}
			n.logs[id] = r
		}
		n.mu.Unlock()
	}
	r.mu.Lock()
	r.last++
	d.Seq = r.last
	if len(r.buf) < model.NetLogSize {
		r.buf = append(r.buf, d)
	} else {
		r.buf[(d.Seq-1)%model.NetLogSize] = d
	}
	r.mu.Unlock()
	if d.Decision == model.NetDenied {
		n.queue(id, d)
	}
}

// sameDenial reports whether a and b differ in nothing but Seq and Time.
func sameDenial(a, b model.NetDecision) bool {
	return a.Kind == b.Kind && a.Name == b.Name && a.SNI == b.SNI && a.Host == b.Host && a.IP == b.IP &&
		a.Port == b.Port && a.Rule == b.Rule && a.Code == b.Code && a.Reason == b.Reason
}

func (n *NetLog) queue(id string, d model.NetDecision) {
	now := n.now()
	n.pmu.Lock()
	defer n.pmu.Unlock()
	p := n.pend[id]
	if p == nil {
		p = &netPending{tokens: netBurst, at: now}
		n.pend[id] = p
	}
	for i := range p.ds {
		if sameDenial(p.ds[i].NetDecision, d) {
			p.ds[i].Count++
			return
		}
	}
	if el := now.Sub(p.at); el > 0 {
		p.tokens = min(netBurst, p.tokens+float64(el)/float64(netRefill))
		p.at = now
	}
	if p.tokens < 1 || len(p.ds) >= netPendingMax {
		p.suppressed++
		return
	}
	p.tokens--
	p.ds = append(p.ds, model.NetDenial{NetDecision: d, Count: 1, Suppressed: p.suppressed})
	p.suppressed = 0
	select {
	case n.notify <- struct{}{}:
	default:
	}
}

// Notify returns a channel that receives when a denial was queued.
func (n *NetLog) Notify() <-chan struct{} {
	if n == nil {
		return nil
	}
	return n.notify
}

// Take removes and returns at most max queued denials, for a Sync; when
// more remain, Notify fires again.
func (n *NetLog) Take(max int) []workerapi.NetDenial {
	if n == nil {
		return nil
	}
	n.pmu.Lock()
	defer n.pmu.Unlock()
	var out []workerapi.NetDenial
	more := false
	for id, p := range n.pend {
		for len(p.ds) > 0 && len(out) < max {
			out = append(out, workerapi.NetDenial{SandboxID: id, NetDenial: p.ds[0]})
			p.ds = p.ds[1:]
		}
		if len(p.ds) > 0 {
			more = true
		}
	}
	if more {
		select {
		case n.notify <- struct{}{}:
		default:
		}
	}
	if len(out) > 0 {
		n.sent = n.now()
	}
	return out
}

// syncDelay is how long after a denial was queued the sync loop should
// cut its long poll short: netCoalesce, or longer to keep netSyncGap
// after the last Sync that carried denials.
func (n *NetLog) syncDelay() time.Duration {
	n.pmu.Lock()
	defer n.pmu.Unlock()
	return max(netCoalesce, netSyncGap-n.now().Sub(n.sent))
}

// Requeue puts back denials taken for a Sync that failed, ahead of the
// ones queued since; what no longer fits is counted as suppressed.
func (n *NetLog) Requeue(ds []workerapi.NetDenial) {
	if n == nil || len(ds) == 0 {
		return
	}
	n.pmu.Lock()
	defer n.pmu.Unlock()
	by := map[string][]model.NetDenial{}
	var ids []string
	for _, d := range ds {
		if _, ok := by[d.SandboxID]; !ok {
			ids = append(ids, d.SandboxID)
		}
		by[d.SandboxID] = append(by[d.SandboxID], d.NetDenial)
	}
	for _, id := range ids {
		p := n.pend[id]
		if p == nil {
			continue // dropped meanwhile: the sandbox left the worker
		}
		all := append(by[id], p.ds...)
		if extra := len(all) - netPendingMax; extra > 0 {
			for _, d := range all[netPendingMax:] {
				p.suppressed += int64(d.Count) + d.Suppressed
			}
			all = all[:netPendingMax]
		}
		p.ds = all
	}
	select {
	case n.notify <- struct{}{}:
	default:
	}
}

// Drop forgets sandbox id's log and queued denials.
func (n *NetLog) Drop(id string) {
	if n == nil {
		return
	}
	n.mu.Lock()
	delete(n.logs, id)
	n.mu.Unlock()
	n.pmu.Lock()
	delete(n.pend, id)
	n.pmu.Unlock()
}

// Retain forgets the logs of sandboxes keep does not name (a decision
// recorded after its sandbox left the worker).
func (n *NetLog) Retain(keep func(id string) bool) {
	if n == nil {
		return
	}
	n.mu.Lock()
	for id := range n.logs {
		if !keep(id) {
			delete(n.logs, id)
		}
	}
	n.mu.Unlock()
	n.pmu.Lock()
	for id := range n.pend {
		if !keep(id) {
			delete(n.pend, id)
		}
	}
	n.pmu.Unlock()
}

// Page returns at most limit entries of sandbox id's log with Seq after
// after (limit ≤ 0: workerapi.MaxNetLogPage); ok is false when the
// sandbox has no log.
func (n *NetLog) Page(id string, after int64, limit int) (page workerapi.NetLogPage, ok bool) {
	if limit <= 0 || limit > workerapi.MaxNetLogPage {
		limit = workerapi.MaxNetLogPage
	}
	page = workerapi.NetLogPage{Entries: []model.NetDecision{}, Next: after}
	if n == nil {
		return page, false
	}
	n.mu.RLock()
	r := n.logs[id]
	n.mu.RUnlock()
	if r == nil {
		return page, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if after > r.last {
		page.Reset, after, page.Next = true, 0, 0
	}
	oldest := r.last - int64(len(r.buf)) + 1
	start := after + 1
	if start < oldest {
		page.Missed = oldest - start
		start = oldest
	}
	for s := start; s <= r.last && len(page.Entries) < limit; s++ {
		page.Entries = append(page.Entries, r.buf[(s-1)%model.NetLogSize])
		page.Next = s
	}
	return page, true
}

// handleNetworkLog serves GET /v1/sandboxes/{sid}/network/log?after=&limit=
// (scope files). It neither wakes the sandbox nor counts as activity: the
// log is the worker's, not the guest's.
func (w *Worker) handleNetworkLog(rw http.ResponseWriter, r *http.Request) {
	if _, err := w.authorize(r, token.ScopeFiles); err != nil {
		writeError(rw, err)
		return
	}
	q := r.URL.Query()
	var after int64
	if s := q.Get("after"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < 0 {
			writeError(rw, model.Errorf(model.ErrInvalid, "after %q is not a sequence number (0 or more)", s))
			return
		}
		after = v
	}
	limit := 0
	if s := q.Get("limit"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v <= 0 || v > workerapi.MaxNetLogPage {
			writeError(rw, model.Errorf(model.ErrInvalid, "limit %q: ask for 1 to %d entries", s, workerapi.MaxNetLogPage))
			return
		}
		limit = v
	}
	sid := r.PathValue("sid")
	page, ok := w.net.Page(sid, after, limit)
	if !ok {
		w.mu.Lock()
		_, known := w.sandboxes[sid]
		w.mu.Unlock()
		switch {
		case !known:
			writeError(rw, model.Errorf(model.ErrNotFound, "worker %s holds no network log for sandbox %s: it does not hold the sandbox (the log is kept in memory by the worker that runs it)", w.cfg.ID, sid))
			return
		case !w.cfg.Network.Egress:
			page.Note = "egress is off on this worker (airlock worker --egress): the sandbox has loopback only, so nothing is decided or logged"
		case after > 0:
			page.Reset, page.Next = true, 0 // the log began again (a restarted worker)
		}
	}
	writeJSON(rw, http.StatusOK, page)
}

// cutShort cancels the Sync in flight when the worker's state changes
// (kick) or, syncDelay after, when a denial is queued; it returns when
// stop is closed. A Sync carrying denials is left alone for a second
// first: the server answers it at once (an older server long-polls).
func (w *Worker) cutShort(carriesDenials bool, cancel func(), stop <-chan struct{}) {
	if carriesDenials {
		t := time.NewTimer(time.Second)
		defer t.Stop()
		select {
		case <-t.C:
		case <-stop:
			return
		}
	}
	select {
	case <-w.kick:
		cancel()
	case <-w.net.Notify():
		t := time.NewTimer(w.net.syncDelay())
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-stop:
		}
	case <-stop:
	}
}
