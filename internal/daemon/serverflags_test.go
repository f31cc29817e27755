package daemon

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestServerRefusesBadScaleOutFlags: a bad --placement, --on-worker-loss,
// --worker-loss-grace or --blob-store stops `airlock server` at start with
// a message naming the flag.
func TestServerRefusesBadScaleOutFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--placement", "random"}, "--placement"},
		{[]string{"--on-worker-loss", "forget"}, "--on-worker-loss"},
		{[]string{"--worker-loss-grace", "0s"}, "--worker-loss-grace"},
		{[]string{"--blob-store", "ftp://x"}, "--blob-store"},
		{[]string{"--blob-store", "s3://bucket?color=red"}, "unknown parameter"},
	} {
		dir := t.TempDir()
		args := append([]string{"--listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"), "--worker-token", "tok"}, c.args...)
		err := serverCmd(context.Background(), args)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("server %v: %v, want an error naming %s", c.args, err, c.want)
		}
	}
}
