package service_test

import (
	"archive/tar"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/snapshot"
	"github.com/airlock/airlock/internal/snapshot/snapshottest"
	"github.com/airlock/airlock/internal/store/pgtest"
	"github.com/airlock/airlock/internal/store/postgres"
)

// operator is the principal of an admin key of the default org.
var operator = service.Principal{OrgID: service.DefaultOrgID, Admin: true}

// importService is a service on SQLite whose default org has the feature
// gates fs.
func importService(t *testing.T, fs ...string) *service.Service {
	t.Helper()
	return importServiceOn(t, newService(t), fs...)
}

// importServiceOn bootstraps s and gives its default org the gates fs.
func importServiceOn(t *testing.T, s *service.Service, fs ...string) *service.Service {
	t.Helper()
	if _, _, err := s.Bootstrap(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateOrg(t.Context(), operator, service.DefaultOrgID, service.OrgUpdate{Features: &fs}); err != nil {
		t.Fatalf("set features %v: %v", fs, err)
	}
	return s
}

// TestImportMetaHeaderFlood: an archive that is an endless run of tar meta
// headers is refused after at most snapshot.MaxHeadBytes, not buffered
// whole (security review M1).
func TestImportMetaHeaderFlood(t *testing.T) {
	s := importService(t, model.FeatureSnapshots)
	flood := &snapshottest.MetaFlood{}
	_, _, err := s.ImportSandbox(t.Context(), operator, service.CreateParams{}, io.LimitReader(flood, 256<<20), "")
	t.Logf("read %d bytes: %v", flood.N, err)
	if !errors.Is(err, model.ErrUnprocessable) && !errors.Is(err, model.ErrInvalid) {
		t.Fatalf("import of a meta-header flood: %v, want 422", err)
	}
	if flood.N > 2<<20+64<<10 {
		t.Fatalf("import read %d bytes of a meta-header flood before refusing it; want at most about 2 MiB", flood.N)
	}
}

// exportKey is the export key the test installations use (stored before
// first use, as if the installation had made it).
var exportKey = []byte("test export key: 32 bytes long..")

var tplDigest = "sha256:" + fill('e')

// signedService is importService with a known export key and a template
// base:latest of digest tplDigest.
func signedService(t *testing.T, fs ...string) *service.Service {
	t.Helper()
	return withExportKey(t, importService(t, fs...))
}

// withExportKey gives s the export key exportKey and the template
// base:latest of digest tplDigest.
func withExportKey(t *testing.T, s *service.Service) *service.Service {
	t.Helper()
	if _, err := s.TestStore().PutSettingIfAbsent(t.Context(), service.SettingExportKey, base64.StdEncoding.EncodeToString(exportKey)); err != nil {
		t.Fatal(err)
	}
	if err := s.TestStore().PutTemplate(t.Context(), model.Template{Name: "base", Tag: "latest", Digest: tplDigest}); err != nil {
		t.Fatal(err)
	}
	return s
}

// checkpointArchive is a real snapshot store's export of a checkpoint,
// with its manifest edited by edit (nil: as exported) and signed with key
// (nil: unsigned).
func checkpointArchive(t *testing.T, meta snapshot.Meta, edit func(*snapshot.Manifest), key []byte) []byte {
	t.Helper()
	st, err := snapshot.Open(filepath.Join(t.TempDir(), "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := st.Begin("sb-src")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.Dir(), "checkpoint.img"), []byte("sentry state"), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := p.Commit(meta)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := st.Export(t.Context(), "sb-src", m.ID, &buf); err != nil {
		t.Fatal(err)
	}
	h, err := snapshot.ReadHead(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	manifest := h.ManifestBytes
	if edit != nil {
		mm := h.Manifest
		edit(&mm)
		manifest, _ = json.Marshal(mm)
	}
	// Rebuild: the (edited) manifest, its signature, the rest as exported.
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: snapshot.ManifestFile, Size: int64(len(manifest)), Mode: 0o600})
	tw.Write(manifest)
	if key != nil {
		sig := snapshot.Sign(key, manifest)
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: snapshot.SignatureFile, Size: int64(len(sig)), Mode: 0o600})
		tw.Write(sig)
	}
	tr := tar.NewReader(bytes.NewReader(buf.Bytes()))
	tr.Next()
	for {
		e, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		tw.WriteHeader(e)
		io.Copy(tw, tr)
	}
	tw.Close()
	return out.Bytes()
}

var goodMeta = snapshot.Meta{Name: "c1", Runtime: "gvisor", Kind: snapshot.KindCheckpoint, Template: "base:latest", TemplateDigest: tplDigest, VCPUs: 1, MemoryMiB: 512}

// accepted reports whether an import got past every check on the archive:
// with no worker registered, the next step (placement) answers 503.
func accepted(err error) bool {
	return errors.Is(err, model.ErrUnavailable) && strings.Contains(err.Error(), "no worker can take the imported sandbox")
}

// TestImportSignatures performs the import attacks of security review M5
// through Service.ImportSandbox: an archive whose manifest was changed
// (an artifact's sha256) and re-signed with another key, or kept under
// the original signature, or stripped of its signature, is refused for an
// org without the unsigned_imports gate; with the gate only the unsigned
// archive is accepted; a correctly signed archive is accepted for both.
// The key and the gates live in the store: SQLite and PostgreSQL.
func TestImportSignatures(t *testing.T) {
	stores := map[string]func(t *testing.T) *service.Service{
		"sqlite": newService,
		"postgres": func(t *testing.T) *service.Service {
			st, err := postgres.Open(t.Context(), pgtest.URL(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return service.New(service.Config{Store: st, Events: events.New(st)})
		},
	}
	if testing.Short() && os.Getenv(pgtest.EnvURL) == "" {
		// A skip inside the store loop would skip sqlite's half too.
		t.Logf("-short: sqlite only: no private PostgreSQL in the fast tier (set %s to add a running one)", pgtest.EnvURL)
		delete(stores, "postgres")
	}
	otherKey := []byte("another installation's key......")
	tamper := func(m *snapshot.Manifest) { m.Artifacts[0].SHA256 = strings.Repeat("ab", 32) }
	signedThenTampered := func(t *testing.T) []byte {
		a := checkpointArchive(t, goodMeta, nil, exportKey)
		h, err := snapshot.ReadHead(bytes.NewReader(a))
		if err != nil {
			t.Fatal(err)
		}
		// Same signature, the artifact's sha256 changed in place.
		i := bytes.Index(a, h.ManifestBytes)
		j := bytes.Index(h.ManifestBytes, []byte(h.Manifest.Artifacts[0].SHA256))
		if i < 0 || j < 0 {
			t.Fatal("cannot tamper in place")
		}
		copy(a[i+j:], strings.Repeat("ab", 32))
		return a
	}
	for _, tc := range []struct {
		name      string
		archive   func(t *testing.T) []byte
		untrusted string // "" accepted, else a substring of the 422
		trusted   string
	}{
		{"signed by this installation",
			func(t *testing.T) []byte { return checkpointArchive(t, goodMeta, nil, exportKey) }, "", ""},
		{"tampered and re-signed with another key",
			func(t *testing.T) []byte { return checkpointArchive(t, goodMeta, tamper, otherKey) },
			"not exported by this installation or was modified", "not exported by this installation or was modified"},
		{"tampered under the original signature", signedThenTampered,
			"not exported by this installation or was modified", "not exported by this installation or was modified"},
		{"tampered and signature stripped",
			func(t *testing.T) []byte { return checkpointArchive(t, goodMeta, tamper, nil) },
			`needs the "unsigned_imports" feature gate`, ""},
		{"unsigned",
			func(t *testing.T) []byte { return checkpointArchive(t, goodMeta, nil, nil) },
			`needs the "unsigned_imports" feature gate`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, org := range []struct {
				gates []string
				want  string
			}{
				{[]string{model.FeatureSnapshots}, tc.untrusted},
				{[]string{model.FeatureSnapshots, model.FeatureUnsignedImports}, tc.trusted},
			} {
				for name, open := range stores {
					s := withExportKey(t, importServiceOn(t, open(t), org.gates...))
					_, _, err := s.ImportSandbox(t.Context(), operator, service.CreateParams{}, bytes.NewReader(tc.archive(t)), "")
					switch {
					case org.want == "" && !accepted(err):
						t.Errorf("%s, org with %v: import = %v, want it accepted (503 from placement)", name, org.gates, err)
					case org.want != "" && (!errors.Is(err, model.ErrUnprocessable) || !strings.Contains(err.Error(), org.want)):
						t.Errorf("%s, org with %v: import = %v, want 422 with %q", name, org.gates, err, org.want)
					}
				}
			}
		})
	}
}

// TestImportManifestChecks: the manifest must come first, as a regular
// file; its checkpoint name and template reference must pass the create
// rules (security review M1, M5). The archives are signed by the
// installation, so these checks are what refuses them.
func TestImportManifestChecks(t *testing.T) {
	s := signedService(t, model.FeatureSnapshots)
	good := checkpointArchive(t, goodMeta, nil, exportKey)
	swapped := func() []byte { // manifest.json after the first artifact
		var out bytes.Buffer
		tw := tar.NewWriter(&out)
		tr := tar.NewReader(bytes.NewReader(good))
		var ents []struct {
			h *tar.Header
			b []byte
		}
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			b, _ := io.ReadAll(tr)
			ents = append(ents, struct {
				h *tar.Header
				b []byte
			}{h, b})
		}
		ents[0], ents[2] = ents[2], ents[0]
		for _, e := range ents {
			tw.WriteHeader(e.h)
			tw.Write(e.b)
		}
		tw.Close()
		return out.Bytes()
	}()
	named := func(name string) []byte {
		return checkpointArchive(t, goodMeta, func(m *snapshot.Manifest) { m.Name = name }, exportKey)
	}
	templated := func(ref string) []byte {
		return checkpointArchive(t, goodMeta, func(m *snapshot.Manifest) { m.Template = ref }, exportKey)
	}
	for _, tc := range []struct {
		name    string
		archive []byte
		want    string // "" accepted
	}{
		{"good", good, ""},
		{"manifest not first", swapped, `first entry is "checkpoint.img"`},
		{"name with a slash", named("../../etc"), "checkpoint name"},
		{"name too long", named(strings.Repeat("a", 64)), "checkpoint name"},
		{"name of 1 MiB", named(strings.Repeat("a", 1<<20-4096)), "checkpoint name"},
		{"name upper case", named("C1"), "checkpoint name"},
		{"name with a newline", named("c1\nINFO forged log line"), "checkpoint name"},
		{"no name", named(""), ""},
		{"template of 1 MiB", templated(strings.Repeat("b", 1<<20-4096)), "not a template reference"},
		{"template with a slash", templated("a/b"), "not a valid reference"},
		{"template with a control character", templated("base\x1b[31m"), "not a template reference"},
		{"template bad digest", templated("sha256:xyz"), "not a valid digest"},
		{"template unknown here", templated("other:v2"), ""},
		{"template by digest", templated(tplDigest), ""},
		{"no template", templated(""), ""},
		{"runtime of 1 MiB", checkpointArchive(t, goodMeta, func(m *snapshot.Manifest) { m.Runtime = strings.Repeat("r", 1<<20-4096) }, exportKey), "runtime only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := s.ImportSandbox(t.Context(), operator, service.CreateParams{}, bytes.NewReader(tc.archive), "")
			switch {
			case tc.want == "" && !accepted(err):
				t.Fatalf("import = %v, want it accepted (503 from placement)", err)
			case tc.want != "" && (!errors.Is(err, model.ErrUnprocessable) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("import = %.300v, want 422 with %q", err, tc.want)
			}
			if err != nil && len(err.Error()) > 2048 {
				t.Fatalf("the error echoes the archive: %d bytes", len(err.Error()))
			}
		})
	}
}
