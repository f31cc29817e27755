package events_test

import (
	"encoding/json"
	"testing"

	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
)

// TestNetworkDeniedWakesStreamsOnly: a network.denied event is stored
// and delivered to the streams that follow its sandbox, but does not wake
// Changed's waiters (the controller, long polls, workers' syncs): no
// state changed. A state event still wakes both.
func TestNetworkDeniedWakesStreamsOnly(t *testing.T) {
	l, ctx := newLog(t)
	sub, err := l.Subscribe(ctx, "o1", "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	changed := l.Changed()
	d := model.NetDenial{NetDecision: model.NetDecision{Seq: 3, Kind: model.NetKindDNS, Decision: model.NetDenied, Name: "evil.test", Rule: -1, Code: model.NetCodeDefault, Reason: "default deny"}, Count: 2}
	if err := l.NetworkDenied(ctx, "o1", "sb-1", d); err != nil {
		t.Fatal(err)
	}
	ev := <-sub.C
	var got model.NetDenial
	if err := json.Unmarshal(ev.Data, &got); err != nil || ev.Type != events.TypeNetworkDenied || ev.SandboxID != "sb-1" || ev.OrgID != "o1" || got != d {
		t.Fatalf("delivered %+v (data %+v, %v)", ev, got, err)
	}
	select {
	case <-changed:
		t.Fatal("a network.denied event woke Changed's waiters")
	default:
	}
	if evs, err := l.Store.ListEvents(ctx, "o1", "sb-1", 0, 10); err != nil || len(evs) != 1 {
		t.Fatalf("stored: %v %v", evs, err)
	}
	appendN(t, ctx, l, "o1", "sb-1", 1)
	<-changed // a state event wakes them
	if ev := <-sub.C; ev.Type != events.TypeSandbox {
		t.Errorf("then %s", ev.Type)
	}
}
