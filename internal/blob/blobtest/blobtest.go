// Package blobtest gives tests blob stores: a directory, and the real
// S3-compatible server the test run provides (scripts/test.sh starts
// SeaweedFS and sets AIRLOCK_TEST_S3_URL and the AWS_* credentials).
package blobtest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/blob"
)

// EnvURL names the S3 store of the test run: s3://BUCKET?endpoint=URL&region=R.
const EnvURL = "AIRLOCK_TEST_S3_URL"

var seq atomic.Int64

// S3URL returns a URL of the test run's S3 store with a prefix of its own
// for t, or skips t naming what is missing.
func S3URL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(EnvURL)
	if u == "" {
		t.Skip("SKIP: no S3-compatible server: set " + EnvURL + "=s3://BUCKET?endpoint=http://HOST:PORT&region=R and AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (scripts/test.sh starts SeaweedFS)")
	}
	q := ""
	if i := strings.IndexByte(u, '?'); i >= 0 {
		u, q = u[:i], u[i:]
	}
	name := strings.NewReplacer("/", "-", "_", "-").Replace(strings.ToLower(t.Name()))
	return fmt.Sprintf("%s/t%d-%d-%s%s", strings.TrimSuffix(u, "/"), time.Now().UnixNano(), seq.Add(1), name, q)
}

// S3 opens S3URL(t).
func S3(t testing.TB) blob.Store {
	t.Helper()
	return open(t, S3URL(t))
}

// Dir opens a directory store in t's temporary directory.
func Dir(t testing.TB) blob.Store {
	t.Helper()
	return open(t, "file://"+t.TempDir())
}

// Backends maps each backend's name to its opener, for table tests.
var Backends = map[string]func(testing.TB) blob.Store{"dir": Dir, "s3": S3}

func open(t testing.TB, u string) blob.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := blob.Open(ctx, u)
	if err != nil {
		t.Fatalf("open blob store %s: %v", u, err)
	}
	return s
}
