package workerapi

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/airlock/airlock/internal/model"
)

// Template builds on a worker. The server sends the build as one tar
// stream: first BuildFileSpec (a BuildRequest, JSON), then every file the
// recipe's COPY steps name, as BuildFilesDir + FilesHash, in any order.
// The worker answers 200 at once and streams model.BuildEvent as NDJSON
// (one JSON object per line) until the build's last event, of type "done"
// (its Digest is in the worker's catalog and reported at the next Sync,
// which the worker starts before sending it) or "error". A call whose
// request is wrong is an error answer instead (422: the Message says
// what; 409: the worker is building that template already).
//
//	POST /v1/builds/{id}   (token: token.ScopeBuild, SandboxID = the build's id)
const (
	RouteBuild    = "POST /v1/builds/{sid}"
	BuildFileSpec = "build.json"
	BuildFilesDir = "files/"
	// MaxBuildEventBytes bounds one event line read from a worker.
	MaxBuildEventBytes = 64 << 10
	// MaxBuildSpecBytes bounds the BuildRequest entry.
	MaxBuildSpecBytes = 1 << 20
)

// BuildPath is the data-plane path of build id.
func BuildPath(id string) string { return "/v1/builds/" + url.PathEscape(id) }

// BuildRequest is what a worker builds.
type BuildRequest struct {
	ID    string `json:"id"`
	OrgID string `json:"org_id"`
	// Spec.From is resolved by the server to FromDigest, a template the
	// worker holds.
	Spec       model.BuildSpec `json:"spec"`
	FromDigest string          `json:"from_digest"`
	// Network is the egress policy of the sandboxes that run RUN steps
	// (nil: no egress).
	Network *model.SandboxNetwork `json:"network,omitempty"`
	// Egress is the org's interception material for them (nil: none).
	Egress *Egress `json:"egress,omitempty"`
}

// BuildFile is one file a build's COPY steps use.
type BuildFile struct {
	Hash string // the key the steps name (model.BuildStep.FilesHash)
	Size int64
	Open func() (io.ReadCloser, error)
}

// Build sends req with files to the worker t names and calls onEvent for
// each event it streams, returning when the stream ends: nil after a
// "done" event, an error after an "error" event or when the stream breaks
// off before either. onEvent must not block for long.
func (d *DataPlane) Build(ctx context.Context, t Target, req BuildRequest, files []BuildFile, onEvent func(model.BuildEvent)) error {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeBuild(pw, req, files)) }()
	res, err := d.do(ctx, d.stream(), t, http.MethodPost, BuildPath(req.ID), pr, "application/x-tar")
	pr.Close()
	if err != nil {
		return err
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 0, 64<<10), MaxBuildEventBytes)
	for sc.Scan() {
		var ev model.BuildEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return model.Errorf(model.ErrUnavailable, "worker %s sent a malformed build event: %v", t.Worker, err)
		}
		onEvent(ev)
		switch ev.Type {
		case "done":
			return nil
		case "error":
			return fmt.Errorf("build %s: %s", req.ID, ev.Text)
		}
	}
	if err := sc.Err(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return model.Errorf(model.ErrUnavailable, "build %s: the stream from worker %s broke off: %v", req.ID, t.Worker, err)
	}
	return model.Errorf(model.ErrUnavailable, "build %s: worker %s ended the stream before the build finished", req.ID, t.Worker)
}

func writeBuild(w io.Writer, req BuildRequest, files []BuildFile) error {
	tw := tar.NewWriter(w)
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: BuildFileSpec, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(b); err != nil {
		return err
	}
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: BuildFilesDir + f.Hash, Mode: 0o644, Size: f.Size, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		r, err := f.Open()
		if err != nil {
			return fmt.Errorf("build file %s: %w", f.Hash, err)
		}
		_, err = io.Copy(tw, io.LimitReader(r, f.Size))
		r.Close()
		if err != nil {
			return fmt.Errorf("build file %s: %w", f.Hash, err)
		}
	}
	return tw.Close()
}
