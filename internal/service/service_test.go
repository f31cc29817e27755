package service_test

import (
	"errors"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/store/sqlite"
)

func newService(t *testing.T) *service.Service {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatalf("open sqlite: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return service.New(service.Config{Store: st, Events: events.New(st)})
}

func TestRateLimitRefills(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := newService(t).TestWith(func(c *service.Config) {
		c.Now = func() time.Time { return now }
		c.RateLimit, c.RateBurst = 2, 2
	})
	secret, _, err := s.Bootstrap(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		advance time.Duration
		ok      bool
	}{
		{0, true}, {0, true}, {0, false}, // burst of 2, then empty
		{250 * time.Millisecond, false}, // half a token
		{250 * time.Millisecond, true},  // one token after 0.5 s at 2/s
		{0, false},
		{10 * time.Second, true}, {0, true}, {0, false}, // refill caps at the burst
	}
	for i, st := range steps {
		now = now.Add(st.advance)
		_, err := s.Authenticate(t.Context(), secret)
		if st.ok != (err == nil) {
			t.Fatalf("step %d: err=%v, want ok=%v", i, err, st.ok)
		}
		var rl *service.RateLimitError
		if err != nil && (!errors.As(err, &rl) || !errors.Is(err, model.ErrRateLimited) || rl.RetryAfter < time.Second) {
			t.Fatalf("step %d: %v is not a RateLimitError", i, err)
		}
	}
}

func TestBootstrapOnce(t *testing.T) {
	s := newService(t)
	secret, created, err := s.Bootstrap(t.Context())
	if err != nil || !created || !regexp.MustCompile(`^al_[0-9a-f]{40}$`).MatchString(secret) {
		t.Fatalf("first bootstrap: %q %v %v", secret, created, err)
	}
	p, err := s.Authenticate(t.Context(), secret)
	if err != nil || p.OrgID != service.DefaultOrgID || !p.Admin || !p.Operator() {
		t.Fatalf("admin principal %+v %v", p, err)
	}
	for range 2 {
		again, created, err := s.Bootstrap(t.Context())
		if err != nil || created || again != "" {
			t.Fatalf("later bootstrap: %q %v %v", again, created, err)
		}
	}
}

func TestTemplateReferences(t *testing.T) {
	s := newService(t)
	ctx := t.Context()
	d1 := "sha256:" + fill('a')
	d2 := "sha256:" + fill('b')
	for _, tpl := range []model.Template{{Name: "base", Tag: "latest", Digest: d1}, {Name: "py", Tag: "3.12", Digest: d2}} {
		if err := s.TestStore().PutTemplate(ctx, tpl); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := s.Bootstrap(ctx); err != nil {
		t.Fatal(err)
	}
	p := service.Principal{OrgID: service.DefaultOrgID}
	for _, tc := range []struct {
		ref, digest string
	}{
		{"", d1}, {"base", d1}, {"base:latest", d1}, {"py:3.12", d2}, {d2, d2},
		{"py", ""}, {"py:3.11", ""}, {"sha256:" + d1[7:70], ""}, {"sha256:cafe", ""}, {"a/b", ""}, {":x", ""},
	} {
		sb, _, err := s.CreateSandbox(ctx, p, service.CreateParams{Template: tc.ref}, "")
		if tc.digest == "" {
			if !errors.Is(err, model.ErrUnprocessable) {
				t.Errorf("%q: err %v, want ErrUnprocessable", tc.ref, err)
			}
			continue
		}
		if err != nil || sb.TemplateDigest != tc.digest {
			t.Errorf("%q: digest %q err %v, want %q", tc.ref, sb.TemplateDigest, err, tc.digest)
		}
	}
}

func TestResourceLimits(t *testing.T) {
	s := newService(t)
	ctx := t.Context()
	if err := s.TestStore().PutTemplate(ctx, model.Template{Name: "base", Tag: "latest", Digest: "sha256:" + fill('c')}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Bootstrap(ctx); err != nil {
		t.Fatal(err)
	}
	p := service.Principal{OrgID: service.DefaultOrgID}
	for _, tc := range []struct {
		res model.Resources
		ok  bool
	}{
		{model.Resources{}, true}, {model.Resources{VCPUs: 8, MemoryMiB: 16384}, true}, {model.Resources{VCPUs: 1, MemoryMiB: 128}, true},
		{model.Resources{VCPUs: 9}, false}, {model.Resources{VCPUs: -1}, false}, {model.Resources{MemoryMiB: 127}, false}, {model.Resources{MemoryMiB: 16385}, false},
	} {
		_, _, err := s.CreateSandbox(ctx, p, service.CreateParams{Resources: tc.res}, "")
		if tc.ok != (err == nil) || err != nil && !errors.Is(err, model.ErrUnprocessable) {
			t.Errorf("%+v: %v", tc.res, err)
		}
	}
}

func fill(c byte) string {
	b := make([]byte, 64)
	for i := range b {
		b[i] = c
	}
	return string(b)
}

// TestConcurrentCreatesAndQuotas: a burst of one org's creates runs in
// parallel when the org has no quota, and all are recorded; with a
// sandbox quota the admission is still serialized, so exactly the quota
// is admitted and the rest get quota errors (no two take the last unit).
func TestConcurrentCreatesAndQuotas(t *testing.T) {
	s := newService(t)
	ctx := t.Context()
	if err := s.TestStore().PutTemplate(ctx, model.Template{Name: "base", Tag: "latest", Digest: "sha256:" + fill('d')}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Bootstrap(ctx); err != nil {
		t.Fatal(err)
	}
	p := service.Principal{OrgID: service.DefaultOrgID, Admin: true}
	burst := func(n int) (ok, quota int) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for range n {
			wg.Go(func() {
				_, _, err := s.CreateSandbox(ctx, p, service.CreateParams{}, "")
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					ok++
				case errors.Is(err, model.ErrQuotaExceeded):
					quota++
				default:
					t.Errorf("create: %v", err)
				}
			})
		}
		wg.Wait()
		return ok, quota
	}
	if ok, quota := burst(20); ok != 20 || quota != 0 {
		t.Fatalf("without quotas: %d created, %d refused; want 20, 0", ok, quota)
	}
	limit := 25
	if _, err := s.UpdateOrg(ctx, p, service.DefaultOrgID, service.OrgUpdate{Quotas: &service.QuotasPatch{Sandboxes: &limit}}); err != nil {
		t.Fatal(err)
	}
	if ok, quota := burst(20); ok != 5 || quota != 15 {
		t.Fatalf("with a quota of 25 and 20 in use: %d created, %d refused; want 5, 15", ok, quota)
	}
}
