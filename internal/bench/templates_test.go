package bench

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/dockerfile"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/templates"
)

type ociDesc struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations"`
}

// readBlob reads a blob of the layout at dir and checks its digest and size.
func readBlob(t *testing.T, dir string, d ociDesc) []byte {
	t.Helper()
	hexd, ok := strings.CutPrefix(d.Digest, "sha256:")
	if !ok {
		t.Fatalf("digest %q is not sha256", d.Digest)
	}
	b, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256", hexd))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	if hex.EncodeToString(sum[:]) != hexd || int64(len(b)) != d.Size {
		t.Fatalf("blob %s: content sha256 %x, %d bytes; descriptor says %d bytes", d.Digest, sum, len(b), d.Size)
	}
	return b
}

// manifestDigest checks the layout at dir end to end and returns its
// manifest's digest.
func manifestDigest(t *testing.T, dir string, wantLayers int, wantBytes int64, wantVariant string) string {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join(dir, "oci-layout")); err != nil || !strings.Contains(string(b), `"imageLayoutVersion":"1.0.0"`) {
		t.Fatalf("oci-layout: %q, %v", b, err)
	}
	var idx struct {
		SchemaVersion int       `json:"schemaVersion"`
		Manifests     []ociDesc `json:"manifests"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &idx); err != nil || idx.SchemaVersion != 2 || len(idx.Manifests) != 1 {
		t.Fatalf("index.json %s: %v", b, err)
	}
	md := idx.Manifests[0]
	if md.MediaType != "application/vnd.oci.image.manifest.v1+json" || md.Annotations["org.opencontainers.image.ref.name"] == "" {
		t.Fatalf("manifest descriptor %+v", md)
	}
	var man struct {
		Config ociDesc   `json:"config"`
		Layers []ociDesc `json:"layers"`
	}
	if err := json.Unmarshal(readBlob(t, dir, md), &man); err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		OS     string `json:"os"`
		RootFS struct {
			Type    string   `json:"type"`
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(readBlob(t, dir, man.Config), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.RootFS.Type != "layers" || len(cfg.RootFS.DiffIDs) != len(man.Layers) || len(man.Layers) != wantLayers {
		t.Fatalf("config %+v with %d layers, want %d", cfg, len(man.Layers), wantLayers)
	}
	var total int64
	var files []string
	for i, l := range man.Layers {
		total += l.Size
		zr, err := gzip.NewReader(strings.NewReader(string(readBlob(t, dir, l))))
		if err != nil {
			t.Fatalf("layer %d: %v", i, err)
		}
		h := sha256.New()
		tr := tar.NewReader(io.TeeReader(zr, h))
		for {
			hd, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("layer %d: %v", i, err)
			}
			if hd.Typeflag == tar.TypeReg {
				files = append(files, hd.Name)
			}
			if hd.Name == "etc/airlock-bench-variant" {
				if b, _ := io.ReadAll(tr); string(b) != wantVariant+"\n" {
					t.Errorf("variant file %q, want %q", b, wantVariant)
				}
			}
		}
		io.Copy(h, zr)
		if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != cfg.RootFS.DiffIDs[i] {
			t.Errorf("layer %d: uncompressed sha256 %s, diff_id %s", i, got, cfg.RootFS.DiffIDs[i])
		}
	}
	if total != wantBytes {
		t.Errorf("layers are %d bytes, WriteBenchLayout said %d", total, wantBytes)
	}
	if total < 3<<20 {
		t.Errorf("layers are %d bytes; want a few MB of incompressible data", total)
	}
	if !slices.Contains(files, "etc/airlock-bench-variant") || !slices.Contains(files, "opt/bench/a.bin") {
		t.Errorf("files %v", files)
	}
	return md.Digest
}

func TestWriteBenchLayout(t *testing.T) {
	dir := t.TempDir()
	var digests []string
	for _, v := range []string{"a", "b"} {
		d := filepath.Join(dir, v)
		n, size, err := WriteBenchLayout(d, v)
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, manifestDigest(t, d, n, size, v))
		if n != 3 {
			t.Errorf("%d layers, want 3", n)
		}
	}
	if digests[0] == digests[1] {
		t.Errorf("two variants have the same manifest %s: each import would find the last one's image", digests[0])
	}
}

func TestStartRecipeParses(t *testing.T) {
	dir := t.TempDir()
	var envs []string
	for _, v := range []string{"x-0", "x-1"} {
		spec, files, err := dockerfile.Parse([]byte(startRecipe(v)), dir, dir, "bench-start", "latest", nil)
		if err != nil {
			t.Fatal(err)
		}
		if spec.From != "base" || !strings.Contains(spec.StartCmd, "http.server 8000") || !strings.Contains(spec.ReadyCmd, "127.0.0.1:8000") || len(files) != 0 {
			t.Fatalf("spec %+v, files %v", spec, files)
		}
		if len(spec.Steps) != 1 || spec.Steps[0].Kind != "ENV" {
			t.Fatalf("steps %+v, want one ENV", spec.Steps)
		}
		envs = append(envs, strings.Join(spec.Steps[0].Args, "="))
	}
	if envs[0] == envs[1] {
		t.Errorf("the variants' ENV steps are the same (%s): they would build one template", envs[0])
	}
}

func TestBaseRecipeParses(t *testing.T) {
	dir := t.TempDir()
	df, err := templates.WriteContext("base", dir)
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(df)
	if err != nil {
		t.Fatal(err)
	}
	spec, _, err := dockerfile.Parse(src, dir, t.TempDir(), "bench-base", "latest", nil)
	if err != nil {
		t.Fatal(err)
	}
	if spec.From != "debian:bookworm" || len(spec.Steps) < 3 {
		t.Errorf("spec %+v", spec)
	}
}

func TestTemplatesRatios(t *testing.T) {
	st := func(p50 float64) *Stats { return &Stats{Unit: "ms", N: 3, P50: p50} }
	rep := Report{Measurements: map[string]Measurement{
		MTemplateBooted:      {Stats: st(4000)},
		MTemplateSnapshot:    {Stats: st(400)},
		MRunscDo:             {Stats: st(100)},
		MTemplateBuildCached: {Stats: st(20)},
		MTemplateBuildCold:   {Stats: st(180000)},
		MCreateSequential:    {Error: "failed"},
	}, Ratios: map[string]float64{}}
	addTemplatesRatios(&rep)
	want := map[string]float64{
		"start_cmd_template_image_p50_over_booted_p50":   0.1,
		"start_cmd_booted_p50_over_runsc_do_p50":         40,
		"start_cmd_template_image_p50_over_runsc_do_p50": 4,
		"template_build_base_cold_p50_over_cached_p50":   9000,
	}
	if len(rep.Ratios) != len(want) {
		t.Errorf("ratios %v, want %v (none from a failed or absent measurement)", rep.Ratios, want)
	}
	for k, v := range want {
		if rep.Ratios[k] != v {
			t.Errorf("%s = %v, want %v", k, rep.Ratios[k], v)
		}
	}
}

func TestTemplatesNotInDefaultSet(t *testing.T) {
	var c Config
	if c.wants(GroupTemplates) || !c.wants(GroupTemplate) {
		t.Errorf("default set: templates %v, template %v; want false, true", c.wants(GroupTemplates), c.wants(GroupTemplate))
	}
	c.Only = []string{GroupTemplates}
	if !c.wants(GroupTemplates) || !slices.Contains(Groups, GroupTemplates) {
		t.Errorf("--only templates is not measured or not a group: %v", Groups)
	}
}

func TestStepTimings(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	step := func(seq, idx, ms int, cached bool) model.BuildEvent {
		return model.BuildEvent{Seq: seq, Time: at(ms), Type: "step", Step: &model.BuildStepReport{Index: idx, Cached: cached}}
	}
	// Out of order on purpose: the timings follow Seq.
	events := []model.BuildEvent{
		{Seq: 7, Time: at(5000), Type: "done", Digest: "sha256:x"},
		step(1, -1, 0, true),
		step(2, 0, 10, false),
		{Seq: 3, Time: at(900), Type: "output", Text: "hello"},
		{Seq: 4, Time: at(1200), Type: "info", Text: "step 1 done in 1.2 s"},
		step(6, 2, 1300, false),
		step(5, 1, 1210, true),
	}
	reports := []model.BuildStepReport{
		{Index: -1, Text: "FROM base", Cached: true},
		{Index: 0, Text: "RUN a"},
		{Index: 1, Text: "ENV x=y", Cached: true, DurationMS: 0.05},
		{Index: 2, Text: "RUN b"},
		{Index: 3, Text: "never ran"},
	}
	got := StepTimings(reports, events)
	want := []float64{10, 1200, 90, 3700, 0}
	if len(got) != len(want) {
		t.Fatalf("%d timings, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		if got[i].EventMS != w || got[i].Index != reports[i].Index || got[i].Text != reports[i].Text || got[i].Cached != reports[i].Cached || got[i].ReportedMS != reports[i].DurationMS {
			t.Errorf("timing %d = %+v, want event_ms %v and the report %+v", i, got[i], w, reports[i])
		}
	}
}
