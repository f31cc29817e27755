package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
)

// TestConformanceGo runs the shared SDK scenario (sdk/conformance/
// scenario.json, whose README defines it) through the public Go SDK,
// package client, against the e2e stack. The Python and TypeScript SDKs
// run the same file in their own suites.
func TestConformanceGo(t *testing.T) {
	s := need(t)
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	sc, err := loadScenario(filepath.Join(root, "sdk", "conformance", "scenario.json"))
	if err != nil {
		t.Fatal(err)
	}
	r := &conformance{c: s.client(), vars: map[string]string{"${run}": runID(), "${sdk}": "go"}}
	defer r.cleanup()
	for i, st := range sc.Steps {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		err := r.step(ctx, st)
		cancel()
		if err != nil {
			t.Fatalf("step %d %q (%s): %v", i+1, st.Name, st.Do, err)
		}
	}
	t.Logf("%d conformance steps passed (run %s)", len(sc.Steps), r.vars["${run}"])
}

type scenario struct {
	Version     int            `json:"version"`
	Description string         `json:"description"`
	Steps       []scenarioStep `json:"steps"`
}

type scenarioStep struct {
	Name   string         `json:"name"`
	Do     string         `json:"do"`
	Args   map[string]any `json:"args"`
	Expect map[string]any `json:"expect"`
}

func loadScenario(path string) (scenario, error) {
	var sc scenario
	b, err := os.ReadFile(path)
	if err != nil {
		return sc, err
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&sc); err != nil {
		return sc, fmt.Errorf("%s: %w", path, err)
	}
	if sc.Version != 1 || len(sc.Steps) == 0 {
		return sc, fmt.Errorf("%s: version %d with %d steps; this runner knows version 1", path, sc.Version, len(sc.Steps))
	}
	return sc, nil
}

func runID() string {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 10)
	rand.Read(b)
	for i := range b {
		b[i] = letters[int(b[i])%len(letters)]
	}
	return string(b)
}

// conformance runs scenario steps; sandbox is the current sandbox.
type conformance struct {
	c       *client.Client
	vars    map[string]string
	sandbox string
	created []string
}

func (r *conformance) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, id := range r.created {
		if op, err := r.c.DeleteSandbox(ctx, id); err == nil {
			r.c.WaitOperation(ctx, op.ID)
		}
	}
}

// subst replaces the scenario's variables in every string of v.
func (r *conformance) subst(v any) any {
	switch v := v.(type) {
	case string:
		vars := maps(r.vars)
		vars["${sandbox}"] = r.sandbox
		for k, val := range vars {
			v = strings.ReplaceAll(v, k, val)
		}
		return v
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			out[k] = r.subst(x)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = r.subst(x)
		}
		return out
	}
	return v
}

func maps(m map[string]string) map[string]string {
	out := make(map[string]string, len(m)+1)
	for k, v := range m {
		out[k] = v
	}
	return out
}

// allowed is each step's expect keys (besides error).
var allowedExpect = map[string][]string{
	"create": {"state", "template", "metadata"}, "get": {"state"}, "list": {"ids"},
	"run":        {"exit_code", "stdout", "stderr", "timed_out"},
	"write_file": {"size"}, "read_file": {"data"}, "list_files": {"names"},
	"stat": {"type", "size", "name"}, "mkdir": {"type"}, "move": {"name"}, "remove": {},
	"pause": {"state"}, "resume": {"state"}, "suspend": {"state"}, "wake": {"state"}, "delete": {"state"},
}

func (r *conformance) step(ctx context.Context, st scenarioStep) error {
	allowed, ok := allowedExpect[st.Do]
	if !ok {
		return fmt.Errorf("unknown step %q", st.Do)
	}
	args, _ := r.subst(st.Args).(map[string]any)
	expect, _ := r.subst(st.Expect).(map[string]any)
	for k := range expect {
		if k != "error" && !slices.Contains(allowed, k) {
			return fmt.Errorf("expect key %q is not one %s checks (%v)", k, st.Do, allowed)
		}
	}
	got, err := r.call(ctx, st.Do, args)
	if want, ok := expect["error"].(string); ok {
		if err == nil {
			return fmt.Errorf("succeeded (%v), want a %s error", got, want)
		}
		if class := errorClass(err); class != want {
			return fmt.Errorf("error %v is of class %q, want %q", err, class, want)
		}
		return nil
	}
	if err != nil {
		return err
	}
	for k, want := range expect {
		have, ok := got[k]
		if !ok {
			return fmt.Errorf("the runner produced no %q to check", k)
		}
		if k == "metadata" { // each expected pair present
			hm, _ := have.(map[string]string)
			for mk, mv := range want.(map[string]any) {
				if hm[mk] != mv {
					return fmt.Errorf("metadata %s = %q, want %q (all: %v)", mk, hm[mk], mv, hm)
				}
			}
			continue
		}
		if !sameJSON(have, want) {
			return fmt.Errorf("%s = %#v, want %#v", k, have, want)
		}
	}
	return nil
}

// sameJSON compares a Go value with a decoded JSON one.
func sameJSON(have, want any) bool {
	b, err := json.Marshal(have)
	if err != nil {
		return false
	}
	var h any
	json.Unmarshal(b, &h)
	if want == nil {
		return h == nil
	}
	if ws, ok := want.([]any); ok && len(ws) == 0 {
		hs, ok := h.([]any)
		return h == nil || (ok && len(hs) == 0)
	}
	return reflect.DeepEqual(h, want)
}

func errorClass(err error) string {
	switch {
	case errors.Is(err, client.ErrNotFound):
		return "not_found"
	case errors.Is(err, client.ErrConflict):
		return "conflict"
	case errors.Is(err, client.ErrInvalid):
		return "invalid"
	case errors.Is(err, client.ErrQuotaExceeded):
		return "quota_exceeded"
	}
	return "other"
}

func str(args map[string]any, k string) string { s, _ := args[k].(string); return s }

func strMap(args map[string]any, k string) map[string]string {
	m, _ := args[k].(map[string]any)
	if m == nil {
		return nil
	}
	out := map[string]string{}
	for k, v := range m {
		out[k] = fmt.Sprint(v)
	}
	return out
}

func (r *conformance) target(args map[string]any) string {
	if id := str(args, "id"); id != "" {
		return id
	}
	return r.sandbox
}

func (r *conformance) call(ctx context.Context, do string, args map[string]any) (map[string]any, error) {
	c := r.c
	switch do {
	case "create":
		sb, op, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{
			Template: str(args, "template"), Metadata: strMap(args, "metadata"), Env: strMap(args, "env")}, "")
		if err != nil {
			return nil, err
		}
		r.sandbox = sb.ID
		r.created = append(r.created, sb.ID)
		if _, err := c.WaitOperation(ctx, op.ID); err != nil {
			return nil, err
		}
		if sb, err = c.GetSandbox(ctx, sb.ID); err != nil {
			return nil, err
		}
		return map[string]any{"state": sb.State, "template": sb.Template, "metadata": sb.Metadata}, nil
	case "get":
		sb, err := c.GetSandbox(ctx, r.target(args))
		if err != nil {
			return nil, err
		}
		return map[string]any{"state": sb.State}, nil
	case "list":
		ids := []string{}
		f := client.SandboxFilter{Metadata: strMap(args, "metadata")}
		for {
			page, err := c.ListSandboxes(ctx, f)
			if err != nil {
				return nil, err
			}
			for _, sb := range page.Sandboxes {
				ids = append(ids, sb.ID)
			}
			if f.Cursor = page.NextCursor; f.Cursor == "" {
				break
			}
		}
		return map[string]any{"ids": ids}, nil
	case "run":
		req := client.CreateCommandRequest{Cmd: str(args, "cmd"), Env: strMap(args, "env"), Cwd: str(args, "cwd")}
		if a, ok := args["argv"].([]any); ok {
			for _, x := range a {
				req.Argv = append(req.Argv, fmt.Sprint(x))
			}
		}
		if n, ok := args["timeout_s"].(float64); ok {
			req.TimeoutS = int(n)
		}
		var stdin io.Reader
		if s, ok := args["stdin"].(string); ok {
			req.Stdin, stdin = true, strings.NewReader(s)
		}
		cmd, err := c.CreateCommand(ctx, r.target(args), req)
		if err != nil {
			return nil, err
		}
		var out, errb bytes.Buffer
		exit, err := client.RunCommand(ctx, cmd.AttachURL, cmd.Token, stdin, &out, &errb)
		if err != nil {
			return nil, err
		}
		return map[string]any{"exit_code": exit.ExitCode, "stdout": out.String(), "stderr": errb.String(), "timed_out": exit.TimedOut}, nil
	case "write_file", "read_file", "list_files", "stat", "mkdir", "move", "remove":
		f, err := c.Files(ctx, r.target(args))
		if err != nil {
			return nil, err
		}
		return filesStep(ctx, f, do, args)
	case "pause", "resume", "suspend", "wake", "delete":
		call := map[string]func(context.Context, string) (client.Operation, error){
			"pause": c.PauseSandbox, "resume": c.ResumeSandbox, "suspend": c.SuspendSandbox,
			"wake": c.WakeSandbox, "delete": c.DeleteSandbox,
		}[do]
		id := r.target(args)
		op, err := call(ctx, id)
		if err != nil {
			return nil, err
		}
		if _, err := c.WaitOperation(ctx, op.ID); err != nil {
			return nil, err
		}
		sb, err := c.GetSandbox(ctx, id)
		if err != nil {
			return nil, err
		}
		return map[string]any{"state": sb.State}, nil
	}
	return nil, fmt.Errorf("unknown step %q", do)
}

func filesStep(ctx context.Context, f *client.FilesClient, do string, args map[string]any) (map[string]any, error) {
	info := func(fi client.FileInfo, err error) (map[string]any, error) {
		if err != nil {
			return nil, err
		}
		return map[string]any{"type": fi.Type, "size": fi.Size, "name": fi.Name}, nil
	}
	path := str(args, "path")
	switch do {
	case "write_file":
		return info(f.Write(ctx, path, strings.NewReader(str(args, "data")), "", ""))
	case "read_file":
		rc, err := f.Read(ctx, path)
		if err != nil {
			return nil, err
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		if err != nil {
			return nil, err
		}
		return map[string]any{"data": string(b)}, nil
	case "list_files":
		entries, err := f.List(ctx, path)
		if err != nil {
			return nil, err
		}
		names := []string{}
		for _, e := range entries {
			names = append(names, e.Name)
		}
		if !sort.StringsAreSorted(names) {
			return nil, fmt.Errorf("entries %v are not sorted by name", names)
		}
		return map[string]any{"names": names}, nil
	case "stat":
		return info(f.Stat(ctx, path))
	case "mkdir":
		return info(f.Mkdir(ctx, path, "", ""))
	case "move":
		return info(f.Move(ctx, str(args, "from"), str(args, "to")))
	case "remove":
		recursive, _ := args["recursive"].(bool)
		return map[string]any{}, f.Remove(ctx, path, recursive)
	}
	return nil, fmt.Errorf("unknown files step %q", do)
}
