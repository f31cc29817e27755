package worker

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

// testNetLog is a NetLog on a clock the test moves.
func testNetLog() (*NetLog, *time.Time) {
	n := NewNetLog()
	now := time.Unix(1_800_000_000, 0)
	n.now = func() time.Time { return now }
	return n, &now
}

func denial(name string) model.NetDecision {
	return model.NetDecision{Kind: model.NetKindDNS, Decision: model.NetDenied, Name: name, Rule: -1, Code: model.NetCodeDefault, Reason: "default deny"}
}

func seqs(es []model.NetDecision) []int64 {
	var out []int64
	for _, e := range es {
		out = append(out, e.Seq)
	}
	return out
}

// TestNetLogRing: entries are numbered from 1 per sandbox, a page starts
// after after and holds at most limit, the ring keeps the last
// NetLogSize (Missed counts the others), and an after past the end (a
// log that began again) answers from the start with Reset.
func TestNetLogRing(t *testing.T) {
	n, _ := testNetLog()
	if _, ok := n.Page("sb-1", 0, 0); ok {
		t.Fatal("a sandbox without decisions has a log")
	}
	for i := range 5 {
		n.Record("sb-1", denial(fmt.Sprintf("n%d.test", i)))
	}
	n.Record("sb-2", model.NetDecision{Kind: model.NetKindTCP, Decision: model.NetAllowed, Rule: 0, Code: model.NetCodeRule, Reason: "rule 0 allows x.test"})

	p, ok := n.Page("sb-1", 0, 0)
	if !ok || fmt.Sprint(seqs(p.Entries)) != "[1 2 3 4 5]" || p.Next != 5 || p.Missed != 0 || p.Reset {
		t.Fatalf("page: ok=%v %+v", ok, p)
	}
	if p.Entries[2].Name != "n2.test" || p.Entries[0].Time.IsZero() {
		t.Errorf("entry 3: %+v", p.Entries[2])
	}
	if p, _ = n.Page("sb-1", 2, 2); fmt.Sprint(seqs(p.Entries)) != "[3 4]" || p.Next != 4 {
		t.Errorf("after 2 limit 2: %+v", p)
	}
	if p, _ = n.Page("sb-1", 5, 0); len(p.Entries) != 0 || p.Next != 5 || p.Reset {
		t.Errorf("after the end: %+v", p)
	}
	if p, _ = n.Page("sb-1", 9, 0); !p.Reset || len(p.Entries) != 5 || p.Next != 5 {
		t.Errorf("after past the end (a log begun again): %+v", p)
	}
	if p, _ = n.Page("sb-2", 0, 0); fmt.Sprint(seqs(p.Entries)) != "[1]" || p.Entries[0].Decision != model.NetAllowed {
		t.Errorf("sb-2 has its own numbering: %+v", p)
	}

	// Wrap: the oldest go.
	total := model.NetLogSize + 250
	for i := 5; i < total; i++ {
		n.Record("sb-1", denial(fmt.Sprintf("n%d.test", i)))
	}
	p, _ = n.Page("sb-1", 0, 0)
	if len(p.Entries) != model.NetLogSize || p.Entries[0].Seq != 251 || p.Missed != 250 || p.Next != int64(total) {
		t.Fatalf("wrapped: %d entries from %d, missed %d, next %d", len(p.Entries), p.Entries[0].Seq, p.Missed, p.Next)
	}
	for i, e := range p.Entries {
		if want := fmt.Sprintf("n%d.test", e.Seq-1); e.Seq != int64(251+i) || e.Name != want {
			t.Fatalf("entry %d: seq %d name %s, want %d %s", i, e.Seq, e.Name, 251+i, want)
		}
	}
	if p, _ = n.Page("sb-1", 100, 10); p.Missed != 150 || p.Entries[0].Seq != 251 || len(p.Entries) != 10 {
		t.Errorf("after 100 of a wrapped log: missed %d, first %d, %d entries", p.Missed, p.Entries[0].Seq, len(p.Entries))
	}
	if p, _ = n.Page("sb-1", int64(total-1), 10); fmt.Sprint(seqs(p.Entries)) != fmt.Sprint([]int64{int64(total)}) {
		t.Errorf("the newest: %+v", seqs(p.Entries))
	}

	n.Drop("sb-1")
	if _, ok := n.Page("sb-1", 0, 0); ok {
		t.Error("a dropped log is still there")
	}
	n.Retain(func(id string) bool { return id != "sb-2" })
	if _, ok := n.Page("sb-2", 0, 0); ok {
		t.Error("Retain kept a log it was told to forget")
	}
}

// TestNetLogBoundsGuestStrings: names, SNI, Host and reasons are cut
// before they are stored.
func TestNetLogBoundsGuestStrings(t *testing.T) {
	n, _ := testNetLog()
	long := strings.Repeat("a", 20<<10)
	n.Record("sb", model.NetDecision{Kind: model.NetKindHTTP, Decision: model.NetDenied, Name: long, SNI: long, Host: long, Reason: "Host " + long, Rule: -1})
	p, _ := n.Page("sb", 0, 0)
	e := p.Entries[0]
	for what, s := range map[string]string{"name": e.Name, "sni": e.SNI, "host": e.Host} {
		if len(s) > model.MaxNetName || !strings.Contains(s, "bytes cut") {
			t.Errorf("%s is %d bytes (at most %d, marked)", what, len(s), model.MaxNetName)
		}
	}
	if len(e.Reason) > model.MaxNetReason {
		t.Errorf("reason is %d bytes (at most %d)", len(e.Reason), model.MaxNetReason)
	}
	ds := n.Take(workerapi.MaxNetDenials)
	if len(ds) != 1 || len(ds[0].Host) > model.MaxNetName {
		t.Errorf("queued denial: %+v", ds)
	}
}

// TestNetLogQueue: denials are queued for the server, identical ones
// merged, a sandbox limited to netBurst and then one per netRefill, what
// is held back counted on the next one queued; allowed decisions are not
// queued; Take bounds a Sync and Requeue puts a failed one back.
func TestNetLogQueue(t *testing.T) {
	n, now := testNetLog()
	n.Record("sb", model.NetDecision{Kind: model.NetKindTCP, Decision: model.NetAllowed, Rule: 0, Code: model.NetCodeRule, Reason: "rule 0 allows x.test"})
	select {
	case <-n.Notify():
		t.Fatal("an allowed decision woke the sync")
	default:
	}
	for range 3 {
		n.Record("sb", denial("same.test"))
	}
	select {
	case <-n.Notify():
	default:
		t.Fatal("a denial did not wake the sync")
	}
	ds := n.Take(workerapi.MaxNetDenials)
	if len(ds) != 1 || ds[0].Count != 3 || ds[0].Seq != 2 || ds[0].SandboxID != "sb" || ds[0].Suppressed != 0 {
		t.Fatalf("three identical denials: %+v", ds)
	}
	if ds := n.Take(workerapi.MaxNetDenials); len(ds) != 0 {
		t.Fatalf("taken twice: %+v", ds)
	}

	// A hostile guest: distinct names as fast as it can. One token was
	// spent above, so netBurst-1 more are queued; the rest are counted.
	for i := range 500 {
		n.Record("sb", denial(fmt.Sprintf("flood%d.test", i)))
	}
	ds = n.Take(1000)
	if len(ds) != netBurst-1 {
		t.Fatalf("a flood queued %d denials, want the burst's %d", len(ds), netBurst-1)
	}
	if p, _ := n.Page("sb", 0, 0); p.Next != 504 {
		t.Errorf("the log has every decision: next %d, want 504", p.Next)
	}
	*now = now.Add(netRefill)
	n.Record("sb", denial("later.test"))
	ds = n.Take(1000)
	if len(ds) != 1 || ds[0].Name != "later.test" || ds[0].Suppressed != 500-(netBurst-1) {
		t.Fatalf("after a second: %+v", ds)
	}

	// Take bounds a Sync; what remains wakes the next one.
	*now = now.Add(time.Hour)
	for i := range 10 {
		n.Record("sb", denial(fmt.Sprintf("b%d.test", i)))
	}
	<-n.Notify()
	first := n.Take(4)
	if len(first) != 4 || first[0].Name != "b0.test" {
		t.Fatalf("take 4: %+v", first)
	}
	select {
	case <-n.Notify():
	default:
		t.Fatal("denials left behind did not wake the next sync")
	}
	// The Sync failed: put back, ahead of the rest.
	n.Requeue(first)
	rest := n.Take(100)
	if len(rest) != 10 || rest[0].Name != "b0.test" || rest[9].Name != "b9.test" {
		t.Fatalf("after requeue: %d, first %s", len(rest), rest[0].Name)
	}
	// A sandbox that left meanwhile is not brought back.
	n.Drop("sb")
	n.Requeue(rest)
	if ds := n.Take(100); len(ds) != 0 {
		t.Fatalf("requeued denials of a dropped sandbox: %+v", ds)
	}
}

// TestNetworkLogDataPlane: the data plane serves a sandbox's network log
// to a files token of that sandbox (through workerapi.DataPlane, the
// server's client), without waking a paused sandbox; other scopes and
// sandboxes are refused, a sandbox the worker does not hold is not found,
// and the log goes with its sandbox.
func TestNetworkLogDataPlane(t *testing.T) {
	e := newFakeEnv(t)
	ctx := testContext(t)
	const id = "sb-netlog"
	e.srv.assign(id, fakeDigest, model.StateRunning)
	e.srv.waitObserved(ctx, id, model.StateRunning)
	w := e.tw.w
	dp := &workerapi.DataPlane{}
	target := func(sid, scope string) workerapi.Target {
		return workerapi.Target{Worker: "w-test", URL: w.DataPlaneURL(), Token: e.srv.sign(t, token.Claims{SandboxID: sid, Scope: scope})}
	}
	files := target(id, token.ScopeFiles)

	p, err := dp.NetworkLog(ctx, files, id, 0, 0)
	if err != nil || len(p.Entries) != 0 || !strings.Contains(p.Note, "egress is off") {
		t.Fatalf("before any decision (no egress on this worker): %+v %v", p, err)
	}

	w.net.Record(id, denial("denied.test"))
	w.net.Record(id, model.NetDecision{Kind: model.NetKindTCP, Decision: model.NetAllowed, Name: "ok.test", IP: "192.0.2.1", Port: 443, Rule: 0, Code: model.NetCodeRule, Reason: "rule 0 allows ok.test"})
	p, err = dp.NetworkLog(ctx, files, id, 0, 0)
	if err != nil || len(p.Entries) != 2 || p.Next != 2 || p.Note != "" {
		t.Fatalf("two decisions: %+v %v", p, err)
	}
	if e0, e1 := p.Entries[0], p.Entries[1]; e0.Decision != model.NetDenied || e0.Name != "denied.test" || e0.Code != model.NetCodeDefault ||
		e1.Decision != model.NetAllowed || e1.IP != "192.0.2.1" || e1.Port != 443 || e1.Rule != 0 {
		t.Errorf("entries: %+v", p.Entries)
	}
	if p, err = dp.NetworkLog(ctx, files, id, 1, 1); err != nil || len(p.Entries) != 1 || p.Entries[0].Seq != 2 {
		t.Errorf("after 1 limit 1: %+v %v", p, err)
	}

	for _, c := range []struct {
		what  string
		t     workerapi.Target
		after int64
		limit int
		want  error
	}{
		{"command scope", target(id, token.ScopeCommand), 0, 0, model.ErrForbidden},
		{"another sandbox's token", target("sb-other", token.ScopeFiles), 0, 0, model.ErrForbidden},
		{"no token", workerapi.Target{Worker: "w-test", URL: w.DataPlaneURL()}, 0, 0, model.ErrUnauthorized},
		{"limit too large", files, 0, workerapi.MaxNetLogPage + 1, model.ErrInvalid},
	} {
		if _, err := dp.NetworkLog(ctx, c.t, id, c.after, c.limit); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.what, err, c.want)
		}
	}
	if _, err := dp.NetworkLog(ctx, target("sb-nowhere", token.ScopeFiles), "sb-nowhere", 0, 0); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("a sandbox the worker does not hold: %v, want not found", err)
	}

	// Paused: the log answers, and the sandbox stays paused.
	e.srv.assign(id, fakeDigest, model.StatePaused)
	e.srv.waitObserved(ctx, id, model.StatePaused)
	if p, err = dp.NetworkLog(ctx, files, id, 0, 0); err != nil || len(p.Entries) != 2 {
		t.Errorf("paused: %+v %v", p, err)
	}
	if o, _ := e.srv.Observed(id); o.State != model.StatePaused || e.srv.wakeCount() != 0 {
		t.Errorf("reading the log of a paused sandbox: state %s, %d wakes", o.State, e.srv.wakeCount())
	}

	// Deleted: the log goes with it.
	e.srv.assign(id, fakeDigest, model.StateDeleted)
	e.waitFor(id, "gone from the worker", func(workerapi.Observed) bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.sandboxes[id] == nil
	})
	if _, ok := w.net.Page(id, 0, 0); ok {
		t.Error("the log of a deleted sandbox is still held")
	}
	if _, err := dp.NetworkLog(ctx, files, id, 0, 0); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("after delete: %v, want not found", err)
	}
}

// TestNetLogSyncDelay: a denial after a quiet spell syncs after
// netCoalesce; one right after a Sync that carried denials waits until
// netSyncGap has passed since it.
func TestNetLogSyncDelay(t *testing.T) {
	n, now := testNetLog()
	if d := n.syncDelay(); d != netCoalesce {
		t.Errorf("first denial: %v, want %v", d, netCoalesce)
	}
	n.Record("sb", denial("a.test"))
	n.Take(10)
	if d := n.syncDelay(); d != netSyncGap {
		t.Errorf("right after a Sync with denials: %v, want %v", d, netSyncGap)
	}
	*now = now.Add(netSyncGap - 100*time.Millisecond)
	if d := n.syncDelay(); d != 100*time.Millisecond {
		t.Errorf("later: %v, want 100ms", d)
	}
	*now = now.Add(time.Hour)
	if d := n.syncDelay(); d != netCoalesce {
		t.Errorf("after a quiet spell: %v, want %v", d, netCoalesce)
	}
}
