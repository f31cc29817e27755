package e2bcompat

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/workerapi"
)

func tgz(t *testing.T, entries map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if strings.HasSuffix(n, "/") {
			tw.WriteHeader(&tar.Header{Name: n, Mode: 0o755, Typeflag: tar.TypeDir})
			continue
		}
		tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(entries[n])), Typeflag: tar.TypeReg})
		tw.Write([]byte(entries[n]))
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

func untar(t *testing.T, b []byte) map[string]string {
	t.Helper()
	r, err := maybeGunzip(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	tr := tar.NewReader(r)
	for {
		hd, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		c, _ := io.ReadAll(tr)
		out[hd.Name] = string(c)
	}
}

// buildWorker gives worker w1 the power to build (its data plane is the
// env's stand-in).
func (e *env) buildWorker() {
	e.t.Helper()
	now := time.Now().UTC()
	if err := e.st.UpsertWorker(e.ctx, model.Worker{ID: "w1", DataPlaneURL: e.dp.URL, InternalURL: e.dp.URL, Runtimes: []model.RuntimeInfo{{Name: "gvisor", Caps: model.RuntimeCaps{Build: true}}},
		Templates: []string{baseDigest}, CapacityMiB: 8192, CapacityVCPUs: 8, LastHeartbeat: now, CreatedAt: now}); err != nil {
		e.t.Fatal(err)
	}
}

// TestCopyName: where an E2B COPY's files land, relative to the
// destination, as Docker's COPY places them.
func TestCopyName(t *testing.T) {
	for _, tc := range []struct {
		name, src, want string
		dir, ok         bool
	}{
		{"hello.txt", "hello.txt", "hello.txt", false, true},
		{"sub/hello.txt", "sub/hello.txt", "hello.txt", false, true},
		{"sub", "sub", "", true, false}, // the directory itself: only its contents
		{"sub/a", "sub", "a", true, true},
		{"sub/a/b.txt", "sub", "a/b.txt", false, true},
		{"sub", "sub/hello.txt", "", true, false}, // a parent of src
		{"other.txt", "sub", "", false, false},
		{"a.txt", "*.txt", "a.txt", false, true},
		{"dir", "d*", "", true, false},
		{"dir/x", "d*", "x", false, true},
		{"x/y", ".", "x/y", false, true},
	} {
		got, ok := copyName(tc.name, tc.src, tc.dir)
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("copyName(%q, %q) = %q, %v; want %q, %v", tc.name, tc.src, got, ok, tc.want, tc.ok)
		}
	}
}

// TestTemplateBuild drives E2B's build calls as the SDKs make them:
// request a build, ask for upload URLs, upload without the API key, send
// the steps, poll the status with logsOffset until ready; the worker (a
// stand-in builder on the data-plane contract) gets the translated
// recipe and the rewritten files. Then aliases and tags.
func TestTemplateBuild(t *testing.T) {
	e := newEnv(t)
	e.buildWorker()
	digest := "sha256:" + strings.Repeat("5", 64)
	got := make(chan workerapi.BuildRequest, 1)
	gotFiles := make(chan map[string][]byte, 1)
	e.dpHook = func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasPrefix(r.URL.Path, "/v1/builds/") {
			return false
		}
		tr := tar.NewReader(r.Body)
		var req workerapi.BuildRequest
		files := map[string][]byte{}
		for {
			hd, err := tr.Next()
			if err != nil {
				break
			}
			b, _ := io.ReadAll(tr)
			if hd.Name == workerapi.BuildFileSpec {
				json.Unmarshal(b, &req)
			} else {
				files[strings.TrimPrefix(hd.Name, workerapi.BuildFilesDir)] = b
			}
		}
		got <- req
		gotFiles <- files
		enc := json.NewEncoder(w)
		for i, st := range req.Spec.Steps {
			enc.Encode(model.BuildEvent{Type: "step", Time: time.Now(), Step: &model.BuildStepReport{Index: i, Text: st.Text}})
			if st.Kind == model.StepRun {
				enc.Encode(model.BuildEvent{Type: "output", Time: time.Now(), Stream: "stdout", Text: "ran " + st.Args[0]})
			}
		}
		enc.Encode(model.BuildEvent{Type: "done", Time: time.Now(), Digest: digest})
		w.(http.Flusher).Flush()
		e.st.PutTemplate(e.ctx, model.Template{Name: req.Spec.Name, Tag: req.Spec.Tag, Digest: digest, CreatedAt: time.Now()})
		return true
	}

	wantError(t, e.do("GET", "/templates/aliases/myapp", ""), 404, "not found")
	var rq templateRequestResponse
	r := e.do("POST", "/v3/templates", `{"name":"myapp","cpuCount":2,"memoryMB":1024}`)
	if r.status != 202 {
		t.Fatalf("POST /v3/templates = %d %s", r.status, r.body)
	}
	r.json(t, &rq)
	if rq.TemplateID != "myapp" || !strings.HasPrefix(rq.BuildID, "bld-") || !slices.Equal(rq.Tags, []string{"latest"}) {
		t.Fatalf("request = %s", r.body)
	}
	var st templateBuildInfo
	e.do("GET", "/templates/myapp/builds/"+rq.BuildID+"/status", "").json(t, &st)
	if st.Status != "waiting" {
		t.Fatalf("status before the steps = %+v", st)
	}

	hash := strings.Repeat("ab", 32) // E2B's own hash: opaque
	var up struct {
		Present bool   `json:"present"`
		URL     string `json:"url"`
	}
	e.do("GET", "/templates/myapp/files/"+hash, "").json(t, &up)
	if up.Present || !strings.HasPrefix(up.URL, e.srv.URL+uploadPath) {
		t.Fatalf("file upload link = %+v", up)
	}
	archive := tgz(t, map[string]string{"ctx/": "", "ctx/hello.txt": "hello from the context\n", "ctx/sub/x.txt": "x"})
	for _, u := range []string{up.URL + "x", e.srv.URL + uploadPath + "forged.token"} {
		req, _ := http.NewRequest("PUT", u, bytes.NewReader(archive))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 401 {
			t.Fatalf("upload to a bad URL = %d, want 401", res.StatusCode)
		}
	}
	req, _ := http.NewRequest("PUT", up.URL, bytes.NewReader(archive)) // no API key, as the SDKs
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("upload = %d", res.StatusCode)
	}
	e.do("GET", "/templates/myapp/files/"+hash, "").json(t, &up)
	if !up.Present {
		t.Fatal("uploaded file is not present")
	}

	// Steps as the JS SDK serializes fromTemplate('base').runCmd(…, {user:'root'}).copy(…).setEnvs(…).
	body := fmt.Sprintf(`{"fromTemplate":"base","force":false,"startCmd":"sleep infinity","readyCmd":"true","steps":[
		{"type":"RUN","args":["apt-get update","root"],"force":false},
		{"type":"COPY","args":["ctx","/app/","",""],"filesHash":%q,"force":false},
		{"type":"COPY","args":["ctx/hello.txt","/etc/greeting","root","0600"],"filesHash":%q,"force":false},
		{"type":"ENV","args":["A","1","B","2"],"force":false},
		{"type":"RUN","args":["echo hi"],"force":true}]}`, hash, hash)
	if r := e.do("POST", "/v2/templates/myapp/builds/"+rq.BuildID, body); r.status != 202 {
		t.Fatalf("start = %d %s", r.status, r.body)
	}
	wreq := <-got
	files := <-gotFiles
	var kinds []string
	for _, s := range wreq.Spec.Steps {
		kinds = append(kinds, s.Kind+" "+strings.Join(s.Args, ","))
	}
	want := []string{"USER root", "RUN apt-get update", "USER user", "COPY /app/", "COPY /etc/greeting", "ENV A,1,B,2", "RUN echo hi"}
	if !slices.Equal(kinds, want) || wreq.Spec.From != "base" || wreq.FromDigest != baseDigest || wreq.Spec.Name != "myapp" || wreq.Spec.Tag != "latest" ||
		wreq.Spec.StartCmd != "sleep infinity" || !wreq.Spec.Steps[6].Force {
		t.Fatalf("the worker got %+v (steps %q)", wreq.Spec, kinds)
	}
	cp := wreq.Spec.Steps[3]
	if cp.Chown != "user" || cp.FilesHash == hash || cp.ToFile {
		t.Fatalf("COPY step = %+v; want owner user and a rewritten file", cp)
	}
	if tree := untar(t, files[cp.FilesHash]); len(tree) != 2 || tree["hello.txt"] != "hello from the context\n" || tree["sub/x.txt"] != "x" {
		t.Fatalf("the rewritten COPY files = %v", tree)
	}
	one := wreq.Spec.Steps[4]
	if one.Chown != "root" || one.Chmod != "0600" || !one.ToFile {
		t.Fatalf("single-file COPY step = %+v; want owner root, mode 0600, to_file", one)
	}
	if tree := untar(t, files[one.FilesHash]); len(tree) != 1 || tree["hello.txt"] != "hello from the context\n" {
		t.Fatalf("the single-file COPY's files = %v", tree)
	}

	// Poll as the SDKs do: logsOffset += entries, until ready and no more entries.
	offset, status := 0, ""
	var msgs []string
	for i := 0; i < 1000; i++ {
		var info templateBuildInfo
		e.do("GET", fmt.Sprintf("/templates/myapp/builds/%s/status?logsOffset=%d", rq.BuildID, offset), "").json(t, &info)
		offset += len(info.LogEntries)
		for _, le := range info.LogEntries {
			msgs = append(msgs, le.Level+":"+le.Message)
		}
		status = info.Status
		if (status == "ready" || status == "error") && len(info.LogEntries) == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if status != "ready" || !slices.Contains(msgs, "info:ran apt-get update") || !slices.Contains(msgs, "info:Build finished: "+digest) {
		t.Fatalf("status %s, logs %q", status, msgs)
	}
	if r := e.do("GET", "/templates/aliases/myapp", ""); r.status != 200 || !strings.Contains(string(r.body), `"templateID":"myapp"`) {
		t.Fatalf("alias after the build = %d %s", r.status, r.body)
	}
	wantError(t, e.do("POST", "/v2/templates/myapp/builds/"+rq.BuildID, body), 409, "request a new build")
	wantError(t, e.do("GET", "/templates/other/builds/"+rq.BuildID+"/status", ""), 404, "no build")

	// Tags.
	if r := e.do("POST", "/templates/tags", `{"target":"myapp:latest","tags":["v1","stable"]}`); r.status != 201 || !strings.Contains(string(r.body), rq.BuildID) {
		t.Fatalf("assign tags = %d %s", r.status, r.body)
	}
	var tags []templateTag
	e.do("GET", "/templates/myapp/tags", "").json(t, &tags)
	var names []string
	for _, tg := range tags {
		names = append(names, tg.Tag)
		if tg.BuildID != rq.BuildID {
			t.Errorf("tag %s has build %q, want %s", tg.Tag, tg.BuildID, rq.BuildID)
		}
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"latest", "stable", "v1"}) {
		t.Fatalf("tags = %v", names)
	}
}

// TestTemplateBuildRefused: E2B-side refusals, in E2B's error shape.
func TestTemplateBuildRefused(t *testing.T) {
	e := newEnv(t)
	e.buildWorker()
	var rq templateRequestResponse
	e.do("POST", "/v3/templates", `{"name":"img:v2"}`).json(t, &rq)
	if rq.TemplateID != "img" || !slices.Equal(rq.Tags, []string{"v2"}) {
		t.Fatalf("request with a tag = %+v", rq)
	}
	wantError(t, e.do("POST", "/v3/templates", `{"name":"Bad Name"}`), 400, "template name")
	wantError(t, e.do("POST", "/v2/templates/img/builds/"+rq.BuildID, `{"fromImage":"python:3.12","steps":[]}`), 400, "airlock template pull python:3.12")
	wantError(t, e.do("POST", "/v2/templates/img/builds/"+rq.BuildID, `{"fromTemplate":"base","steps":[{"type":"COPY","args":["a","/a"],"filesHash":"`+strings.Repeat("c", 64)+`"}]}`), 400, "not uploaded")
	wantError(t, e.do("POST", "/v2/templates/img/builds/"+rq.BuildID, `{"fromTemplate":"base","steps":[{"type":"EXPOSE","args":["80"]}]}`), 400, "EXPOSE")
	// fromBaseImage() maps to base: this one reaches the worker (the
	// stand-in data plane answers 200 without a stream: the build fails).
	if r := e.do("POST", "/v2/templates/img/builds/"+rq.BuildID, `{"fromImage":"e2bdev/base","steps":[]}`); r.status != 202 {
		t.Fatalf("fromImage e2bdev/base = %d %s", r.status, r.body)
	}
	wantError(t, e.do("GET", "/templates/img/builds/bld-nope/status", ""), 404, "not found")
}
