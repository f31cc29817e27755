// Package api holds Airlock's published API descriptions. openapi.json is
// the OpenAPI 3.1 document of the native REST API (/v1); it is written by
// hand, embedded here and served at GET /v1/openapi.json. A test in
// internal/api checks that every route the server registers appears in it
// and that it describes no route the server lacks, so the two cannot drift.
package api

import _ "embed"

// OpenAPI is the OpenAPI 3.1 document of the native REST API.
//
//go:embed openapi.json
var OpenAPI []byte
