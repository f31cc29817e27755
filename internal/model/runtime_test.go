package model_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/airlock/airlock/internal/model"
)

// TestRuntimeInfoJSON: runtime info round-trips, and a bare name (what
// workers registered, and stores kept, before runtimes declared powers)
// reads as that name with the powers it had then.
func TestRuntimeInfoJSON(t *testing.T) {
	in := []model.RuntimeInfo{{Name: "fake", Caps: model.RuntimeCaps{Pause: true, Snapshot: true}}, {Name: "bare"}}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `[{"name":"fake","caps":{"pause":true,"snapshot":true}},{"name":"bare","caps":{}}]` {
		t.Errorf("JSON = %s", b)
	}
	var out []model.RuntimeInfo
	if err := json.Unmarshal(b, &out); err != nil || !reflect.DeepEqual(out, in) {
		t.Errorf("round trip = %+v, %v", out, err)
	}
	var legacy []model.RuntimeInfo
	if err := json.Unmarshal([]byte(`["gvisor","qemu","auto","firecracker"]`), &legacy); err != nil {
		t.Fatal(err)
	}
	want := []model.RuntimeInfo{
		{Name: "gvisor", Caps: model.RuntimeCaps{Pause: true, Snapshot: true, LeaveRunning: true, Fork: true}},
		{Name: "qemu", Caps: model.RuntimeCaps{Pause: true, Snapshot: true, Fork: true, Network: true}},
		{Name: "auto", Caps: model.RuntimeCaps{Pause: true, Snapshot: true, Fork: true}},
		{Name: "firecracker"},
	}
	if !reflect.DeepEqual(legacy, want) {
		t.Errorf("legacy names =\n%+v\nwant\n%+v", legacy, want)
	}
	if err := json.Unmarshal([]byte(`[{"name":1}]`), &out); err == nil {
		t.Error("a malformed entry decoded")
	}
	w := model.Worker{Runtimes: legacy}
	if r, ok := w.Runtime("qemu"); !ok || !r.Caps.Has(model.RuntimeCaps{Pause: true, Network: true}) || r.Caps.Has(model.RuntimeCaps{LeaveRunning: true}) {
		t.Errorf("Runtime(qemu) = %+v, %v", r, ok)
	}
	if _, ok := w.Runtime("nope"); ok {
		t.Error("Runtime of a name not offered")
	}
	if got := w.RuntimeNames(); !reflect.DeepEqual(got, []string{"gvisor", "qemu", "auto", "firecracker"}) {
		t.Errorf("RuntimeNames = %v", got)
	}
}
