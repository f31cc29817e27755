package service_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/store"
	"github.com/airlock/airlock/internal/store/pgtest"
	"github.com/airlock/airlock/internal/store/postgres"
	"github.com/airlock/airlock/internal/store/sqlite"
)

// TestLifecycleRaceBothStores races pause, suspend and wake requests on one
// running sandbox, on SQLite and on PostgreSQL: exactly one operation is
// opened, repeats of the winning request return it, and every other request
// is a conflict naming it.
func TestLifecycleRaceBothStores(t *testing.T) {
	stores := map[string]func(t *testing.T) store.Store{
		"sqlite": func(t *testing.T) store.Store {
			st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "airlock.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st
		},
		"postgres": func(t *testing.T) store.Store {
			st, err := postgres.Open(t.Context(), pgtest.URL(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st
		},
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			st := open(t)
			ctx := t.Context()
			svc := service.New(service.Config{Store: st, Events: events.New(st)})
			if err := st.CreateOrg(ctx, model.Org{ID: "org-a", Name: "a", CreatedAt: time.Now()}); err != nil {
				t.Fatal(err)
			}
			p := service.Principal{OrgID: "org-a"}
			for round := range 5 {
				id := fmt.Sprintf("sb-%d", round)
				runningSandbox(t, ctx, st, id)
				calls := []func() (model.Operation, error){
					func() (model.Operation, error) { return svc.PauseSandbox(ctx, p, id) },
					func() (model.Operation, error) { return svc.SuspendSandbox(ctx, p, id) },
					func() (model.Operation, error) { return svc.PauseSandbox(ctx, p, id) },
					func() (model.Operation, error) { return svc.SuspendSandbox(ctx, p, id) },
					func() (model.Operation, error) { return svc.WakeSandbox(ctx, p, id) },
				}
				ops := make([]model.Operation, len(calls))
				errs := make([]error, len(calls))
				var wg sync.WaitGroup
				for i, call := range calls {
					wg.Add(1)
					go func() { defer wg.Done(); ops[i], errs[i] = call() }()
				}
				wg.Wait()
				open, err := st.ListOperations(ctx, store.OperationFilter{SandboxID: id, Open: true})
				if err != nil || len(open) != 1 {
					t.Fatalf("round %d: open operations %+v (%v), want exactly one", round, open, err)
				}
				winner := open[0]
				for i, err := range errs {
					switch {
					case err == nil && ops[i].ID != winner.ID:
						t.Fatalf("round %d: call %d got operation %s, not the winner %s", round, i, ops[i].ID, winner.ID)
					case err != nil && !errors.Is(err, model.ErrConflict):
						t.Fatalf("round %d: call %d: %v", round, i, err)
					case err != nil && !strings.Contains(err.Error(), winner.ID) && !strings.Contains(err.Error(), "nothing to wake"):
						t.Fatalf("round %d: call %d: %q does not name the winner %s", round, i, err, winner.ID)
					}
				}
				sb, err := st.GetSandbox(ctx, id)
				if err != nil || sb.DesiredState != winner.Target {
					t.Fatalf("round %d: desired %s, want %s (%v)", round, sb.DesiredState, winner.Target, err)
				}
			}
		})
	}
}

func runningSandbox(t *testing.T, ctx context.Context, st store.Store, id string) {
	t.Helper()
	now := time.Now().UTC()
	sb := model.Sandbox{ID: id, OrgID: "org-a", Template: "base", TemplateDigest: "sha256:x", Runtime: "gvisor",
		State: model.StateRunning, DesiredState: model.StateRunning, WorkerID: "w1",
		Resources: model.Resources{VCPUs: 1, MemoryMiB: 512}, CreatedAt: now, UpdatedAt: now, LastActivityAt: now}
	op := model.Operation{ID: "op-c-" + id, OrgID: "org-a", SandboxID: id, Kind: model.OpCreate, State: model.OpSucceeded,
		Target: model.StateRunning, CreatedAt: now, UpdatedAt: now, Deadline: now.Add(time.Hour)}
	if _, _, _, err := st.CreateSandbox(ctx, sb, op, ""); err != nil {
		t.Fatal(err)
	}
}
