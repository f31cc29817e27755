package envd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlock/airlock/internal/agent"
	pb "github.com/airlock/airlock/internal/envdpb/filesystem"
	"github.com/airlock/airlock/internal/envdpb/filesystem/filesystemconnect"
)

// filesystemService implements filesystem.Filesystem over the agent's file
// code. Paths are resolved against the calling user's home.
type filesystemService struct{ s *Server }

var _ filesystemconnect.FilesystemHandler = (*filesystemService)(nil)

func (fsv *filesystemService) path(h http.Header, p string) (string, agent.User, error) {
	u, err := fsv.s.user(h, "")
	if err != nil {
		return "", u, err
	}
	abs, err := fsv.s.resolve(p, u)
	return abs, u, err
}

// entryInfo describes path without following a final symlink.
func (s *Server) entryInfo(path string) (*pb.EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	return s.entryFromInfo(path, fi), nil
}

func (s *Server) entryFromInfo(path string, fi fs.FileInfo) *pb.EntryInfo {
	e := &pb.EntryInfo{
		Name:         fi.Name(),
		Path:         path,
		Size:         fi.Size(),
		Mode:         uint32(fi.Mode().Perm()),
		Permissions:  fi.Mode().String(),
		ModifiedTime: timestamppb.New(fi.ModTime()),
	}
	if path == "/" {
		e.Name = "/"
	}
	switch m := fi.Mode(); {
	case m.IsRegular():
		e.Type = pb.FileType_FILE_TYPE_FILE
	case m.IsDir():
		e.Type = pb.FileType_FILE_TYPE_DIRECTORY
	case m&fs.ModeSymlink != 0:
		e.Type = pb.FileType_FILE_TYPE_SYMLINK
		if target, err := os.Readlink(path); err == nil {
			e.SymlinkTarget = &target
		}
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner, e.Group = s.agent.OwnerNames(int(st.Uid), int(st.Gid))
	}
	if e.Type == pb.FileType_FILE_TYPE_FILE || e.Type == pb.FileType_FILE_TYPE_DIRECTORY {
		e.Metadata = getMetadata(path)
	}
	return e
}

// xattrPrefix namespaces file metadata in extended attributes, as envd does.
const xattrPrefix = "user.e2b."

// setMetadata stores md as extended attributes of path.
func setMetadata(path string, md map[string]string) error {
	for k, v := range md {
		if err := unix.Setxattr(path, xattrPrefix+k, []byte(v), 0); err != nil {
			if errors.Is(err, unix.ENOTSUP) {
				return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("file metadata on %s: the file system does not support extended attributes", path))
			}
			return fmt.Errorf("set metadata %s on %s: %w", k, path, err)
		}
	}
	return nil
}

// getMetadata reads the metadata of path (nil when there is none).
func getMetadata(path string) map[string]string {
	size, err := unix.Listxattr(path, nil)
	if err != nil || size <= 0 {
		return nil
	}
	buf := make([]byte, size)
	if size, err = unix.Listxattr(path, buf); err != nil {
		return nil
	}
	var md map[string]string
	for _, name := range strings.Split(string(buf[:size]), "\x00") {
		if !strings.HasPrefix(name, xattrPrefix) {
			continue
		}
		val := make([]byte, 64<<10)
		n, err := unix.Getxattr(path, name, val)
		if err != nil {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[strings.TrimPrefix(name, xattrPrefix)] = string(val[:n])
	}
	return md
}

func (fsv *filesystemService) Stat(ctx context.Context, req *connect.Request[pb.StatRequest]) (*connect.Response[pb.StatResponse], error) {
	path, _, err := fsv.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	e, err := fsv.s.entryInfo(path)
	if err != nil {
		return nil, rpcError("stat "+path, err)
	}
	return connect.NewResponse(&pb.StatResponse{Entry: e}), nil
}

func (fsv *filesystemService) MakeDir(ctx context.Context, req *connect.Request[pb.MakeDirRequest]) (*connect.Response[pb.MakeDirResponse], error) {
	path, u, err := fsv.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(path); err == nil {
		if fi.IsDir() {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %s already exists", path))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s exists and is not a directory", path))
	}
	if err := fsv.s.agent.MkdirAll(path, u.Name); err != nil {
		return nil, rpcError("make directory "+path, err)
	}
	e, err := fsv.s.entryInfo(path)
	if err != nil {
		return nil, rpcError("stat "+path, err)
	}
	return connect.NewResponse(&pb.MakeDirResponse{Entry: e}), nil
}

func (fsv *filesystemService) Move(ctx context.Context, req *connect.Request[pb.MoveRequest]) (*connect.Response[pb.MoveResponse], error) {
	from, _, err := fsv.path(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	to, _, err := fsv.path(req.Header(), req.Msg.GetDestination())
	if err != nil {
		return nil, err
	}
	if err := fsv.s.agent.Move(from, to); err != nil {
		return nil, rpcError("move "+from, err)
	}
	e, err := fsv.s.entryInfo(to)
	if err != nil {
		return nil, rpcError("stat "+to, err)
	}
	return connect.NewResponse(&pb.MoveResponse{Entry: e}), nil
}

func (fsv *filesystemService) ListDir(ctx context.Context, req *connect.Request[pb.ListDirRequest]) (*connect.Response[pb.ListDirResponse], error) {
	path, _, err := fsv.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, rpcError("resolve "+path, err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return nil, rpcError("stat "+path, err)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s is not a directory", path))
	}
	var entries []*pb.EntryInfo
	err = filepath.WalkDir(real, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == real {
				return err
			}
			return nil // vanished or unreadable below the root: skip
		}
		if p == real {
			return nil
		}
		rel, _ := filepath.Rel(real, p)
		level := strings.Count(rel, string(filepath.Separator)) + 1
		if level > depth {
			return fs.SkipDir
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		entries = append(entries, fsv.s.entryFromInfo(filepath.Join(path, rel), info))
		if d.IsDir() && level == depth {
			return fs.SkipDir
		}
		return nil
	})
	if err != nil {
		return nil, rpcError("list "+path, err)
	}
	return connect.NewResponse(&pb.ListDirResponse{Entries: entries}), nil
}

func (fsv *filesystemService) Remove(ctx context.Context, req *connect.Request[pb.RemoveRequest]) (*connect.Response[pb.RemoveResponse], error) {
	path, _, err := fsv.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if path == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("refusing to remove /"))
	}
	// Like envd: removing what does not exist succeeds. Not os.RemoveAll:
	// it follows symlinks guest code planted in the path's directories.
	if err := fsv.s.agent.RemoveAll(path); err != nil {
		return nil, rpcError("remove "+path, err)
	}
	return connect.NewResponse(&pb.RemoveResponse{}), nil
}

func (fsv *filesystemService) WatchDir(ctx context.Context, req *connect.Request[pb.WatchDirRequest], stream *connect.ServerStream[pb.WatchDirResponse]) error {
	path, _, err := fsv.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return err
	}
	w, err := fsv.s.newWatcher(path, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return err
	}
	defer w.close()
	if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Start{Start: &pb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	return w.stream(ctx, keepalive(req.Header()), func(ev *pb.FilesystemEvent) error {
		if ev == nil {
			return stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Keepalive{Keepalive: &pb.WatchDirResponse_KeepAlive{}}})
		}
		return stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Filesystem{Filesystem: ev}})
	})
}

func (fsv *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[pb.CreateWatcherRequest]) (*connect.Response[pb.CreateWatcherResponse], error) {
	path, _, err := fsv.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	w, err := fsv.s.newWatcher(path, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return nil, err
	}
	id := fsv.s.addWatcher(w)
	go w.collect()
	return connect.NewResponse(&pb.CreateWatcherResponse{WatcherId: id}), nil
}

func (fsv *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[pb.GetWatcherEventsRequest]) (*connect.Response[pb.GetWatcherEventsResponse], error) {
	w, ok := fsv.s.getWatcher(req.Msg.GetWatcherId())
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", req.Msg.GetWatcherId()))
	}
	events, err := w.drain()
	if err != nil {
		return nil, rpcError("watch", err)
	}
	return connect.NewResponse(&pb.GetWatcherEventsResponse{Events: events}), nil
}

func (fsv *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[pb.RemoveWatcherRequest]) (*connect.Response[pb.RemoveWatcherResponse], error) {
	w, ok := fsv.s.removeWatcher(req.Msg.GetWatcherId())
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", req.Msg.GetWatcherId()))
	}
	w.close()
	return connect.NewResponse(&pb.RemoveWatcherResponse{}), nil
}
