package controller

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/workerapi"
)

// TestNetLimiter: a sandbox publishes netEventBurst denials at once and
// then one per netEventEvery; what it holds back (with what the worker
// already held back) rides on its next event; sandboxes do not share a
// bucket, but all of them share the server's; the buckets are bounded.
func TestNetLimiter(t *testing.T) {
	var l netLimiter
	now := time.Unix(1_800_000_000, 0)
	d := model.NetDenial{Count: 1}
	for i := range netEventBurst {
		if _, ok := l.allow("sb-1", now, d); !ok {
			t.Fatalf("denial %d of the burst held back", i)
		}
	}
	if _, ok := l.allow("sb-1", now, model.NetDenial{Count: 3, Suppressed: 4}); ok {
		t.Fatal("a denial past the burst published")
	}
	if _, ok := l.allow("sb-2", now, d); !ok {
		t.Fatal("another sandbox shares the first one's bucket")
	}
	now = now.Add(netEventEvery / 2)
	if _, ok := l.allow("sb-1", now, d); ok {
		t.Fatal("published before the bucket refilled")
	}
	now = now.Add(netEventEvery / 2)
	sup, ok := l.allow("sb-1", now, model.NetDenial{Count: 1, Suppressed: 10})
	if !ok || sup != 3+4+1+10 {
		t.Fatalf("after the refill: ok=%v suppressed %d, want 18", ok, sup)
	}
	if sup, ok := l.allow("sb-2", now, d); !ok || sup != 0 {
		t.Fatalf("sb-2: ok=%v suppressed %d", ok, sup)
	}

	// The server's bucket: many sandboxes at once.
	var g netLimiter
	n := 0
	for i := range 2 * netGlobalBurst {
		if _, ok := g.allow(fmt.Sprintf("sb-%d", i), now, d); ok {
			n++
		}
	}
	if n != netGlobalBurst {
		t.Errorf("%d sandboxes at once published %d, want the server's burst %d", 2*netGlobalBurst, n, netGlobalBurst)
	}

	// Bounded: old full buckets go first.
	var b netLimiter
	for i := range netMaxBuckets + 100 {
		now = now.Add(time.Second / netGlobalRate)
		b.allow(fmt.Sprintf("sb-%d", i), now, d)
	}
	if len(b.sb) > netMaxBuckets {
		t.Errorf("%d buckets kept, at most %d", len(b.sb), netMaxBuckets)
	}
}

// TestSyncPublishesNetworkDenials: denials a worker sends in its Sync
// (through the worker API's HTTP handler) become network.denied events of
// its own sandboxes, bounded; a denial naming another worker's sandbox, or
// no sandbox, is dropped.
func TestSyncPublishesNetworkDenials(t *testing.T) {
	e := newEnv(t)
	w1, w2 := e.worker("w1"), e.worker("w2")
	w1.register(baseTemplate)
	e.runningSandbox(w1, "sb1")
	w2.register(baseTemplate)
	e.runningSandbox(w2, "sb2")
	if got := e.sandbox("sb2"); got.WorkerID != "w2" {
		t.Fatalf("sb2 is on %q, want w2", got.WorkerID)
	}

	huge := strings.Repeat("x", 64<<10)
	d := func(sid, name string) workerapi.NetDenial {
		return workerapi.NetDenial{SandboxID: sid, NetDenial: model.NetDenial{NetDecision: model.NetDecision{
			Seq: 7, Kind: model.NetKindDNS, Decision: model.NetDenied, Name: name, Rule: -1, Code: model.NetCodeDefault, Reason: "default deny"}, Count: 2}}
	}
	resp, _ := w1.post("/internal/v1/workers/w1/sync?wait=0s", workerapi.SyncRequest{Observed: []workerapi.Observed{{SandboxID: "sb1", State: model.StateRunning}},
		NetDenied: []workerapi.NetDenial{d("sb1", "evil.test"), d("sb2", "not-w1s.test"), d("sb-none", "nobody.test"), d("sb1", huge)}})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("sync: %s", resp.Status)
	}
	evs, err := e.st.ListEvents(e.ctx, "", "", 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var got []model.NetDenial
	for _, ev := range evs {
		if ev.Type != events.TypeNetworkDenied {
			continue
		}
		var nd model.NetDenial
		if err := json.Unmarshal(ev.Data, &nd); err != nil {
			t.Fatal(err)
		}
		if ev.SandboxID != "sb1" || ev.OrgID == "" {
			t.Errorf("network.denied of %q (org %q): only sb1 is w1's", ev.SandboxID, ev.OrgID)
		}
		got = append(got, nd)
	}
	if len(got) != 2 || got[0].Name != "evil.test" || got[0].Count != 2 || got[0].Seq != 7 || got[0].Reason != "default deny" {
		t.Fatalf("published: %+v", got)
	}
	if len(got[1].Name) > model.MaxNetName {
		t.Errorf("a %d-byte name was published as %d bytes (at most %d)", len(huge), len(got[1].Name), model.MaxNetName)
	}
}
