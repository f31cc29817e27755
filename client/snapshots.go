package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"

	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
)

// Checkpoints, rollback, forks, export and import: the org needs the feature
// gate "snapshots" (403 otherwise), and the sandboxes must run on a runtime
// that has them (gvisor; 409 otherwise).

// ImportPart is the name of the multipart part that ImportSandbox sends the
// archive in (CreateSandboxRequest.Import).
const ImportPart = "archive"

// CreateCheckpoint asks for a named checkpoint of a running or paused
// sandbox and returns the checkpoint operation (see WaitOperation); the
// sandbox keeps running (or stays paused). Names are 1-63 characters of
// a-z, 0-9, '.', '_' and '-', starting with a letter or a digit, unique
// within the sandbox.
func (c *Client) CreateCheckpoint(ctx context.Context, sandboxID, name string) (model.Operation, error) {
	var out apitypes.OperationResponse
	err := c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(sandboxID)+"/checkpoints", nil,
		apitypes.CreateCheckpointRequest{Name: name}, &out)
	return out.Operation, err
}

// ListCheckpoints returns the sandbox's completed checkpoints, oldest first.
func (c *Client) ListCheckpoints(ctx context.Context, sandboxID string) ([]model.Checkpoint, error) {
	var out apitypes.ListCheckpointsResponse
	err := c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(sandboxID)+"/checkpoints", nil, nil, &out)
	return out.Checkpoints, err
}

// DeleteCheckpoint deletes checkpoint name of the sandbox: nothing can
// roll back to or fork from it afterwards, and its worker drops its bytes.
func (c *Client) DeleteCheckpoint(ctx context.Context, sandboxID, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/sandboxes/"+url.PathEscape(sandboxID)+"/checkpoints/"+url.PathEscape(name), nil, nil, nil)
}

// RollbackSandbox asks for the sandbox's memory, processes and files to go
// back to checkpoint checkpoint and returns the rollback operation; the
// sandbox is running once it succeeds.
func (c *Client) RollbackSandbox(ctx context.Context, sandboxID, checkpoint string) (model.Operation, error) {
	var out apitypes.OperationResponse
	err := c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(sandboxID)+"/rollback", nil,
		apitypes.RollbackRequest{Checkpoint: checkpoint}, &out)
	return out.Operation, err
}

// ForkSandbox creates req.Count sandboxes (default 1, at most
// apitypes.MaxForks) that start from checkpoint req.FromCheckpoint, on the
// worker of the checkpoint's sandbox, with its template, runtime and
// resources (req must not set them). It returns one sandbox and "fork"
// operation per fork; wait for each operation. A non-empty idempotencyKey
// makes retries return the same forks.
func (c *Client) ForkSandbox(ctx context.Context, req CreateSandboxRequest, idempotencyKey string) ([]CreateSandboxResponse, error) {
	if req.FromCheckpoint == nil {
		return nil, errors.New("airlock: fork: FromCheckpoint is not set")
	}
	var hdr http.Header
	if idempotencyKey != "" {
		hdr = http.Header{"Idempotency-Key": {idempotencyKey}}
	}
	var out CreateSandboxResponse
	if err := c.do(ctx, http.MethodPost, "/v1/sandboxes", hdr, req, &out); err != nil {
		return nil, err
	}
	if len(out.Forks) == 0 {
		// One fork, described only by sandbox and operation.
		return []CreateSandboxResponse{{Sandbox: out.Sandbox, Operation: out.Operation}}, nil
	}
	return out.Forks, nil
}

// ExportCheckpoint streams checkpoint name of the sandbox as a portable tar
// archive (manifest.json first, then the snapshot's artifacts) into w and
// returns the number of bytes written. The bytes pass through the API
// server from the sandbox's worker. An error after some bytes were written
// (a dropped connection) means w holds a truncated archive; discard it.
func (c *Client) ExportCheckpoint(ctx context.Context, sandboxID, name string, w io.Writer) (int64, error) {
	path := "/v1/sandboxes/" + url.PathEscape(sandboxID) + "/checkpoints/" + url.PathEscape(name) + "/export"
	resp, err := c.send(ctx, http.MethodGet, path, nil, nil, "application/x-tar")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("airlock: export checkpoint %s of %s after %d bytes: %w", name, sandboxID, n, err)
	}
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return n, fmt.Errorf("airlock: export checkpoint %s of %s: got %d of %d bytes", name, sandboxID, n, resp.ContentLength)
	}
	return n, nil
}

// ImportSandbox creates a sandbox that starts from a checkpoint archive (as
// written by ExportCheckpoint), with the archive's template and resources;
// the archive's checkpoint is listed on the new sandbox under its name. req
// may set Env, Metadata, TimeoutS, IdleSuspendAfterS and AutoWake; Import
// is set here. The archive is streamed (multipart/form-data: the JSON part
// "request", then the part "archive"), never held in memory. Wait for the
// returned create operation.
func (c *Client) ImportSandbox(ctx context.Context, req CreateSandboxRequest, archive io.Reader) (model.Sandbox, model.Operation, error) {
	req.Import = ImportPart
	meta, err := json.Marshal(req)
	if err != nil {
		return model.Sandbox{}, model.Operation{}, fmt.Errorf("airlock: encode import request: %w", err)
	}
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	werr := make(chan error, 1)
	go func() {
		err := writeImportBody(mw, meta, archive)
		pw.CloseWithError(err) // nil: EOF for the reader
		werr <- err
	}()
	hdr := http.Header{"Content-Type": {mw.FormDataContentType()}}
	resp, err := c.send(ctx, http.MethodPost, "/v1/sandboxes", hdr, pr, "application/json")
	// The server has answered: stop the writer if it is still going (an
	// early error answer) and wait for it, so that archive is no longer read
	// once ImportSandbox returns.
	pr.CloseWithError(errAnswered)
	bodyErr := <-werr
	if err != nil {
		var ae *APIError
		if !errors.As(err, &ae) && bodyErr != nil && !errors.Is(bodyErr, errAnswered) {
			// The request failed because the archive could not be read.
			return model.Sandbox{}, model.Operation{}, fmt.Errorf("airlock: import: %w", bodyErr)
		}
		return model.Sandbox{}, model.Operation{}, err
	}
	defer resp.Body.Close()
	var out CreateSandboxResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return model.Sandbox{}, model.Operation{}, fmt.Errorf("airlock: decode answer of import: %w", err)
	}
	return out.Sandbox, out.Operation, nil
}

var errAnswered = errors.New("the server answered before the archive was sent")

// writeImportBody writes the multipart body of an import: the JSON request
// part, then the archive part.
func writeImportBody(mw *multipart.Writer, meta []byte, archive io.Reader) error {
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="request"`)
	h.Set("Content-Type", "application/json")
	part, err := mw.CreatePart(h)
	if err != nil {
		return err
	}
	if _, err := part.Write(meta); err != nil {
		return err
	}
	h = textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="`+ImportPart+`"; filename="checkpoint.tar"`)
	h.Set("Content-Type", "application/x-tar")
	if part, err = mw.CreatePart(h); err != nil {
		return err
	}
	if _, err := io.Copy(tagWrites{part}, archive); err != nil {
		var pe *pipeWriteError
		if errors.As(err, &pe) {
			return pe.err
		}
		return fmt.Errorf("read archive: %w", err)
	}
	return mw.Close()
}

// tagWrites marks the errors of its writer, so that writeImportBody tells a
// failed read of the archive from a request body nobody reads any more.
type tagWrites struct{ w io.Writer }

func (t tagWrites) Write(p []byte) (int, error) {
	n, err := t.w.Write(p)
	if err != nil {
		err = &pipeWriteError{err}
	}
	return n, err
}

type pipeWriteError struct{ err error }

func (e *pipeWriteError) Error() string { return e.err.Error() }
func (e *pipeWriteError) Unwrap() error { return e.err }
