package bench

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/dockerfile"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/templates"
)

// GroupTemplates measures issue 13's template paths through the ways users
// take them: `airlock template import` of an OCI layout, `airlock template
// build` of the base recipe (cold and cached), and create → first exec
// from a template with a start command, booted and from its template image.
// It is not in the default set: it builds for minutes and imports into the
// worker's data directory.
const GroupTemplates = "templates"

// Templates measurement names in Report.Measurements.
const (
	MTemplateImport      = "template_import"
	MTemplateBuildCold   = "template_build_base_cold"
	MTemplateBuildCached = "template_build_base_cached"
	MTemplateBooted      = "create_to_first_exec_start_cmd_booted"
	MTemplateSnapshot    = "create_to_first_exec_start_cmd_template_image"
)

// TemplatesReport is what GroupTemplates found besides its measurements.
type TemplatesReport struct {
	// ImportLayers and ImportBytes describe the OCI layout each import run
	// imports (compressed layer bytes); ImportCommand is one run's argv.
	ImportLayers  int    `json:"import_layers,omitempty"`
	ImportBytes   int64  `json:"import_bytes,omitempty"`
	ImportCommand string `json:"import_command,omitempty"`
	// BaseRecipe is the template name the base recipe was built as, and
	// ColdSteps/CachedSteps the step reports of the cold build and of the
	// last cached rebuild.
	BaseRecipe  string       `json:"base_recipe,omitempty"`
	BaseDigest  string       `json:"base_digest,omitempty"`
	ColdSteps   []StepTiming `json:"cold_steps,omitempty"`
	CachedSteps []StepTiming `json:"cached_steps,omitempty"`
	// StartRecipe is the Dockerfile of the start-command template (with
	// the variant's ENV line as built for variant 0).
	StartRecipe string `json:"start_recipe,omitempty"`
	// BootedFromBoot and ImageFromImage count the samples that reported
	// started_from boot and template_image respectively.
	BootedFromBoot int `json:"booted_started_from_boot"`
	ImageFromImage int `json:"image_started_from_template_image"`
	// ImageWaitMS is how long each variant took, after its booted sample,
	// until a create reported started_from=template_image (the worker
	// starts and checkpoints the template in the background).
	ImageWaitMS []float64 `json:"image_wait_ms,omitempty"`
}

// startRecipe is the start-command template: FROM base, a variant line
// that makes each build a distinct template, a server as START and a probe
// of it as READY.
func startRecipe(variant string) string {
	return "FROM base\n" +
		"ENV AIRLOCK_BENCH_VARIANT=" + variant + "\n" +
		"START python3 -m http.server 8000 --bind 127.0.0.1 --directory /tmp\n" +
		"READY curl -sf -o /dev/null http://127.0.0.1:8000/\n"
}

// runTemplates runs GroupTemplates, recording into rep.
func (b *bencher) runTemplates(ctx context.Context, rep *Report, record func(string, string, *Stats, error)) {
	tr := &TemplatesReport{}
	rep.Templates = tr
	var cleanup []string // templates to delete at the end
	defer func() {
		// Sandboxes first: a template in use cannot be deleted.
		b.cleanup(ctx)
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		b.deleteTemplates(dctx, cleanup)
	}()
	nonce := time.Now().UTC().Format("20060102t150405")

	// 1. import.
	st, err := b.templateImport(ctx, nonce, tr, &cleanup)
	record(MTemplateImport, fmt.Sprintf("`airlock template import <OCI layout> --name bench-import-…` as a subprocess (--no-wait: until the worker's catalog has it), a fresh image each run, %d runs (ms)", b.cfg.TemplatesRuns), st, err)

	// 2. build of the base recipe.
	if ctx.Err() == nil {
		cold, cached, err := b.templateBuildBase(ctx, tr, &cleanup)
		coldErr, cachedErr := err, err
		switch {
		case cold != nil:
			coldErr = nil
		case !b.cfg.TemplatesCold:
			coldErr = skipf("not measured (--templates-cold=false)")
		}
		if cached != nil {
			cachedErr = nil
		}
		record(MTemplateBuildCold, "`airlock template build` of templates/base (FROM debian:bookworm, apt-get in a sandbox) as bench-base with --no-cache: upload, build, every step run (ms)", cold, coldErr)
		record(MTemplateBuildCached, fmt.Sprintf("the same build again without --no-cache: every step from the step cache, %d runs (ms)", b.cfg.TemplatesRuns), cached, cachedErr)
	}

	// 3. create → first exec from a start-command template.
	if ctx.Err() == nil {
		booted, image, err := b.templateStartCmd(ctx, nonce, tr, &cleanup)
		bootErr, imageErr := err, err
		if booted != nil {
			bootErr = nil
		}
		if image != nil {
			imageErr = nil
		}
		record(MTemplateBooted, fmt.Sprintf("create a sandbox of a template with START (python3 -m http.server) and READY (curl), booted: the first create of each of %d variants (differing in one ENV line), wait for its create operation (READY passed), run `true` (ms)", b.cfg.TemplatesBoots), booted, bootErr)
		record(MTemplateSnapshot, fmt.Sprintf("as booted, from variant 0 once its template image exists (started_from template_image), %d sandboxes one after another (ms)", b.cfg.Sandboxes), image, imageErr)
	}
	addTemplatesRatios(rep)
}

// addTemplatesRatios derives the group's ratios from its measurements and
// the same run's baselines.
func addTemplatesRatios(rep *Report) {
	p50 := func(name string) (float64, bool) {
		m, ok := rep.Measurements[name]
		if !ok || m.Stats == nil || m.N == 0 {
			return 0, false
		}
		return m.P50, true
	}
	pairs := []struct{ name, a, b string }{
		{"start_cmd_template_image_p50_over_booted_p50", MTemplateSnapshot, MTemplateBooted},
		{"start_cmd_booted_p50_over_runsc_do_p50", MTemplateBooted, MRunscDo},
		{"start_cmd_template_image_p50_over_runsc_do_p50", MTemplateSnapshot, MRunscDo},
		{"start_cmd_booted_p50_over_base_sequential_p50", MTemplateBooted, MCreateSequential},
		{"start_cmd_template_image_p50_over_base_sequential_p50", MTemplateSnapshot, MCreateSequential},
		{"template_build_base_cold_p50_over_cached_p50", MTemplateBuildCold, MTemplateBuildCached},
	}
	for _, p := range pairs {
		a, okA := p50(p.a)
		d, okB := p50(p.b)
		if !okA || !okB {
			continue
		}
		if r, ok := Ratio(a, d); ok {
			rep.Ratios[p.name] = r
		}
	}
}

// templateImport times cfg.TemplatesRuns `airlock template import` runs of
// a fresh OCI layout each.
func (b *bencher) templateImport(ctx context.Context, nonce string, tr *TemplatesReport, cleanup *[]string) (*Stats, error) {
	switch {
	case b.cfg.Airlock == "":
		return nil, skipf("no airlock binary to run `airlock template import` with")
	case b.cfg.DataDir == "":
		return nil, skipf("no worker data directory (--data-dir, $AIRLOCK_DATA_DIR) to import into")
	case os.Geteuid() != 0:
		return nil, skipf("`airlock template import` needs root (it writes the worker's catalog in %s)", b.cfg.DataDir)
	}
	if _, err := os.Stat(filepath.Join(b.cfg.DataDir, "cache")); err != nil {
		return nil, skipf("%s is not a worker's data directory: %v", b.cfg.DataDir, err)
	}
	tmp, err := os.MkdirTemp("", "airlock-bench-import-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	var durs []time.Duration
	for i := range b.cfg.TemplatesRuns {
		dir := filepath.Join(tmp, fmt.Sprint(i))
		layers, size, err := WriteBenchLayout(dir, fmt.Sprintf("%s-%d", nonce, i))
		if err != nil {
			return nil, fmt.Errorf("write the OCI layout: %w", err)
		}
		tr.ImportLayers, tr.ImportBytes = layers, size
		name := fmt.Sprintf("bench-import-%s-%d", nonce, i)
		args := []string{"template", "import", dir, "--name", name + ":latest", "--data-dir", b.cfg.DataDir, "--no-wait", "--json"}
		tr.ImportCommand = "airlock " + strings.Join(args, " ")
		cmd := exec.CommandContext(ctx, b.cfg.Airlock, args...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		t0 := time.Now()
		err = cmd.Run()
		d := time.Since(t0)
		if err != nil {
			return nil, fmt.Errorf("%s: %v: %s", tr.ImportCommand, err, lastLines(errb.String(), 5))
		}
		*cleanup = append(*cleanup, name+":latest")
		var res struct {
			Existing bool `json:"existing"`
		}
		if err := json.Unmarshal(out.Bytes(), &res); err != nil {
			return nil, fmt.Errorf("%s printed %q: %w", tr.ImportCommand, lastLines(out.String(), 3), err)
		}
		if res.Existing {
			return nil, fmt.Errorf("import %d found its image in the catalog already: the layout is not fresh", i)
		}
		durs = append(durs, d)
		b.progress("template import: %d/%d (%.0f ms)", i+1, b.cfg.TemplatesRuns, float64(d)/1e6)
	}
	st := Summarize("ms", Millis(durs))
	return &st, nil
}

// Bench OCI layout: three gzip'ed layers of incompressible files (2 MiB,
// 1 MiB, and one small file naming the variant, which makes every layout
// a distinct image).
var benchLayers = []map[string]int{
	{"opt/bench/a.bin": 1 << 20, "opt/bench/b.bin": 1 << 20},
	{"opt/bench/c.bin": 1 << 20},
	{"etc/airlock-bench-variant": -1},
}

// WriteBenchLayout writes an OCI image layout to dir (created) whose
// content depends on variant; it returns the number of layers and their
// compressed size.
func WriteBenchLayout(dir, variant string) (int, int64, error) {
	blobs := filepath.Join(dir, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		return 0, 0, err
	}
	writeBlob := func(b []byte) (string, error) {
		sum := sha256.Sum256(b)
		h := hex.EncodeToString(sum[:])
		return "sha256:" + h, os.WriteFile(filepath.Join(blobs, h), b, 0o644)
	}
	type desc struct {
		MediaType   string            `json:"mediaType"`
		Digest      string            `json:"digest"`
		Size        int64             `json:"size"`
		Annotations map[string]string `json:"annotations,omitempty"`
	}
	var layers []desc
	var diffIDs []string
	var total int64
	for _, files := range benchLayers {
		var raw bytes.Buffer
		tw := tar.NewWriter(&raw)
		dirs := map[string]bool{}
		for _, name := range sortedKeys(files) {
			for d := filepath.Dir(name); d != "."; d = filepath.Dir(d) {
				dirs[d] = true
			}
		}
		for _, d := range sortedKeys(dirs) {
			if err := tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
				return 0, 0, err
			}
		}
		for _, name := range sortedKeys(files) {
			var data []byte
			if n := files[name]; n < 0 {
				data = []byte(variant + "\n")
			} else {
				data = make([]byte, n)
				rand.Read(data)
			}
			if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data)), ModTime: time.Unix(0, 0)}); err != nil {
				return 0, 0, err
			}
			if _, err := tw.Write(data); err != nil {
				return 0, 0, err
			}
		}
		if err := tw.Close(); err != nil {
			return 0, 0, err
		}
		diff := sha256.Sum256(raw.Bytes())
		diffIDs = append(diffIDs, "sha256:"+hex.EncodeToString(diff[:]))
		var gz bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
		zw.Write(raw.Bytes())
		if err := zw.Close(); err != nil {
			return 0, 0, err
		}
		dg, err := writeBlob(gz.Bytes())
		if err != nil {
			return 0, 0, err
		}
		layers = append(layers, desc{MediaType: "application/vnd.oci.image.layer.v1.tar+gzip", Digest: dg, Size: int64(gz.Len())})
		total += int64(gz.Len())
	}
	cfg, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Env": []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, "WorkingDir": "/"},
		"rootfs": map[string]any{"type": "layers", "diff_ids": diffIDs},
	})
	cfgDigest, err := writeBlob(cfg)
	if err != nil {
		return 0, 0, err
	}
	man, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": desc{MediaType: "application/vnd.oci.image.config.v1+json", Digest: cfgDigest, Size: int64(len(cfg))},
		"layers": layers,
	})
	manDigest, err := writeBlob(man)
	if err != nil {
		return 0, 0, err
	}
	idx, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
		"manifests": []desc{{MediaType: "application/vnd.oci.image.manifest.v1+json", Digest: manDigest, Size: int64(len(man)),
			Annotations: map[string]string{"org.opencontainers.image.ref.name": "bench"}}},
	})
	if err := os.WriteFile(filepath.Join(dir, "index.json"), idx, 0o644); err != nil {
		return 0, 0, err
	}
	if err := os.WriteFile(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644); err != nil {
		return 0, 0, err
	}
	return len(layers), total, nil
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// StepTiming is one build step: the build's own step report, and its
// duration from the build's events (the server's step report carries a
// RUN step's duration only when it was cached: it keeps the step event
// sent when the step begins).
type StepTiming struct {
	Index  int    `json:"index"` // in the recipe's steps; -1: FROM
	Text   string `json:"text"`
	Cached bool   `json:"cached"`
	// ReportedMS is the build's step report's duration_ms; EventMS the
	// time from the step's event to the next step's (the last step: to
	// the build's done event), by the events' server-side times.
	ReportedMS float64 `json:"reported_ms"`
	EventMS    float64 `json:"event_ms"`
}

// StepTimings pairs a build's step reports with the step durations its
// events show.
func StepTimings(reports []model.BuildStepReport, events []model.BuildEvent) []StepTiming {
	evs := slices.Clone(events)
	slices.SortFunc(evs, func(a, b model.BuildEvent) int { return a.Seq - b.Seq })
	start := map[int]time.Time{}
	var order []int
	var end time.Time
	for _, ev := range evs {
		switch {
		case ev.Type == "step" && ev.Step != nil:
			if _, ok := start[ev.Step.Index]; !ok {
				order = append(order, ev.Step.Index)
			}
			start[ev.Step.Index] = ev.Time
		case ev.Type == "done":
			end = ev.Time
		}
	}
	if end.IsZero() && len(evs) > 0 {
		end = evs[len(evs)-1].Time
	}
	until := map[int]time.Time{}
	for i, idx := range order {
		if i+1 < len(order) {
			until[idx] = start[order[i+1]]
		} else {
			until[idx] = end
		}
	}
	out := make([]StepTiming, 0, len(reports))
	for _, r := range reports {
		st := StepTiming{Index: r.Index, Text: r.Text, Cached: r.Cached, ReportedMS: r.DurationMS}
		if t0, ok := start[r.Index]; ok && !until[r.Index].Before(t0) {
			st.EventMS = round3(float64(until[r.Index].Sub(t0)) / 1e6)
		}
		out = append(out, st)
	}
	return out
}

// deleteTemplates deletes the bench's templates; one the server still
// lists a few seconds later (a worker's catalog report crossing the
// delete) is deleted again.
func (b *bencher) deleteTemplates(ctx context.Context, refs []string) {
	left := slices.Clone(refs)
	for round := 0; round < 3 && len(left) > 0; round++ {
		for _, ref := range left {
			if _, err := b.cfg.Client.DeleteTemplate(ctx, ref); err != nil && !isStatus(err, 404) {
				b.progress("delete template %s: %v", ref, err)
			}
		}
		if sleepCtx(ctx, 8*time.Second) != nil {
			return
		}
		ts, err := b.cfg.Client.ListTemplates(ctx)
		if err != nil {
			b.progress("list templates: %v", err)
			return
		}
		var still []string
		for _, t := range ts {
			if ref := t.Name + ":" + t.Tag; slices.Contains(left, ref) {
				still = append(still, ref)
			}
		}
		left = still
	}
	if len(left) > 0 {
		b.progress("templates still listed after cleanup: %v (delete them with `airlock template rm`)", left)
	}
}

// buildRecipe parses a Dockerfile as `airlock template build` does, then
// uploads, starts and follows the build; it returns the finished build and
// the time from the first upload check to the ready build, and the
// build's events.
func (b *bencher) buildRecipe(ctx context.Context, src []byte, contextDir, name string, force bool) (model.Build, time.Duration, []model.BuildEvent, error) {
	tmp, err := os.MkdirTemp("", "airlock-bench-build-")
	if err != nil {
		return model.Build{}, 0, nil, err
	}
	defer os.RemoveAll(tmp)
	spec, files, err := dockerfile.Parse(src, contextDir, tmp, name, "latest", nil)
	if err != nil {
		return model.Build{}, 0, nil, fmt.Errorf("parse the recipe of %s: %w", name, err)
	}
	spec.Force = force
	c := b.cfg.Client
	t0 := time.Now()
	for _, f := range files {
		has, err := c.HasBuildFile(ctx, f.Hash)
		if err != nil {
			return model.Build{}, 0, nil, fmt.Errorf("check build file %s: %w", f.Hash, err)
		}
		if has {
			continue
		}
		fh, err := os.Open(f.Path)
		if err != nil {
			return model.Build{}, 0, nil, err
		}
		err = c.PutBuildFile(ctx, f.Hash, fh, f.Size)
		fh.Close()
		if err != nil {
			return model.Build{}, 0, nil, fmt.Errorf("upload build file %s: %w", f.Hash, err)
		}
	}
	bd, err := c.StartBuild(ctx, spec)
	if err != nil {
		return bd, 0, nil, fmt.Errorf("start the build of %s: %w", name, err)
	}
	after := 0
	var evs []model.BuildEvent
	for {
		res, err := c.BuildEventsAfter(ctx, bd.ID, after, 30*time.Second)
		if err != nil {
			return bd, 0, evs, fmt.Errorf("follow build %s: %w", bd.ID, err)
		}
		for _, ev := range res.Events {
			after = max(after, ev.Seq)
			evs = append(evs, ev)
			if ev.Type == "step" && ev.Step != nil && !ev.Step.Cached {
				b.progress("build %s: step %d %s", name, ev.Step.Index+1, trunc(ev.Step.Text, 60))
			}
		}
		if len(res.Events) == 0 && (res.State == model.BuildReady || res.State == model.BuildFailed) {
			break
		}
	}
	d := time.Since(t0)
	if bd, err = c.GetBuild(ctx, bd.ID); err != nil {
		return bd, 0, evs, err
	}
	if bd.State != model.BuildReady {
		return bd, 0, evs, fmt.Errorf("build %s of %s failed: %s", bd.ID, name, bd.Error)
	}
	return bd, d, evs, nil
}

func trunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// templateBuildBase builds the shipped base recipe as bench-base with
// --no-cache once (unless cfg.TemplatesCold is off), then
// cfg.TemplatesRuns times with the cache.
func (b *bencher) templateBuildBase(ctx context.Context, tr *TemplatesReport, cleanup *[]string) (cold, cached *Stats, err error) {
	tmp, err := os.MkdirTemp("", "airlock-bench-recipe-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(tmp)
	df, err := templates.WriteContext("base", tmp)
	if err != nil {
		return nil, nil, fmt.Errorf("write the base recipe: %w", err)
	}
	src, err := os.ReadFile(df)
	if err != nil {
		return nil, nil, err
	}
	const name = "bench-base"
	tr.BaseRecipe = name
	*cleanup = append(*cleanup, name+":latest")
	if b.cfg.TemplatesCold {
		b.progress("template build: %s with --no-cache (minutes: apt-get in a sandbox)", name)
		bd, d, evs, err := b.buildRecipe(ctx, src, tmp, name, true)
		if err != nil {
			return nil, nil, err
		}
		st := Summarize("ms", Millis([]time.Duration{d}))
		cold, tr.ColdSteps, tr.BaseDigest = &st, StepTimings(bd.Steps, evs), bd.Digest
		b.progress("template build cold: %.1f s", float64(d)/1e9)
	}
	if !b.cfg.TemplatesCold {
		// Untimed: fills the step cache for this recipe (the shipped base's
		// steps need not share its keys).
		if _, _, _, err := b.buildRecipe(ctx, src, tmp, name, false); err != nil {
			return nil, nil, err
		}
	}
	var durs []time.Duration
	for i := range b.cfg.TemplatesRuns {
		bd, d, evs, err := b.buildRecipe(ctx, src, tmp, name, false)
		if err != nil {
			return cold, nil, err
		}
		for _, s := range bd.Steps {
			if !s.Cached && s.Index >= 0 {
				tr.CachedSteps = StepTimings(bd.Steps, evs)
				return cold, nil, fmt.Errorf("cached rebuild %d ran step %d (%s): the step cache missed", i+1, s.Index+1, trunc(s.Text, 60))
			}
		}
		if tr.BaseDigest != "" && bd.Digest != tr.BaseDigest {
			return cold, nil, fmt.Errorf("cached rebuild %d is %s, the cold build %s", i+1, bd.Digest, tr.BaseDigest)
		}
		tr.BaseDigest, tr.CachedSteps = bd.Digest, StepTimings(bd.Steps, evs)
		durs = append(durs, d)
		b.progress("template build cached: %d/%d (%.0f ms)", i+1, b.cfg.TemplatesRuns, float64(d)/1e6)
	}
	st := Summarize("ms", Millis(durs))
	return cold, &st, nil
}

// templateStartCmd builds cfg.TemplatesBoots variants of startRecipe and
// times the first create → first exec of each (booted; the worker then
// builds its template image in the background, which is waited for,
// untimed, before the next sample so that it does not compete with it),
// then cfg.Sandboxes creates → first exec from variant 0's image.
func (b *bencher) templateStartCmd(ctx context.Context, nonce string, tr *TemplatesReport, cleanup *[]string) (booted, image *Stats, err error) {
	tmp, err := os.MkdirTemp("", "airlock-bench-start-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(tmp)
	names := make([]string, b.cfg.TemplatesBoots)
	for i := range names {
		names[i] = fmt.Sprintf("bench-start-%s-%d", nonce, i)
		src := startRecipe(fmt.Sprintf("%s-%d", nonce, i))
		if i == 0 {
			tr.StartRecipe = src
		}
		*cleanup = append(*cleanup, names[i]+":latest")
		if _, _, _, err := b.buildRecipe(ctx, []byte(src), tmp, names[i], false); err != nil {
			return nil, nil, err
		}
	}
	b.progress("built %d start-command variants", len(names))
	sample := func(name string) (time.Duration, string, error) {
		r := b.request()
		r.Template = name
		t0 := time.Now()
		id, err := b.create(ctx, r)
		if err == nil {
			err = b.runTrue(ctx, id)
		}
		d := time.Since(t0)
		from := ""
		if id != "" {
			if sb, gerr := b.cfg.Client.GetSandbox(ctx, id); gerr == nil {
				from = sb.StartedFrom
			}
			if derr := b.delete(ctx, id); err == nil {
				err = derr
			}
		}
		return d, from, err
	}
	var boots []time.Duration
	for i, name := range names {
		d, from, err := sample(name)
		if err != nil {
			return nil, nil, err
		}
		if from == model.StartedBoot {
			tr.BootedFromBoot++
		}
		boots = append(boots, d)
		b.progress("start-command template booted: %d/%d (%.0f ms, started_from %s)", i+1, len(names), float64(d)/1e6, from)
		w0 := time.Now()
		if err := b.waitImage(ctx, name, 3*time.Minute); err != nil {
			if errors.As(err, new(errSkip)) {
				st := Summarize("ms", Millis(boots))
				return &st, nil, err
			}
			return nil, nil, err
		}
		tr.ImageWaitMS = append(tr.ImageWaitMS, round3(float64(time.Since(w0))/1e6))
	}
	bst := Summarize("ms", Millis(boots))
	var imgs []time.Duration
	for i := range b.cfg.Sandboxes {
		d, from, err := sample(names[0])
		if err != nil {
			return &bst, nil, err
		}
		if from == model.StartedTemplateImage {
			tr.ImageFromImage++
		}
		imgs = append(imgs, d)
		b.progress("start-command template from its image: %d/%d (%.0f ms, started_from %s)", i+1, b.cfg.Sandboxes, float64(d)/1e6, from)
	}
	ist := Summarize("ms", Millis(imgs))
	return &bst, &ist, nil
}

// waitImage creates (untimed) sandboxes of template name until one reports
// started_from=template_image.
func (b *bencher) waitImage(ctx context.Context, name string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		r := b.request()
		r.Template = name
		id, err := b.create(ctx, r)
		if err != nil {
			return err
		}
		sb, gerr := b.cfg.Client.GetSandbox(ctx, id)
		if derr := b.delete(ctx, id); derr != nil {
			return derr
		}
		if gerr != nil {
			return gerr
		}
		if sb.StartedFrom == model.StartedTemplateImage {
			return nil
		}
		if time.Now().After(deadline) {
			return skipf("no sandbox of %s (runtime %s) started from a template image within %s (started_from %q): does the runtime snapshot, and is the server not started with --template-images none?", name, sb.Runtime, within, sb.StartedFrom)
		}
		if err := sleepCtx(ctx, 2*time.Second); err != nil {
			return err
		}
	}
}
