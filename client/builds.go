package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/airlock/airlock/internal/model"
)

// Template builds (docs/api.md "Builds"): upload the COPY inputs, start a
// build, follow its events.

// HasBuildFile reports whether the org has uploaded the build file hash.
func (c *Client) HasBuildFile(ctx context.Context, hash string) (bool, error) {
	resp, err := c.send(ctx, http.MethodHead, "/v1/templates/files/"+url.PathEscape(hash), nil, nil, "application/json")
	if err != nil {
		var ae *APIError
		if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
			return false, nil
		}
		return false, err
	}
	resp.Body.Close()
	return true, nil
}

// PutBuildFile uploads size bytes of r as build file hash (the sha256 hex
// of exactly those bytes).
func (c *Client) PutBuildFile(ctx context.Context, hash string, r io.Reader, size int64) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.url("/v1/templates/files/"+url.PathEscape(hash)), r)
	if err != nil {
		return err
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := c.sendRequest(req, "application/json")
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return resp.Body.Close()
}

// StartBuild starts building spec.
func (c *Client) StartBuild(ctx context.Context, spec model.BuildSpec) (model.Build, error) {
	var b model.Build
	err := c.do(ctx, http.MethodPost, "/v1/templates/builds", nil, spec, &b)
	return b, err
}

// GetBuild returns build id.
func (c *Client) GetBuild(ctx context.Context, id string) (model.Build, error) {
	var b model.Build
	err := c.do(ctx, http.MethodGet, "/v1/templates/builds/"+url.PathEscape(id), nil, nil, &b)
	return b, err
}

// BuildEvents is one answer of the build events call.
type BuildEvents struct {
	Events []model.BuildEvent `json:"events"`
	State  model.BuildState   `json:"state"`
}

// BuildEventsAfter returns build id's events after seq after, waiting up
// to wait for one while the build runs.
func (c *Client) BuildEventsAfter(ctx context.Context, id string, after int, wait time.Duration) (BuildEvents, error) {
	var out BuildEvents
	q := url.Values{"after": {strconv.Itoa(after)}, "wait": {strconv.Itoa(int(wait / time.Second))}}
	err := c.do(ctx, http.MethodGet, "/v1/templates/builds/"+url.PathEscape(id)+"/events?"+q.Encode(), nil, nil, &out)
	return out, err
}

// ImportTemplate uploads an image archive (an OCI layout tar or a docker
// save archive; size bytes, -1 if unknown) as template name:tag (ref:
// which image of several) and returns the template once the server lists
// it (operators only).
func (c *Client) ImportTemplate(ctx context.Context, name, tag, ref string, archive io.Reader, size int64) (model.Template, error) {
	q := url.Values{"name": {name}}
	if tag != "" {
		q.Set("tag", tag)
	}
	if ref != "" {
		q.Set("ref", ref)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url("/v1/templates?"+q.Encode()), archive)
	if err != nil {
		return model.Template{}, err
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := c.sendRequest(req, "application/json")
	if err != nil {
		return model.Template{}, err
	}
	defer resp.Body.Close()
	var t model.Template
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&t); err != nil {
		return t, fmt.Errorf("airlock: decode the imported template: %w", err)
	}
	return t, nil
}
