package envd_test

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/airlock/airlock/internal/envdpb/filesystem"
)

func TestFilesystem(t *testing.T) {
	forEachTransport(t, func(t *testing.T, sb *sandbox, c codec) {
		ctx := testCtx(t)
		fc := sb.files(c)
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "f.txt"), []byte("hello"), 0o640); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("f.txt", filepath.Join(dir, "link")); err != nil {
			t.Fatal(err)
		}

		st, err := fc.Stat(ctx, asRoot(&pb.StatRequest{Path: filepath.Join(dir, "f.txt")}))
		if err != nil {
			t.Fatal(err)
		}
		e := st.Msg.GetEntry()
		if e.GetName() != "f.txt" || e.GetType() != pb.FileType_FILE_TYPE_FILE || e.GetSize() != 5 || e.GetMode() != 0o640 ||
			e.GetPermissions() != "-rw-r-----" || e.GetOwner() != "root" || e.GetGroup() != "root" || e.GetModifiedTime().AsTime().IsZero() {
			t.Errorf("Stat = %v", e)
		}
		st, err = fc.Stat(ctx, asRoot(&pb.StatRequest{Path: filepath.Join(dir, "link")}))
		if err != nil || st.Msg.GetEntry().GetType() != pb.FileType_FILE_TYPE_SYMLINK || st.Msg.GetEntry().GetSymlinkTarget() != "f.txt" {
			t.Errorf("Stat symlink = %v, %v", st, err)
		}
		if _, err := fc.Stat(ctx, asRoot(&pb.StatRequest{Path: filepath.Join(dir, "missing")})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("Stat missing: %v, want not_found", err)
		}

		sub := filepath.Join(dir, "a", "b")
		mk, err := fc.MakeDir(ctx, asRoot(&pb.MakeDirRequest{Path: sub}))
		if err != nil || mk.Msg.GetEntry().GetType() != pb.FileType_FILE_TYPE_DIRECTORY || mk.Msg.GetEntry().GetPath() != sub {
			t.Fatalf("MakeDir = %v, %v", mk, err)
		}
		if _, err := fc.MakeDir(ctx, asRoot(&pb.MakeDirRequest{Path: sub})); connect.CodeOf(err) != connect.CodeAlreadyExists {
			t.Errorf("MakeDir existing: %v, want already_exists", err)
		}
		if _, err := fc.MakeDir(ctx, asRoot(&pb.MakeDirRequest{Path: filepath.Join(dir, "f.txt")})); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("MakeDir over a file: %v, want invalid_argument", err)
		}
		if err := os.WriteFile(filepath.Join(sub, "deep.txt"), nil, 0o644); err != nil {
			t.Fatal(err)
		}

		for _, tt := range []struct {
			depth uint32
			want  []string
		}{
			{0, []string{"a", "f.txt", "link"}},
			{1, []string{"a", "f.txt", "link"}},
			{2, []string{"a", "a/b", "f.txt", "link"}},
			{5, []string{"a", "a/b", "a/b/deep.txt", "f.txt", "link"}},
		} {
			ls, err := fc.ListDir(ctx, asRoot(&pb.ListDirRequest{Path: dir, Depth: tt.depth}))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range ls.Msg.GetEntries() {
				rel, _ := filepath.Rel(dir, e.GetPath())
				got = append(got, rel)
				if e.GetName() != filepath.Base(e.GetPath()) {
					t.Errorf("entry %v: name is not the base of path", e)
				}
			}
			sort.Strings(got)
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("ListDir depth %d = %v, want %v", tt.depth, got, tt.want)
			}
		}
		if _, err := fc.ListDir(ctx, asRoot(&pb.ListDirRequest{Path: filepath.Join(dir, "f.txt")})); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("ListDir on a file: %v, want invalid_argument", err)
		}
		if _, err := fc.ListDir(ctx, asRoot(&pb.ListDirRequest{Path: filepath.Join(dir, "nope")})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("ListDir missing: %v, want not_found", err)
		}

		to := filepath.Join(dir, "new", "g.txt")
		mv, err := fc.Move(ctx, asRoot(&pb.MoveRequest{Source: filepath.Join(dir, "f.txt"), Destination: to}))
		if err != nil || mv.Msg.GetEntry().GetPath() != to || mv.Msg.GetEntry().GetSize() != 5 {
			t.Fatalf("Move = %v, %v", mv, err)
		}
		if _, err := fc.Move(ctx, asRoot(&pb.MoveRequest{Source: filepath.Join(dir, "f.txt"), Destination: to})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("Move missing: %v, want not_found", err)
		}
		if _, err := fc.Remove(ctx, asRoot(&pb.RemoveRequest{Path: filepath.Join(dir, "a")})); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(dir, "a")); !os.IsNotExist(err) {
			t.Errorf("after Remove: %v", err)
		}
		if _, err := fc.Remove(ctx, asRoot(&pb.RemoveRequest{Path: filepath.Join(dir, "a")})); err != nil {
			t.Errorf("Remove missing: %v, want success (as envd)", err)
		}
	})
}

// TestRelativePaths: relative paths and ~ resolve against the user's home.
func TestRelativePaths(t *testing.T) {
	sb := startAgent(t)
	ctx := testCtx(t)
	fc := sb.files(codecs[0])
	home, err := os.UserHomeDir()
	if err != nil || home != "/root" {
		t.Skipf("needs root's home /root (have %q, %v)", home, err)
	}
	name := "airlock-envd-test-" + strings.ReplaceAll(t.Name(), "/", "-")
	t.Cleanup(func() { os.RemoveAll(filepath.Join(home, name)) })
	mk, err := fc.MakeDir(ctx, asRoot(&pb.MakeDirRequest{Path: name}))
	if err != nil || mk.Msg.GetEntry().GetPath() != filepath.Join(home, name) {
		t.Fatalf("MakeDir relative = %v, %v", mk, err)
	}
	st, err := fc.Stat(ctx, asRoot(&pb.StatRequest{Path: "~/" + name}))
	if err != nil || st.Msg.GetEntry().GetPath() != filepath.Join(home, name) {
		t.Fatalf("Stat ~/ = %v, %v", st, err)
	}
}

func TestWatchDir(t *testing.T) {
	forEachTransport(t, func(t *testing.T, sb *sandbox, c codec) {
		ctx, cancel := context.WithCancel(testCtx(t))
		defer cancel()
		fc := sb.files(c)
		dir := t.TempDir()
		if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		req := asRoot(&pb.WatchDirRequest{Path: dir, Recursive: true, IncludeEntry: true})
		req.Header().Set("Keepalive-Ping-Interval", "1")
		s, err := fc.WatchDir(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if !s.Receive() || s.Msg().GetStart() == nil {
			t.Fatalf("first message %v (%v), want start", s.Msg(), s.Err())
		}
		steps := []struct {
			do   func() error
			name string
			typ  pb.EventType
		}{
			{func() error { return os.WriteFile(filepath.Join(dir, "x"), nil, 0o644) }, "x", pb.EventType_EVENT_TYPE_CREATE},
			{func() error { return os.WriteFile(filepath.Join(dir, "x"), []byte("data"), 0o644) }, "x", pb.EventType_EVENT_TYPE_WRITE},
			{func() error { return os.Chmod(filepath.Join(dir, "x"), 0o600) }, "x", pb.EventType_EVENT_TYPE_CHMOD},
			{func() error { return os.Rename(filepath.Join(dir, "x"), filepath.Join(dir, "y")) }, "x", pb.EventType_EVENT_TYPE_RENAME},
			{func() error { return os.WriteFile(filepath.Join(dir, "sub", "deep"), nil, 0o644) }, "sub/deep", pb.EventType_EVENT_TYPE_CREATE},
			{func() error { return os.Mkdir(filepath.Join(dir, "new"), 0o755) }, "new", pb.EventType_EVENT_TYPE_CREATE},
			{func() error { return os.WriteFile(filepath.Join(dir, "new", "n"), nil, 0o644) }, "new/n", pb.EventType_EVENT_TYPE_CREATE},
			// A tree created at once: entries made before the new directory's
			// watch exists are reported too.
			{func() error { return os.MkdirAll(filepath.Join(dir, "t1", "t2", "t3"), 0o755) }, "t1/t2/t3", pb.EventType_EVENT_TYPE_CREATE},
			{func() error { return os.Remove(filepath.Join(dir, "y")) }, "y", pb.EventType_EVENT_TYPE_REMOVE},
		}
		keepalives := 0
		for _, st := range steps {
			if err := st.do(); err != nil {
				t.Fatal(err)
			}
			for {
				if !s.Receive() {
					t.Fatalf("stream ended (%v) waiting for %v %s", s.Err(), st.typ, st.name)
				}
				if s.Msg().GetKeepalive() != nil {
					keepalives++
					continue
				}
				ev := s.Msg().GetFilesystem()
				if ev.GetName() == st.name && ev.GetType() == st.typ {
					if st.typ == pb.EventType_EVENT_TYPE_CREATE && ev.GetEntry().GetPath() != filepath.Join(dir, st.name) {
						t.Errorf("event %v: entry missing or wrong", ev)
					}
					break
				}
			}
		}
		if _, err := fc.WatchDir(ctx, asRoot(&pb.WatchDirRequest{Path: filepath.Join(dir, "missing")})); err == nil {
			s2, _ := fc.WatchDir(ctx, asRoot(&pb.WatchDirRequest{Path: filepath.Join(dir, "missing")}))
			s2.Receive()
			err = s2.Err()
			if connect.CodeOf(err) != connect.CodeNotFound {
				t.Errorf("WatchDir missing: %v, want not_found", err)
			}
		} else if connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("WatchDir missing: %v, want not_found", err)
		}
	})
}

func TestPollingWatcher(t *testing.T) {
	sb := startAgent(t)
	ctx := testCtx(t)
	fc := sb.files(codecs[0])
	dir := t.TempDir()
	cw, err := fc.CreateWatcher(ctx, asRoot(&pb.CreateWatcherRequest{Path: dir}))
	if err != nil {
		t.Fatal(err)
	}
	id := cw.Msg.GetWatcherId()
	if err := os.WriteFile(filepath.Join(dir, "p"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var got []*pb.FilesystemEvent
	for !hasEvent(got, "p", pb.EventType_EVENT_TYPE_CREATE) {
		ev, err := fc.GetWatcherEvents(ctx, asRoot(&pb.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err) // the test's context bounds the loop
		}
		got = append(got, ev.Msg.GetEvents()...)
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := fc.RemoveWatcher(ctx, asRoot(&pb.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := fc.GetWatcherEvents(ctx, asRoot(&pb.GetWatcherEventsRequest{WatcherId: id})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("GetWatcherEvents after RemoveWatcher: %v, want not_found", err)
	}
}

func hasEvent(evs []*pb.FilesystemEvent, name string, typ pb.EventType) bool {
	for _, e := range evs {
		if e.GetName() == name && e.GetType() == typ {
			return true
		}
	}
	return false
}
