package api_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

// call sends one request with key and returns the status and body.
func call(t *testing.T, method, u, key string, body io.Reader) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// tarOf returns a tar of name → content.
func tarOf(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, content := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(content))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestBuildFiles: PUT checks the sha256 (400 naming the right one), the
// tar form (422) and the bound (413 by Content-Length, before reading);
// a second PUT of a hash is 200; HEAD says 200/404, per org.
func TestBuildFiles(t *testing.T) {
	e := newEnv(t)
	u := e.srv.URL + "/v1/templates/files/"
	otherKey, _ := e.orgKey("other", false)
	body := tarOf(t, map[string]string{"hello.txt": "hi\n"})
	h := sha(body)

	if st, _ := call(t, "HEAD", u+h, e.adminKey, nil); st != 404 {
		t.Fatalf("HEAD before upload = %d, want 404", st)
	}
	st, b := call(t, "PUT", u+h, e.adminKey, bytes.NewReader(body))
	var f apitypes.BuildFile
	if st != 201 || json.Unmarshal(b, &f) != nil || f.Hash != h || f.Size != int64(len(body)) {
		t.Fatalf("PUT = %d %s, want 201 {hash, size %d}", st, b, len(body))
	}
	if st, b := call(t, "PUT", u+h, e.adminKey, bytes.NewReader(body)); st != 200 {
		t.Fatalf("PUT again = %d %s, want 200", st, b)
	}
	if st, _ := call(t, "HEAD", u+h, e.adminKey, nil); st != 200 {
		t.Fatalf("HEAD after upload = %d, want 200", st)
	}
	if st, _ := call(t, "HEAD", u+h, otherKey, nil); st != 404 {
		t.Fatalf("HEAD by another org = %d, want 404", st)
	}

	wrong := strings.Repeat("0", 64)
	st, b = call(t, "PUT", u+wrong, e.adminKey, bytes.NewReader(body))
	if st != 400 || !strings.Contains(string(b), h) || !strings.Contains(string(b), "/v1/templates/files/"+h) {
		t.Fatalf("PUT under the wrong hash = %d %s, want 400 naming %s", st, b, h)
	}
	if st, b := call(t, "PUT", u+"not-a-sha", e.adminKey, bytes.NewReader(body)); st != 400 {
		t.Fatalf("PUT under a key that is no sha256 = %d %s, want 400", st, b)
	}
	junk := []byte("this is not a tar archive, not even close to one; it is just words" + strings.Repeat(".", 600))
	if st, b := call(t, "PUT", u+sha(junk), e.adminKey, bytes.NewReader(junk)); st != 422 || !strings.Contains(string(b), "not a tar") {
		t.Fatalf("PUT of a non-tar = %d %s, want 422", st, b)
	}
	if st, _ := call(t, "HEAD", u+sha(junk), e.adminKey, nil); st != 404 {
		t.Fatalf("a refused file is stored: HEAD = %d", st)
	}

	// Over the bound: the Content-Length alone is refused.
	addr := strings.TrimPrefix(e.srv.URL, "http://")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "PUT /v1/templates/files/%s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\nabc",
		wrong, addr, e.adminKey, model.MaxBuildFileBytes+1)
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(res.Body)
	if res.StatusCode != 413 || !strings.Contains(string(b), "512 MiB") {
		t.Fatalf("PUT over the bound = %d %s, want 413 naming 512 MiB", res.StatusCode, b)
	}
}

// builder is a stand-in for a worker's builder, on the real data-plane
// contract (workerapi.RouteBuild): it checks the server's build token,
// reads build.json and the files, streams events as NDJSON and, when the
// recipe succeeds, reports the template to the store as the worker's
// sync would — after it has sent "done", as the worker does.
type builder struct {
	srv *httptest.Server
	got chan workerapi.BuildRequest
	// files are the files of the last build, by hash.
	files chan map[string][]byte
}

func (e *env) builder(digest string) *builder {
	e.t.Helper()
	key, err := service.StoreSigningKey(e.st)(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	bl := &builder{got: make(chan workerapi.BuildRequest, 8), files: make(chan map[string][]byte, 8)}
	mux := http.NewServeMux()
	mux.HandleFunc(workerapi.RouteBuild, func(w http.ResponseWriter, r *http.Request) {
		c, err := token.Verify(token.WorkerKey(key, "w1"), strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "), time.Now())
		if err != nil || c.Scope != token.ScopeBuild {
			http.Error(w, "bad token", http.StatusUnauthorized)
			return
		}
		tr := tar.NewReader(r.Body)
		var req workerapi.BuildRequest
		files := map[string][]byte{}
		for {
			hd, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			b, _ := io.ReadAll(tr)
			if hd.Name == workerapi.BuildFileSpec {
				json.Unmarshal(b, &req)
			} else {
				files[strings.TrimPrefix(hd.Name, workerapi.BuildFilesDir)] = b
			}
		}
		if c.SandboxID != req.ID {
			http.Error(w, "token for another build", http.StatusUnauthorized)
			return
		}
		bl.got <- req
		bl.files <- files
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		send := func(ev model.BuildEvent) {
			enc.Encode(ev)
			w.(http.Flusher).Flush()
		}
		for i, st := range req.Spec.Steps {
			send(model.BuildEvent{Type: "step", Step: &model.BuildStepReport{Index: i, Text: st.Text}})
			if st.Kind == model.StepRun {
				if strings.HasPrefix(st.Args[0], "exit ") {
					send(model.BuildEvent{Type: "output", Stream: "stderr", Text: "failing"})
					send(model.BuildEvent{Type: "error", Text: fmt.Sprintf("step %d (%s): exit status %s", i+1, st.Text, st.Args[0][5:])})
					return
				}
				for _, line := range strings.Split(st.Args[0], ";") {
					send(model.BuildEvent{Type: "output", Stream: "stdout", Text: strings.TrimPrefix(strings.TrimSpace(line), "echo ")})
				}
			}
			send(model.BuildEvent{Type: "step", Step: &model.BuildStepReport{Index: i, Text: st.Text, Key: fmt.Sprint("key", i), DurationMS: 1}})
		}
		send(model.BuildEvent{Type: "done", Digest: digest})
		if err := e.st.PutTemplate(e.ctx, model.Template{Name: req.Spec.Name, Tag: req.Spec.Tag, Digest: digest, CreatedAt: time.Now()}); err != nil {
			e.t.Errorf("report the template: %v", err)
		}
	})
	bl.srv = httptest.NewServer(mux)
	e.t.Cleanup(bl.srv.Close)
	now := time.Now().UTC()
	if err := e.st.UpsertWorker(e.ctx, model.Worker{ID: "w1", DataPlaneURL: bl.srv.URL, InternalURL: bl.srv.URL, Runtimes: []model.RuntimeInfo{{Name: "gvisor", Caps: model.RuntimeCaps{Build: true}}},
		Templates: []string{baseDigest}, CapacityMiB: 8192, CapacityVCPUs: 8, LastHeartbeat: now, CreatedAt: now}); err != nil {
		e.t.Fatal(err)
	}
	return bl
}

func postBuild(t *testing.T, e *env, key string, spec any) (int, model.Build, string) {
	t.Helper()
	b, _ := json.Marshal(spec)
	st, body := call(t, "POST", e.srv.URL+"/v1/templates/builds", key, bytes.NewReader(b))
	var bd model.Build
	json.Unmarshal(body, &bd)
	return st, bd, string(body)
}

// follow reads a build's events with long polls until it is finished
// and no events are left.
func follow(t *testing.T, e *env, key, id string) ([]model.BuildEvent, model.BuildState) {
	t.Helper()
	var all []model.BuildEvent
	after := 0
	for range 200 {
		st, body := call(t, "GET", fmt.Sprintf("%s/v1/templates/builds/%s/events?after=%d&wait=30s", e.srv.URL, id, after), key, nil)
		var page apitypes.BuildEvents
		if st != 200 || json.Unmarshal(body, &page) != nil {
			t.Fatalf("events = %d %s", st, body)
		}
		all = append(all, page.Events...)
		if len(page.Events) > 0 {
			after = page.Events[len(page.Events)-1].Seq
		}
		if len(page.Events) == 0 && (page.State == model.BuildReady || page.State == model.BuildFailed) {
			return all, page.State
		}
	}
	t.Fatal("the build did not finish")
	return nil, ""
}

// TestBuildValidation: what a recipe must be, each refused with the
// status and a message that says what to fix.
func TestBuildValidation(t *testing.T) {
	e := newEnv(t)
	userKey, _ := e.orgKey("acme", false)
	body := tarOf(t, map[string]string{"a": "a"})
	if st, b := call(t, "PUT", e.srv.URL+"/v1/templates/files/"+sha(body), e.adminKey, bytes.NewReader(body)); st != 201 {
		t.Fatalf("upload = %d %s", st, b)
	}
	missing := strings.Repeat("a", 64)
	many := make([]model.BuildStep, model.MaxBuildSteps+1)
	for i := range many {
		many[i] = model.BuildStep{Kind: model.StepEnv, Args: []string{"A", "1"}}
	}
	for _, tc := range []struct {
		name   string
		key    string
		spec   any
		status int
		want   string
	}{
		{"unknown field", e.adminKey, map[string]any{"name": "x", "from": "base", "bogus": 1}, 400, "unknown field"},
		{"bad name", e.adminKey, model.BuildSpec{Name: "Bad Name", From: "base"}, 422, "template name"},
		{"bad tag", e.adminKey, model.BuildSpec{Name: "x", Tag: "-x", From: "base"}, 422, "template tag"},
		{"no from", e.adminKey, model.BuildSpec{Name: "x"}, 422, "from"},
		{"unknown from", e.adminKey, model.BuildSpec{Name: "x", From: "nope:1"}, 422, `nope:1`},
		{"missing files", e.adminKey, model.BuildSpec{Name: "x", From: "base", Steps: []model.BuildStep{
			{Kind: model.StepCopy, Args: []string{"/a"}, FilesHash: sha(body)},
			{Kind: model.StepCopy, Args: []string{"/b"}, FilesHash: missing}}}, 422, missing},
		{"another org's files", userKey, model.BuildSpec{Name: "x", From: "base", Steps: []model.BuildStep{
			{Kind: model.StepCopy, Args: []string{"/a"}, FilesHash: sha(body)}}}, 422, sha(body)},
		{"unknown kind", e.adminKey, model.BuildSpec{Name: "x", From: "base", Steps: []model.BuildStep{{Kind: "EXPOSE", Args: []string{"80"}}}}, 422, "EXPOSE"},
		{"too many steps", e.adminKey, model.BuildSpec{Name: "x", From: "base", Steps: many}, 422, "at most 256"},
		{"run without a command", e.adminKey, model.BuildSpec{Name: "x", From: "base", Steps: []model.BuildStep{{Kind: model.StepRun}}}, 422, "shell command"},
		{"odd env", e.adminKey, model.BuildSpec{Name: "x", From: "base", Steps: []model.BuildStep{{Kind: model.StepEnv, Args: []string{"A"}}}}, 422, "pairs"},
		{"base by a user", userKey, model.BuildSpec{Name: "base", From: "base"}, 403, "operators"},
		{"no worker", e.adminKey, model.BuildSpec{Name: "x", From: "base"}, 503, "no live worker"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, _, body := postBuild(t, e, tc.key, tc.spec)
			if st != tc.status || !strings.Contains(body, tc.want) {
				t.Fatalf("POST = %d %s, want %d containing %q", st, body, tc.status, tc.want)
			}
		})
	}
	if st, b := call(t, "GET", e.srv.URL+"/v1/templates/builds", e.adminKey, nil); st != 200 || string(b) != "{\"builds\":[]}\n" {
		t.Fatalf("refused builds were recorded: %d %s", st, b)
	}
}

// TestBuildRuns: a build goes to the worker that holds its parent with
// its files, the org's default network and a build-scoped token; its
// events are kept in order and followed by long polls; it is ready with
// the digest once the store has the template; another org sees none of
// it. A failing step makes the build failed with the worker's text.
func TestBuildRuns(t *testing.T) {
	e := newEnv(t)
	digest := "sha256:" + strings.Repeat("4", 64)
	bl := e.builder(digest)
	files := tarOf(t, map[string]string{"app.py": "print('hi')\n"})
	if st, b := call(t, "PUT", e.srv.URL+"/v1/templates/files/"+sha(files), e.adminKey, bytes.NewReader(files)); st != 201 {
		t.Fatalf("upload = %d %s", st, b)
	}
	spec := model.BuildSpec{Name: "app", Tag: "1", From: "base", StartCmd: "python3 -m http.server", Steps: []model.BuildStep{
		{Kind: model.StepRun, Args: []string{"echo one; echo two"}, Text: "RUN echo one; echo two"},
		{Kind: model.StepCopy, Args: []string{"/app/"}, FilesHash: sha(files), Text: "COPY . /app/"},
		{Kind: model.StepEnv, Args: []string{"PORT", "8000"}, Text: "ENV PORT=8000"},
	}}
	st, b, body := postBuild(t, e, e.adminKey, spec)
	if st != 202 || b.State != model.BuildBuilding || !strings.HasPrefix(b.ID, "bld-") || b.Worker != "w1" || b.Spec.Tag != "1" {
		t.Fatalf("POST = %d %s", st, body)
	}
	req := <-bl.got
	got := <-bl.files
	if req.ID != b.ID || req.FromDigest != baseDigest || req.Spec.Name != "app" || len(req.Spec.Steps) != 3 || req.Spec.StartCmd != spec.StartCmd {
		t.Fatalf("the worker got %+v", req)
	}
	if req.Network == nil || req.Network.Profile != model.DefaultNetworkProfile || len(req.Network.Policy) == 0 || req.Egress == nil || req.Egress.CACert == "" {
		t.Fatalf("the worker got network %+v egress %v, want the org's default profile %q with its CA", req.Network, req.Egress, model.DefaultNetworkProfile)
	}
	if len(got) != 1 || !bytes.Equal(got[sha(files)], files) {
		t.Fatalf("the worker got files %v, want the uploaded one", len(got))
	}
	evs, state := follow(t, e, e.adminKey, b.ID)
	if state != model.BuildReady {
		t.Fatalf("state = %s", state)
	}
	var kinds []string
	for i, ev := range evs {
		if ev.Seq != i+1 {
			t.Fatalf("event %d has seq %d: %+v", i, ev.Seq, evs)
		}
		kinds = append(kinds, ev.Type+":"+ev.Text)
	}
	want := "step: output:one output:two step: step: step: step: step: done:"
	if strings.Join(kinds, " ") != want {
		t.Fatalf("events = %q, want %q", strings.Join(kinds, " "), want)
	}
	st, gb := call(t, "GET", e.srv.URL+"/v1/templates/builds/"+b.ID, e.adminKey, nil)
	var done model.Build
	json.Unmarshal(gb, &done)
	if st != 200 || done.State != model.BuildReady || done.Digest != digest || done.FinishedAt == nil || len(done.Steps) != 3 || done.Steps[2].Key != "key2" {
		t.Fatalf("GET = %d %s", st, gb)
	}
	if tpl, err := e.st.GetTemplate(e.ctx, "app", "1"); err != nil || tpl.Digest != digest {
		t.Fatalf("the template after a ready build = %+v, %v", tpl, err)
	}
	// Events after the last: none, at once (the build is finished).
	if st, b := call(t, "GET", fmt.Sprintf("%s/v1/templates/builds/%s/events?after=%d&wait=30s", e.srv.URL, b.ID, len(evs)), e.adminKey, nil); st != 200 || !strings.Contains(string(b), `"events":[],"state":"ready"`) {
		t.Fatalf("events after the end = %d %s", st, b)
	}

	// Another org sees nothing.
	otherKey, _ := e.orgKey("other", false)
	for _, path := range []string{"/v1/templates/builds/" + b.ID, "/v1/templates/builds/" + b.ID + "/events"} {
		if st, b := call(t, "GET", e.srv.URL+path, otherKey, nil); st != 404 {
			t.Fatalf("GET %s by another org = %d %s, want 404", path, st, b)
		}
	}
	if st, b := call(t, "GET", e.srv.URL+"/v1/templates/builds", otherKey, nil); st != 200 || string(b) != "{\"builds\":[]}\n" {
		t.Fatalf("another org's list = %d %s", st, b)
	}
	// Nor may it build over the name (templates are installation-wide).
	if st, _, body := postBuild(t, e, otherKey, model.BuildSpec{Name: "app", Tag: "1", From: "base"}); st != 409 || !strings.Contains(body, "not built by org") {
		t.Fatalf("another org building over app:1 = %d %s, want 409", st, body)
	}

	// A failing step.
	st, fb, body := postBuild(t, e, e.adminKey, model.BuildSpec{Name: "broken", From: "base", Steps: []model.BuildStep{{Kind: model.StepRun, Args: []string{"exit 3"}, Text: "RUN exit 3"}}})
	if st != 202 {
		t.Fatalf("POST = %d %s", st, body)
	}
	<-bl.got
	<-bl.files
	evs, state = follow(t, e, e.adminKey, fb.ID)
	if state != model.BuildFailed || evs[len(evs)-1].Type != "error" {
		t.Fatalf("failing build: state %s, events %+v", state, evs)
	}
	_, gb = call(t, "GET", e.srv.URL+"/v1/templates/builds/"+fb.ID, e.adminKey, nil)
	var failed model.Build
	json.Unmarshal(gb, &failed)
	if failed.State != model.BuildFailed || !strings.Contains(failed.Error, "RUN exit 3") || !strings.Contains(failed.Error, "exit status 3") || failed.Digest != "" {
		t.Fatalf("failed build = %s", gb)
	}

	// The list: newest first.
	_, lb := call(t, "GET", e.srv.URL+"/v1/templates/builds?limit=10", e.adminKey, nil)
	var list apitypes.ListBuildsResponse
	json.Unmarshal(lb, &list)
	if len(list.Builds) != 2 || list.Builds[0].ID != fb.ID || list.Builds[1].ID != b.ID {
		t.Fatalf("list = %s", lb)
	}
	if st, _ := call(t, "GET", e.srv.URL+"/v1/templates/builds?limit=x", e.adminKey, nil); st != 400 {
		t.Fatalf("list with a bad limit = %d, want 400", st)
	}
	if st, _ := call(t, "GET", e.srv.URL+"/v1/templates/builds/"+b.ID+"/events?after=-1", e.adminKey, nil); st != 400 {
		t.Fatalf("events with a bad after = %d, want 400", st)
	}
	if st, _ := call(t, "GET", e.srv.URL+"/v1/templates/builds/"+url.PathEscape("bld-none"), e.adminKey, nil); st != 404 {
		t.Fatalf("a missing build = %d, want 404", st)
	}
}

// TestBuildPastDeadline: a build left building past its deadline (its
// server stopped) is failed when read, and when listed.
func TestBuildPastDeadline(t *testing.T) {
	e := newEnv(t)
	old := time.Now().UTC().Add(-model.DefaultOperationDeadline - time.Minute)
	for _, id := range []string{"bld-stale1", "bld-stale2"} {
		if err := e.st.CreateBuild(e.ctx, model.Build{ID: id, OrgID: service.DefaultOrgID, State: model.BuildBuilding, Spec: model.BuildSpec{Name: "x", Tag: "latest", From: "base"}, CreatedAt: old}); err != nil {
			t.Fatal(err)
		}
	}
	_, b := call(t, "GET", e.srv.URL+"/v1/templates/builds/bld-stale1", e.adminKey, nil)
	var got model.Build
	json.Unmarshal(b, &got)
	if got.State != model.BuildFailed || !strings.Contains(got.Error, "deadline") || got.FinishedAt == nil {
		t.Fatalf("a stale build read = %s", b)
	}
	_, b = call(t, "GET", e.srv.URL+"/v1/templates/builds", e.adminKey, nil)
	var list apitypes.ListBuildsResponse
	json.Unmarshal(b, &list)
	for _, x := range list.Builds {
		if x.State != model.BuildFailed {
			t.Fatalf("a stale build listed = %+v", x)
		}
	}
	if stored, _ := e.st.GetBuild(e.ctx, "bld-stale2"); stored.State != model.BuildFailed {
		t.Fatalf("the stale build was not stored as failed: %+v", stored)
	}
}
