package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/airlock/airlock/internal/api/apitypes"
)

// NetworkLog returns one page of a sandbox's network log: at most limit
// entries (0: the server's page, 1,000) with seq after after. Pass the
// answer's Next as after to read on or to follow.
func (c *Client) NetworkLog(ctx context.Context, id string, after int64, limit int) (apitypes.NetworkLogResponse, error) {
	q := url.Values{}
	if after > 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	path := "/v1/sandboxes/" + url.PathEscape(id) + "/network/log"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out apitypes.NetworkLogResponse
	err := c.do(ctx, http.MethodGet, path, nil, nil, &out)
	return out, err
}
