package storetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
)

// testBuildFiles: files are per org, chunked, content-addressed by key
// (a second put of a key reads nothing), and read back exactly.
func testBuildFiles(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkOrg(t, s, "org-bf-a")
	mkOrg(t, s, "org-bf-b")
	// Two full chunks and a short one, with bytes that differ by position.
	data := make([]byte, 2*store.BuildFileChunk+1234)
	for i := range data {
		data[i] = byte(i*7 + i>>11)
	}
	sum := sha256.Sum256(data)
	f := store.BuildFile{OrgID: "org-bf-a", Key: hex.EncodeToString(sum[:]), Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:]), CreatedAt: at(0)}
	created, err := s.PutBuildFile(ctx, f, bytes.NewReader(data))
	must(t, "put", err)
	if !created {
		t.Fatal("first put: created = false")
	}
	again, err := s.PutBuildFile(ctx, f, errReader{})
	must(t, "put again", err)
	if again {
		t.Fatal("second put of the same key: created = true")
	}
	got, err := s.GetBuildFile(ctx, f.OrgID, f.Key)
	must(t, "get", err)
	if got.Size != f.Size || got.SHA256 != f.SHA256 || got.Key != f.Key || got.OrgID != f.OrgID {
		t.Fatalf("get = %+v, want %+v", got, f)
	}
	sameTime(t, "created_at", got.CreatedAt, at(0))
	var back []byte
	for n := 0; ; n++ {
		b, err := s.ReadBuildFileChunk(ctx, f.OrgID, f.Key, n)
		if errors.Is(err, model.ErrNotFound) {
			break
		}
		must(t, "read chunk", err)
		back = append(back, b...)
	}
	if !bytes.Equal(back, data) {
		t.Fatalf("read back %d bytes, they differ from the %d put", len(back), len(data))
	}
	_, err = s.GetBuildFile(ctx, "org-bf-b", f.Key)
	wantErr(t, "another org's file", err, model.ErrNotFound)
	_, err = s.ReadBuildFileChunk(ctx, "org-bf-b", f.Key, 0)
	wantErr(t, "another org's chunk", err, model.ErrNotFound)
	// A short reader fails the put and leaves nothing.
	short := store.BuildFile{OrgID: "org-bf-b", Key: "short", Size: 10, SHA256: "x", CreatedAt: at(0)}
	if _, err := s.PutBuildFile(ctx, short, bytes.NewReader([]byte("abc"))); err == nil {
		t.Fatal("put of a reader shorter than Size: no error")
	}
	_, err = s.GetBuildFile(ctx, "org-bf-b", "short")
	wantErr(t, "file of a failed put", err, model.ErrNotFound)
	// An empty file has no chunks.
	empty := store.BuildFile{OrgID: "org-bf-b", Key: "empty", Size: 0, SHA256: "e3b0", CreatedAt: at(0)}
	_, err = s.PutBuildFile(ctx, empty, bytes.NewReader(nil))
	must(t, "put empty", err)
	_, err = s.ReadBuildFileChunk(ctx, "org-bf-b", "empty", 0)
	wantErr(t, "chunk of an empty file", err, model.ErrNotFound)
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("read when nothing should be") }

// testBuilds: builds round-trip, list newest first per org, finished
// builds do not change, events keep their Seq.
func testBuilds(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkOrg(t, s, "org-b-a")
	mkOrg(t, s, "org-b-b")
	spec := model.BuildSpec{Name: "app", Tag: "1", From: "base", Steps: []model.BuildStep{
		{Kind: model.StepRun, Args: []string{"echo hi"}, Text: "RUN echo hi"},
		{Kind: model.StepCopy, Args: []string{"/app/"}, FilesHash: "abc", Chown: "user", Chmod: "0644"},
	}, StartCmd: "srv", ReadyCmd: "true", Force: true}
	b1 := model.Build{ID: "bld-1", OrgID: "org-b-a", State: model.BuildBuilding, Spec: spec, Worker: "wkr-1", CreatedAt: at(time.Second)}
	b2 := model.Build{ID: "bld-2", OrgID: "org-b-a", State: model.BuildWaiting, Spec: model.BuildSpec{Name: "x"}, CreatedAt: at(2 * time.Second)}
	b3 := model.Build{ID: "bld-3", OrgID: "org-b-b", State: model.BuildBuilding, Spec: spec, CreatedAt: at(3 * time.Second)}
	for _, b := range []model.Build{b1, b2, b3} {
		must(t, "create "+b.ID, s.CreateBuild(ctx, b))
	}
	wantErr(t, "create a taken id", s.CreateBuild(ctx, b1), model.ErrConflict)
	got, err := s.GetBuild(ctx, "bld-1")
	must(t, "get", err)
	sameTime(t, "created_at", got.CreatedAt, b1.CreatedAt)
	got.CreatedAt = b1.CreatedAt
	if !reflect.DeepEqual(got, b1) {
		t.Fatalf("get = %+v\nwant %+v", got, b1)
	}
	_, err = s.GetBuild(ctx, "bld-none")
	wantErr(t, "get missing", err, model.ErrNotFound)

	list, err := s.ListBuilds(ctx, "org-b-a", 0)
	must(t, "list", err)
	if len(list) != 2 || list[0].ID != "bld-2" || list[1].ID != "bld-1" {
		t.Fatalf("list = %v, want bld-2, bld-1", buildIDs(list))
	}
	if list, _ := s.ListBuilds(ctx, "org-b-a", 1); len(list) != 1 || list[0].ID != "bld-2" {
		t.Fatalf("list limit 1 = %v", buildIDs(list))
	}

	// The waiting build gets its spec and starts, then finishes.
	b2.Spec, b2.State, b2.Worker = spec, model.BuildBuilding, "wkr-2"
	must(t, "start", s.UpdateBuild(ctx, b2))
	fin := at(time.Minute)
	b2.State, b2.Digest, b2.FinishedAt = model.BuildReady, "sha256:"+hex.EncodeToString(make([]byte, 32)), &fin
	b2.Steps = []model.BuildStepReport{{Index: -1, Text: "FROM base"}, {Index: 0, Text: "RUN echo hi", Cached: true, Key: "k", DurationMS: 1.5}}
	must(t, "finish", s.UpdateBuild(ctx, b2))
	got, err = s.GetBuild(ctx, "bld-2")
	must(t, "get finished", err)
	if got.State != model.BuildReady || got.Digest != b2.Digest || got.FinishedAt == nil || !reflect.DeepEqual(got.Steps, b2.Steps) ||
		!reflect.DeepEqual(got.Spec, spec) || got.Worker != "wkr-2" {
		t.Fatalf("finished build = %+v", got)
	}
	sameTime(t, "finished_at", *got.FinishedAt, fin)
	failed := b2
	failed.State, failed.Error = model.BuildFailed, "late"
	wantErr(t, "update a finished build", s.UpdateBuild(ctx, failed), model.ErrConflict)
	wantErr(t, "update a missing build", s.UpdateBuild(ctx, model.Build{ID: "bld-none", State: model.BuildFailed}), model.ErrNotFound)

	// Events.
	evs := []model.BuildEvent{
		{Seq: 1, Time: at(0).UTC().Truncate(time.Microsecond), Type: "step", Step: &model.BuildStepReport{Index: 0, Text: "RUN echo hi"}},
		{Seq: 2, Time: at(1).UTC().Truncate(time.Microsecond), Type: "output", Stream: "stdout", Text: "hi"},
	}
	must(t, "append", s.AppendBuildEvents(ctx, "bld-1", evs))
	must(t, "append more", s.AppendBuildEvents(ctx, "bld-1", []model.BuildEvent{{Seq: 3, Time: at(2).UTC().Truncate(time.Microsecond), Type: "done", Digest: "sha256:x"}}))
	wantErr(t, "append a taken seq", s.AppendBuildEvents(ctx, "bld-1", []model.BuildEvent{{Seq: 2, Type: "info"}}), model.ErrConflict)
	all, err := s.ListBuildEvents(ctx, "bld-1", 0, 0)
	must(t, "list events", err)
	if len(all) != 3 || !reflect.DeepEqual(all[:2], evs) || all[2].Digest != "sha256:x" {
		t.Fatalf("events = %+v", all)
	}
	page, err := s.ListBuildEvents(ctx, "bld-1", 1, 1)
	must(t, "list events after 1", err)
	if len(page) != 1 || page[0].Seq != 2 {
		t.Fatalf("events after 1, limit 1 = %+v", page)
	}
	if other, _ := s.ListBuildEvents(ctx, "bld-3", 0, 0); len(other) != 0 {
		t.Fatalf("events of another build = %+v", other)
	}
}

func buildIDs(bs []model.Build) []string {
	out := []string{}
	for _, b := range bs {
		out = append(out, b.ID)
	}
	return out
}
