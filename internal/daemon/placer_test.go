package daemon

import (
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/store/sqlite"
)

// TestServerSharesPlacer: the server's service places imports through the
// controller's placer, so both place alike (and a placer set in the
// controller's config governs both).
func TestServerSharesPlacer(t *testing.T) {
	ctx := t.Context()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv, err := newServer(ctx, st, "join", time.Minute, slog.New(slog.DiscardHandler), time.Now, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if srv.cfg.Placer == nil || srv.cfg.Placer != srv.ctrl.Placer() {
		t.Fatalf("service placer %v, controller placer %v; want the same one", srv.cfg.Placer, srv.ctrl.Placer())
	}
}
