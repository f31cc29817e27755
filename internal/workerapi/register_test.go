package workerapi_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/workerapi"
)

// TestRegisterOffered: a worker's declared runtime info is what it offers;
// an older worker, which sends names only, offers those names with the
// powers they had (model.LegacyRuntimeInfo).
func TestRegisterOffered(t *testing.T) {
	var old workerapi.RegisterRequest
	if err := json.Unmarshal([]byte(`{"id":"w1","runtimes":["gvisor","qemu","auto"]}`), &old); err != nil {
		t.Fatal(err)
	}
	if got, want := old.Offered(), model.NamedRuntimes("gvisor", "qemu", "auto"); !reflect.DeepEqual(got, want) {
		t.Errorf("older worker offers %+v, want %+v", got, want)
	}
	declared := []model.RuntimeInfo{{Name: "fake", Caps: model.RuntimeCaps{Pause: true}}}
	req := workerapi.RegisterRequest{ID: "w2", Runtimes: []string{"fake"}, RuntimeInfo: declared}
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var back workerapi.RegisterRequest
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if got := back.Offered(); !reflect.DeepEqual(got, declared) {
		t.Errorf("declaring worker offers %+v, want %+v", got, declared)
	}
	if b, _ := json.Marshal(workerapi.RegisterRequest{ID: "w3"}); strings.Contains(string(b), "runtime_info") {
		t.Errorf("a request without runtime info sends the field: %s", b)
	}
}
