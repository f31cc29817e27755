package workerapi_test

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/workerapi"
)

// fullSandbox is a record with every field set, so that a field SpecOf
// forgets, or one that leaks onto the wire, shows.
func fullSandbox(t *testing.T) model.Sandbox {
	t.Helper()
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	exp := now.Add(time.Hour)
	sb := model.Sandbox{
		ID: "sb-1", OrgID: "org-1", Template: "base:latest", TemplateDigest: "sha256:abc", Runtime: "qemu",
		State: model.StateSuspended, DesiredState: model.StateRunning, Reason: "why not", WorkerID: "w-1",
		Env:       map[string]string{"K": "v"},
		Metadata:  map[string]string{"owner": "secret-team"},
		Resources: model.Resources{VCPUs: 2, MemoryMiB: 1024, DiskMiB: 4096},
		TimeoutS:  300, Generation: 7, CreatedAt: now, UpdatedAt: now, LastActivityAt: now,
		ExpiresAt: &exp, OnExpiry: model.ExpirySuspend, IdleSuspendS: 60, NoAutoWake: true, PublicTraffic: true,
		SnapshotID: "snap-1", SnapshotBytes: 1 << 20, SnapshotShared: true, MoveFrom: "w-2", Pool: "sha256:pool",
		Checkpoints: []model.Checkpoint{{Name: "c1", SnapshotID: "snap-c1", Bytes: 10, CreatedAt: now}},
		Task:        &model.Task{OperationID: "op-1", Kind: model.OpRollback, Checkpoint: "c1", SnapshotID: "snap-c1"},
		Source:      &model.Source{WorkerID: "w-0", SandboxID: "sb-0", Checkpoint: "c0", SnapshotID: "snap-c0"},
		StartedFrom: model.StartedSnapshot,
		Network:     &model.SandboxNetwork{Profile: "dev", Policy: []byte(`{"version":1,"default":"deny"}`)},
	}
	v := reflect.ValueOf(sb)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Fatalf("fullSandbox leaves model.Sandbox.%s unset: set it, and decide whether a worker needs it (SandboxSpec)", v.Type().Field(i).Name)
		}
	}
	return sb
}

// jsonName is the name field f has on the wire.
func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	return name
}

// TestSandboxSpec: an assignment carries SpecOf(the record), which (a)
// holds every field SandboxSpec names, with the record's values; (b)
// decodes, as a worker of the previous version reads it, into a
// model.Sandbox with those same values; (c) carries nothing else of the
// record (metadata, reason, desired state, org, ...). And a new worker
// reads an assignment of a server of the previous version (the whole
// record) as SpecOf of it.
func TestSandboxSpec(t *testing.T) {
	full := fullSandbox(t)
	spec := workerapi.SpecOf(full)

	// (a) Every spec field is the record's field of the same name, type
	// and json tag, and SpecOf copied it.
	st, rv, sv := reflect.TypeFor[workerapi.SandboxSpec](), reflect.ValueOf(full), reflect.ValueOf(spec)
	var names []string
	for i := range st.NumField() {
		f := st.Field(i)
		mf, ok := reflect.TypeFor[model.Sandbox]().FieldByName(f.Name)
		if !ok || mf.Type != f.Type || mf.Tag.Get("json") != f.Tag.Get("json") {
			t.Fatalf("SandboxSpec.%s (%s `%s`) is not model.Sandbox's field of that name (%s `%s`): the wire would change", f.Name, f.Type, f.Tag, mf.Type, mf.Tag)
		}
		if got, want := sv.Field(i).Interface(), rv.FieldByName(f.Name).Interface(); !reflect.DeepEqual(got, want) {
			t.Errorf("SpecOf: %s = %#v, want %#v", f.Name, got, want)
		}
		names = append(names, jsonName(f))
	}
	// The fields the worker reads (internal/worker); one missing here is
	// a field an assignment no longer brings it.
	for _, n := range []string{"id", "template", "template_digest", "runtime", "state", "env", "resources", "snapshot_id", "task", "source", "network"} {
		if !slices.Contains(names, n) {
			t.Errorf("SandboxSpec has no %q, which the worker reads", n)
		}
	}

	b, err := json.Marshal(workerapi.SyncResponse{Version: 1, Assignments: []workerapi.Assignment{{Sandbox: spec, Desired: model.StateRunning}}})
	if err != nil {
		t.Fatal(err)
	}

	// (b) A worker of the previous version decodes the assignment into a
	// model.Sandbox.
	var old struct {
		Assignments []struct {
			Sandbox model.Sandbox      `json:"sandbox"`
			Desired model.SandboxState `json:"desired"`
		} `json:"assignments"`
	}
	if err := json.Unmarshal(b, &old); err != nil || len(old.Assignments) != 1 {
		t.Fatalf("decode as the previous version: %v, %s", err, b)
	}
	ov := reflect.ValueOf(old.Assignments[0].Sandbox)
	for i := range st.NumField() {
		n := st.Field(i).Name
		if got, want := ov.FieldByName(n).Interface(), rv.FieldByName(n).Interface(); !reflect.DeepEqual(got, want) {
			t.Errorf("previous version reads %s = %#v, want %#v", n, got, want)
		}
	}
	if old.Assignments[0].Desired != model.StateRunning {
		t.Errorf("previous version reads desired %q", old.Assignments[0].Desired)
	}

	// (c) Nothing else of the record is on the wire.
	var wire struct {
		Assignments []struct {
			Sandbox map[string]json.RawMessage `json:"sandbox"`
		} `json:"assignments"`
	}
	if err := json.Unmarshal(b, &wire); err != nil || len(wire.Assignments) != 1 {
		t.Fatalf("decode the wire: %v, %s", err, b)
	}
	var keys []string
	for k := range wire.Assignments[0].Sandbox {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	slices.Sort(names)
	if !slices.Equal(keys, names) {
		t.Errorf("the assignment's sandbox has fields %v, want exactly %v", keys, names)
	}
	for _, n := range []string{"metadata", "reason", "desired_state", "org_id", "worker_id", "pool", "checkpoints", "expires_at", "created_at"} {
		if _, ok := wire.Assignments[0].Sandbox[n]; ok {
			t.Errorf("the assignment carries the record's %q", n)
		}
	}
	if strings.Contains(string(b), "secret-team") {
		t.Errorf("the record's metadata reached the wire: %s", b)
	}

	// A server of the previous version sends the whole record; a new
	// worker reads SpecOf of it.
	b, err = json.Marshal(map[string]any{"sandbox": full, "desired": model.StateRunning})
	if err != nil {
		t.Fatal(err)
	}
	var a workerapi.Assignment
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.Sandbox, spec) || a.Desired != model.StateRunning {
		t.Errorf("from the whole record: %+v, want %+v", a, spec)
	}
}
