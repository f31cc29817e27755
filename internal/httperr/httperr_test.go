package httperr_test

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/httperr"
	"github.com/airlock/airlock/internal/model"
)

// Sentinels is every model sentinel; the surfaces' round-trip tests use it
// too (a new sentinel added to model must be added here).
var sentinels = []error{
	model.ErrNotFound, model.ErrGone, model.ErrConflict, model.ErrInvalid, model.ErrUnprocessable,
	model.ErrUnauthorized, model.ErrForbidden, model.ErrTooLarge, model.ErrRateLimited,
	model.ErrQuotaExceeded, model.ErrUnavailable,
}

func TestEverySentinelHasARow(t *testing.T) {
	for _, s := range sentinels {
		if r, ok := httperr.Internal.Lookup(s); !ok || r.Err != s {
			t.Errorf("internal table: %v maps to the row of %v", s, r.Err)
		}
		if _, ok := httperr.Public.Lookup(s); !ok {
			t.Errorf("public table has no row for %v", s)
		}
	}
	if len(httperr.Internal) != len(sentinels) {
		t.Errorf("internal table has %d rows, want one per sentinel (%d)", len(httperr.Internal), len(sentinels))
	}
}

// TestRoundTrip writes each sentinel, wrapped as the code wraps them, over
// a real HTTP server and reads it back.
func TestRoundTrip(t *testing.T) {
	var next error
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { httperr.Write(w, next) }))
	defer srv.Close()
	for _, s := range sentinels {
		next = fmt.Errorf("step: %w", model.Errorf(s, "sandbox sb-1: %s, do this next", s))
		res, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		got := httperr.FromResponse(res)
		res.Body.Close()
		if !errors.Is(got, s) {
			t.Errorf("%v: read back %v (status %d), which is not it", s, got, res.StatusCode)
		}
		if httperr.Kind(got) != s {
			t.Errorf("%v: read back as kind %v", s, httperr.Kind(got))
		}
		if want := next.Error(); got.Error() != want {
			t.Errorf("%v: message %q, want %q", s, got.Error(), want)
		}
	}
}

func TestInternalErrorNamesNoSentinel(t *testing.T) {
	rec := httptest.NewRecorder()
	httperr.Write(rec, errors.New("disk on fire"))
	if rec.Code != http.StatusInternalServerError {
		t.Fatalf("status %d", rec.Code)
	}
	got := httperr.Decode(rec.Code, rec.Body.Bytes())
	if got.Code != httperr.CodeInternal || httperr.Kind(got) != nil || got.Message != "disk on fire" {
		t.Fatalf("got %+v (kind %v)", got, httperr.Kind(got))
	}
}

func TestStatusFallbackWithoutCode(t *testing.T) {
	for status, want := range map[int]error{
		404: model.ErrNotFound, 410: model.ErrGone, 400: model.ErrInvalid, 422: model.ErrUnprocessable,
		409: model.ErrConflict, 401: model.ErrUnauthorized, 403: model.ErrForbidden, 413: model.ErrTooLarge,
		429: model.ErrRateLimited, 503: model.ErrUnavailable, 500: nil, 502: nil,
	} {
		got := httperr.Decode(status, []byte("<html>proxy page</html>\n"))
		if httperr.Kind(got) != want {
			t.Errorf("%d: kind %v, want %v", status, httperr.Kind(got), want)
		}
		if got.Message != "<html>proxy page</html>" {
			t.Errorf("%d: message %q", status, got.Message)
		}
	}
	if m := httperr.Decode(502, nil).Message; m != "502 Bad Gateway" {
		t.Errorf("empty body: message %q", m)
	}
}

// TestPublicDiffersOnlyAsDocumented: the /v1 table is the internal one but
// for ErrInvalid (422 "unprocessable") and ErrGone (no row: a 404).
func TestPublicDiffersOnlyAsDocumented(t *testing.T) {
	for _, s := range sentinels {
		ist, icode := httperr.Internal.Status(s)
		pst, pcode := httperr.Public.Status(s)
		switch s {
		case model.ErrInvalid:
			if pst != 422 || pcode != httperr.CodeUnprocessable {
				t.Errorf("public ErrInvalid = %d %s", pst, pcode)
			}
		case model.ErrGone:
			if pst != 404 || pcode != httperr.CodeNotFound {
				t.Errorf("public ErrGone = %d %s", pst, pcode)
			}
		default:
			if ist != pst || icode != pcode {
				t.Errorf("%v: internal %d %s, public %d %s", s, ist, icode, pst, pcode)
			}
		}
	}
}

// TestPublicCodesAreTheAPIs: the /v1 table's codes are those the OpenAPI
// document lists (apitypes).
func TestPublicCodesAreTheAPIs(t *testing.T) {
	api := map[string]bool{
		apitypes.CodeUnauthorized: true, apitypes.CodeForbidden: true, apitypes.CodeNotFound: true,
		apitypes.CodeConflict: true, apitypes.CodeTooLarge: true, apitypes.CodeUnprocessable: true,
		apitypes.CodeRateLimited: true, apitypes.CodeQuotaExceeded: true, apitypes.CodeUnavailable: true,
	}
	for _, r := range httperr.Public {
		if !api[r.Code] {
			t.Errorf("public row %v: code %q is not an apitypes code", r.Err, r.Code)
		}
	}
	if httperr.CodeInternal != apitypes.CodeInternal {
		t.Errorf("internal code %q, apitypes %q", httperr.CodeInternal, apitypes.CodeInternal)
	}
}

// TestSentinelListIsComplete: the list the round-trip tests use names
// every exported Err* of package model, so a new sentinel cannot miss a
// row.
func TestSentinelListIsComplete(t *testing.T) {
	fset := gotoken.NewFileSet()
	pkgs, err := parser.ParseDir(fset, "../model", func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	var declared []string
	for _, p := range pkgs {
		for _, f := range p.Files {
			for _, d := range f.Decls {
				g, ok := d.(*ast.GenDecl)
				if !ok || g.Tok != gotoken.VAR {
					continue
				}
				for _, sp := range g.Specs {
					for _, n := range sp.(*ast.ValueSpec).Names {
						if strings.HasPrefix(n.Name, "Err") {
							declared = append(declared, n.Name)
						}
					}
				}
			}
		}
	}
	if len(declared) != len(sentinels) {
		t.Fatalf("package model declares %d sentinels %v; the test list has %d", len(declared), declared, len(sentinels))
	}
}
