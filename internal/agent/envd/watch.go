package envd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
	"unsafe"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	pb "github.com/airlock/airlock/internal/envdpb/filesystem"
)

// maxPolledEvents bounds the events a polling watcher keeps between polls.
const maxPolledEvents = 10000

// pollIdle is how long a polling watcher lives without GetWatcherEvents
// before the next CreateWatcher removes it (clients that never call
// RemoveWatcher must not leak inotify descriptors).
const pollIdle = 10 * time.Minute

const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_ONLYDIR

// watcher reports changes below one directory with inotify.
type watcher struct {
	s         *Server
	root      string
	recursive bool
	entries   bool
	f         *os.File // the inotify descriptor (pollable)
	events    chan *pb.FilesystemEvent
	done      chan struct{}
	closeOnce sync.Once

	mu       sync.Mutex
	lastPoll time.Time
	dirs     map[int32]string // watch descriptor → directory
	err      error            // why the read loop ended
	polled   []*pb.FilesystemEvent
}

// newWatcher starts watching root (a directory), recursively if asked.
func (s *Server) newWatcher(root string, recursive, entries bool) (*watcher, error) {
	fi, err := os.Stat(root)
	if err != nil {
		return nil, rpcError("watch "+root, err)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s is not a directory", root))
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, rpcError("inotify", err)
	}
	w := &watcher{s: s, root: root, recursive: recursive, entries: entries,
		f: os.NewFile(uintptr(fd), "inotify"), events: make(chan *pb.FilesystemEvent, 256),
		done: make(chan struct{}), dirs: map[int32]string{}}
	if err := w.add(root, nil); err != nil {
		w.f.Close()
		return nil, rpcError("watch "+root, err)
	}
	go w.read()
	return w, nil
}

// add watches dir and, when recursive, every directory below it. found
// (when set) receives every path below dir: entries created in a new
// directory before its watch was added.
func (w *watcher) add(dir string, found func(string)) error {
	return filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil
		}
		if p != dir && found != nil {
			found(p)
		}
		if !d.IsDir() {
			return nil
		}
		wd, err := unix.InotifyAddWatch(int(w.fdNum()), p, watchMask)
		if err != nil {
			if p == dir {
				return err
			}
			return nil
		}
		w.mu.Lock()
		w.dirs[int32(wd)] = p
		w.mu.Unlock()
		if !w.recursive {
			return filepath.SkipDir
		}
		return nil
	})
}

// fdNum returns the descriptor without switching it to blocking mode.
func (w *watcher) fdNum() uintptr {
	var n uintptr
	if rc, err := w.f.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { n = fd })
	}
	return n
}

// read turns inotify records into events until the watcher is closed.
func (w *watcher) read() {
	defer close(w.events)
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			w.mu.Lock()
			if !errors.Is(err, os.ErrClosed) {
				w.err = err
			}
			w.mu.Unlock()
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			name := string(nameBytes)
			for len(name) > 0 && name[len(name)-1] == 0 {
				name = name[:len(name)-1]
			}
			w.mu.Lock()
			dir, ok := w.dirs[ev.Wd]
			if ev.Mask&unix.IN_IGNORED != 0 {
				delete(w.dirs, ev.Wd)
			}
			w.mu.Unlock()
			if !ok {
				continue
			}
			full := dir
			if name != "" {
				full = filepath.Join(dir, name)
			}
			if ev.Mask&unix.IN_DELETE_SELF != 0 && name == "" && dir != w.root {
				continue // reported as a removal by its parent
			}
			var typ pb.EventType
			switch {
			case ev.Mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
				typ = pb.EventType_EVENT_TYPE_CREATE
			case ev.Mask&unix.IN_MODIFY != 0:
				typ = pb.EventType_EVENT_TYPE_WRITE
			case ev.Mask&(unix.IN_DELETE|unix.IN_DELETE_SELF) != 0:
				typ = pb.EventType_EVENT_TYPE_REMOVE
			case ev.Mask&unix.IN_MOVED_FROM != 0:
				typ = pb.EventType_EVENT_TYPE_RENAME
			case ev.Mask&unix.IN_ATTRIB != 0:
				typ = pb.EventType_EVENT_TYPE_CHMOD
			default:
				continue
			}
			if !w.emit(full, typ) {
				return
			}
			if w.recursive && ev.Mask&unix.IN_ISDIR != 0 && ev.Mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
				var inside []string
				_ = w.add(full, func(p string) { inside = append(inside, p) })
				for _, p := range inside {
					if !w.emit(p, pb.EventType_EVENT_TYPE_CREATE) {
						return
					}
				}
			}
		}
	}
}

// emit queues one event; false means the watcher was closed.
func (w *watcher) emit(full string, typ pb.EventType) bool {
	rel, err := filepath.Rel(w.root, full)
	if err != nil {
		rel = full
	}
	out := &pb.FilesystemEvent{Name: rel, Type: typ}
	if w.entries && (typ == pb.EventType_EVENT_TYPE_CREATE || typ == pb.EventType_EVENT_TYPE_WRITE || typ == pb.EventType_EVENT_TYPE_CHMOD) {
		if e, err := w.s.entryInfo(full); err == nil {
			out.Entry = e
		}
	}
	select {
	case w.events <- out:
		return true
	case <-w.done:
		return false
	}
}

// stream sends events (nil: keepalive) until ctx ends or the watch fails.
func (w *watcher) stream(ctx context.Context, every time.Duration, send func(*pb.FilesystemEvent) error) error {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case ev, ok := <-w.events:
			if !ok {
				w.mu.Lock()
				err := w.err
				w.mu.Unlock()
				if err == nil {
					return nil
				}
				return rpcError("watch "+w.root, err)
			}
			if err := send(ev); err != nil {
				return err
			}
		case <-tick.C:
			if err := send(nil); err != nil {
				return err
			}
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return rpcError("watch "+w.root, ctx.Err())
			}
			return nil
		}
	}
}

// collect keeps events for GetWatcherEvents until the watcher is closed.
func (w *watcher) collect() {
	for ev := range w.events {
		w.mu.Lock()
		if len(w.polled) < maxPolledEvents {
			w.polled = append(w.polled, ev)
		}
		w.mu.Unlock()
	}
}

// drain returns and forgets the collected events.
func (w *watcher) drain() ([]*pb.FilesystemEvent, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	evs := w.polled
	w.polled = nil
	w.lastPoll = time.Now()
	return evs, w.err
}

func (w *watcher) close() {
	w.closeOnce.Do(func() {
		close(w.done)
		w.f.Close()
	})
}

func (s *Server) addWatcher(w *watcher) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	w.mu.Lock()
	w.lastPoll = time.Now()
	w.mu.Unlock()
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	for old, ow := range s.watchers {
		ow.mu.Lock()
		idle := time.Since(ow.lastPoll) > pollIdle
		ow.mu.Unlock()
		if idle {
			delete(s.watchers, old)
			ow.close()
		}
	}
	s.watchers[id] = w
	return id
}

func (s *Server) getWatcher(id string) (*watcher, bool) {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	w, ok := s.watchers[id]
	return w, ok
}

func (s *Server) removeWatcher(id string) (*watcher, bool) {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	w, ok := s.watchers[id]
	delete(s.watchers, id)
	return w, ok
}
