package workerapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/httperr"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/snapshot"
	"github.com/airlock/airlock/internal/workerapi"
)

// A stand-in worker data plane on the routes the real one serves
// (internal/worker), checking the token it is sent.
func dataPlaneServer(t *testing.T, answer func(w http.ResponseWriter, r *http.Request)) workerapi.Target {
	t.Helper()
	mux := http.NewServeMux()
	for _, route := range []string{workerapi.RouteListCommands, workerapi.RouteExport, workerapi.RouteImport, workerapi.RouteDropSnapshots} {
		mux.HandleFunc(route, func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer tok" {
				httperr.Write(w, model.Errorf(model.ErrUnauthorized, "bad token"))
				return
			}
			answer(w, r)
		})
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return workerapi.Target{Worker: "w1", URL: srv.URL + "/", Token: "tok"}
}

func TestDataPlaneCalls(t *testing.T) {
	ctx := context.Background()
	dp := &workerapi.DataPlane{}
	var got *http.Request
	var gotBody string
	tgt := dataPlaneServer(t, func(w http.ResponseWriter, r *http.Request) {
		got = r
		b, _ := io.ReadAll(r.Body)
		gotBody = string(b)
		switch r.Method + " " + r.URL.Path {
		case "GET /v1/sandboxes/sb-1/commands":
			if r.URL.Query().Get("cursor") == "old" {
				w.Write([]byte(`[{"id":"c0"}]`)) // a worker before pagination
				return
			}
			json.NewEncoder(w).Encode(workerapi.CommandsPage{Commands: []agentapi.ProcessInfo{{ID: "c1"}}, NextCursor: "n"})
		case "GET /v1/sandboxes/sb-1/snapshots/snap-1/export":
			w.Header().Set("Content-Length", "7")
			w.Write([]byte("archive"))
		case "POST /v1/sandboxes/sb-1/snapshots":
			json.NewEncoder(w).Encode(snapshot.Manifest{ID: "snap-2", Name: "cp"})
		case "DELETE /v1/sandboxes/sb-1/snapshots":
			w.WriteHeader(http.StatusNoContent)
		}
	})

	page, err := dp.ListCommands(ctx, tgt, "sb-1", 5, "c")
	if err != nil || len(page.Commands) != 1 || page.Commands[0].ID != "c1" || page.NextCursor != "n" {
		t.Fatalf("ListCommands: %+v %v", page, err)
	}
	if q := got.URL.Query(); q.Get("limit") != "5" || q.Get("cursor") != "c" {
		t.Errorf("ListCommands sent query %q", got.URL.RawQuery)
	}
	if page, err := dp.ListCommands(ctx, tgt, "sb-1", 0, "old"); err != nil || len(page.Commands) != 1 || page.Commands[0].ID != "c0" {
		t.Errorf("ListCommands of a bare array: %+v %v", page, err)
	}
	if got.URL.Query().Has("limit") {
		t.Errorf("limit 0 sent as %q", got.URL.RawQuery)
	}

	body, size, err := dp.Export(ctx, tgt, "sb-1", "snap-1")
	if err != nil {
		t.Fatalf("Export: %v", err)
	}
	b, _ := io.ReadAll(body)
	body.Close()
	if string(b) != "archive" || size != 7 {
		t.Errorf("Export: %q size %d", b, size)
	}

	m, err := dp.Import(ctx, tgt, "sb-1", strings.NewReader("tarbytes"))
	if err != nil || m.ID != "snap-2" || m.Name != "cp" {
		t.Fatalf("Import: %+v %v", m, err)
	}
	if gotBody != "tarbytes" || got.Header.Get("Content-Type") != "application/x-tar" {
		t.Errorf("Import sent %q as %q", gotBody, got.Header.Get("Content-Type"))
	}
	if err := dp.DropSnapshots(ctx, tgt, "sb-1"); err != nil || got.Method != http.MethodDelete {
		t.Errorf("DropSnapshots: %v (%s)", err, got.Method)
	}

	bad := tgt
	bad.Token = "other"
	err = dp.DropSnapshots(ctx, bad, "sb-1")
	var we *workerapi.Error
	if !errors.As(err, &we) || !errors.Is(err, model.ErrUnauthorized) || !strings.Contains(err.Error(), "worker w1 answered 401") {
		t.Errorf("a refused token: %v", err)
	}
}

// TestDataPlaneBounds: a worker's answers are read within bounds, and a
// worker that answers nothing usable is unavailable.
func TestDataPlaneBounds(t *testing.T) {
	ctx := context.Background()
	dp := &workerapi.DataPlane{}
	tgt := dataPlaneServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet:
			w.Write([]byte(`{"commands":[`))
			junk := strings.Repeat(`{"id":"x"},`, 1<<16)
			for n := 0; n <= workerapi.MaxCommandsPageBytes; n += len(junk) {
				if _, err := w.Write([]byte(junk)); err != nil {
					return
				}
			}
		case http.MethodPost:
			w.Write([]byte("not json"))
		case http.MethodDelete:
			http.Error(w, "proxy says no", http.StatusBadGateway)
		}
	})
	if _, err := dp.ListCommands(ctx, tgt, "sb-1", 0, ""); !errors.Is(err, model.ErrUnavailable) || !strings.Contains(err.Error(), "over") {
		t.Errorf("an endless command list: %v", err)
	}
	if _, err := dp.Import(ctx, tgt, "sb-1", strings.NewReader("x")); !errors.Is(err, model.ErrUnavailable) {
		t.Errorf("a manifest that is not JSON: %v", err)
	}
	if err := dp.DropSnapshots(ctx, tgt, "sb-1"); !errors.Is(err, model.ErrUnavailable) || !strings.Contains(err.Error(), "proxy says no") {
		t.Errorf("a 502: %v", err)
	}
	if err := dp.DropSnapshots(ctx, workerapi.Target{Worker: "w9"}, "sb-1"); !errors.Is(err, model.ErrUnavailable) || !strings.Contains(err.Error(), "no data-plane URL") {
		t.Errorf("no URL: %v", err)
	}
}
