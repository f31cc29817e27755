package pgtest

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/airlock/airlock/internal/testenv"
)

func TestDBName(t *testing.T) {
	tests := []struct{ in, prefix string }{
		{"TestFoo", "t_testfoo_"},
		{"TestFoo/sub case#01", "t_testfoo_sub_case_01_"},
		{strings.Repeat("VeryLong", 20), "t_verylong"},
	}
	seen := map[string]bool{}
	for _, tc := range tests {
		got := dbName(tc.in)
		if !strings.HasPrefix(got, tc.prefix) || len(got) > 63 || seen[got] {
			t.Errorf("dbName(%q) = %q: want prefix %q, at most 63 bytes, unique", tc.in, got, tc.prefix)
		}
		seen[got] = true
		for _, r := range got {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
				t.Errorf("dbName(%q) = %q has %q", tc.in, got, r)
			}
		}
	}
}

func dbExists(t *testing.T, serverURL, name string) bool {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = $1`, name).Scan(&n); err != nil {
		t.Fatalf("query pg_database: %v", err)
	}
	return n == 1
}

// TestURL checks both modes: a private server per call (no Main here) and
// an existing server named by EnvURL; each URL is a fresh database that is
// dropped when its test ends.
func TestURL(t *testing.T) {
	testenv.Short(t, "starts a private PostgreSQL server (initdb)")
	if _, err := binDir(); err != nil {
		t.Skipf("SKIPPING: %v", err)
	}
	srv, err := Start()
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	var name string
	su, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	srvHost := su.Host
	t.Run("existing server", func(t *testing.T) {
		t.Setenv(EnvURL, srv.URL())
		u := URL(t)
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatalf("parse %s: %v", u, err)
		}
		name = strings.TrimPrefix(pu.Path, "/")
		ctx := context.Background()
		c, err := pgx.Connect(ctx, u)
		if err != nil {
			t.Fatalf("connect to %s: %v", u, err)
		}
		defer c.Close(ctx)
		var got string
		if err := c.QueryRow(ctx, `SELECT current_database()`).Scan(&got); err != nil || got != name {
			t.Fatalf("current_database = %q, %v; want %q", got, err, name)
		}
		if !strings.HasPrefix(name, "t_testurl_existing_server_") {
			t.Errorf("database %q is not named after the test", name)
		}
	})
	if name == "" || dbExists(t, srv.URL(), name) {
		t.Errorf("database %q still exists after its test", name)
	}
	t.Run("private server", func(t *testing.T) {
		t.Setenv(EnvURL, "")
		u := URL(t)
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatalf("parse %s: %v", u, err)
		}
		if pu.Host == srvHost {
			t.Errorf("URL %s uses the other server", u)
		}
		ctx := context.Background()
		c, err := pgx.Connect(ctx, u)
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, `CREATE TABLE x (id int)`); err != nil {
			t.Fatalf("create table: %v", err)
		}
	})
}
