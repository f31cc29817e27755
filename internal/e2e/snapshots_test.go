package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/snapshot"
	"github.com/airlock/airlock/internal/snapshot/snapshottest"
)

// TestCheckpointRollbackForkExport drives the snapshot features end to end
// against the server and worker processes: the feature gate, checkpoints of
// a sandbox with a detached counter, rollback (files and the process go
// back), forks (independent copies that continue the same process), export
// and import (a new sandbox from the archive; corrupt archives refused
// with nothing created), and deletion removing the checkpoints.
func TestCheckpointRollbackForkExport(t *testing.T) {
	st := need(t)
	c := st.client()
	ctx := ctxT(t, 15*time.Minute)
	setFeatures := func(fs ...string) {
		t.Helper()
		if fs == nil {
			fs = []string{}
		}
		if _, err := c.UpdateOrg(ctx, service.DefaultOrgID, client.UpdateOrgRequest{Features: &fs}); err != nil {
			t.Fatalf("set feature gates %v: %v", fs, err)
		}
	}
	setGate := func(on bool) {
		t.Helper()
		if on {
			setFeatures(model.FeatureSnapshots)
		} else {
			setFeatures()
		}
	}
	setGate(false)
	t.Cleanup(func() { setGate(false) })

	sb := newSandbox(t, c, client.CreateSandboxRequest{})
	cmd, err := c.CreateCommand(ctx, sb.ID, client.CreateCommandRequest{Argv: []string{"sh", "-c", counterScript}})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := client.AttachCommand(ctx, cmd.AttachURL, cmd.Token, 0)
	if err != nil {
		t.Fatal(err)
	}
	if kind, _, err := sess.Next(); err != nil || kind != agentapi.FrameStarted {
		t.Fatalf("first frame %d: %v", kind, err)
	}
	sess.Close()
	fc, err := c.Files(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	pid := counterAfter(t, ctx, fc, 2)[0].pid
	if r := sh(t, c, sb.ID, "echo one > state.txt"); r.exit.ExitCode != 0 {
		t.Fatalf("write state: %+v", r)
	}

	// The gate: 403 naming it, for every endpoint.
	_, err = c.CreateCheckpoint(ctx, sb.ID, "c1")
	wantStatus(t, "checkpoint without the gate", err, http.StatusForbidden, `"snapshots"`)
	_, err = c.ListCheckpoints(ctx, sb.ID)
	wantStatus(t, "list without the gate", err, http.StatusForbidden, `"snapshots"`)
	_, err = c.ForkSandbox(ctx, client.CreateSandboxRequest{FromCheckpoint: &apitypes.CheckpointRef{SandboxID: sb.ID, Checkpoint: "c1"}}, "")
	wantStatus(t, "fork without the gate", err, http.StatusForbidden, `"snapshots"`)
	setGate(true)

	// Bad names, then a checkpoint.
	_, err = c.CreateCheckpoint(ctx, sb.ID, "../x")
	wantStatus(t, "invalid name", err, http.StatusUnprocessableEntity, "invalid")
	t0 := time.Now()
	op, err := c.CreateCheckpoint(ctx, sb.ID, "c1")
	if err != nil {
		t.Fatal(err)
	}
	if op.Kind != model.OpCheckpoint {
		t.Fatalf("checkpoint operation kind %s", op.Kind)
	}
	if _, err := c.WaitOperation(ctx, op.ID); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	t.Logf("checkpoint c1: %v", time.Since(t0))
	_, err = c.CreateCheckpoint(ctx, sb.ID, "c1")
	wantStatus(t, "duplicate name", err, http.StatusConflict, "already has a checkpoint")
	cps, err := c.ListCheckpoints(ctx, sb.ID)
	if err != nil || len(cps) != 1 || cps[0].Name != "c1" || cps[0].Bytes <= 0 || cps[0].SnapshotID == "" {
		t.Fatalf("checkpoints = %+v, %v; want c1 with bytes", cps, err)
	}
	// The sandbox kept running: same counter, still counting.
	n := len(readCounter(t, ctx, fc))
	ls := counterAfter(t, ctx, fc, n)
	if ls[len(ls)-1].pid != pid {
		t.Fatalf("counter PID %d after checkpoint, want %d", ls[len(ls)-1].pid, pid)
	}

	// Change things, then roll back.
	if r := sh(t, c, sb.ID, "echo two > state.txt; echo new > extra.txt; kill "+strconv.Itoa(pid)); r.exit.ExitCode != 0 {
		t.Fatalf("change state: %+v", r)
	}
	op, err = c.RollbackSandbox(ctx, sb.ID, "c1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitOperation(ctx, op.ID); err != nil {
		t.Fatalf("rollback: %v", err)
	}
	if r := sh(t, c, sb.ID, "cat state.txt; test -e extra.txt && echo extra-exists; true"); strings.TrimSpace(r.stdout) != "one" {
		t.Fatalf("after rollback: %q, want the checkpoint's files only", r.stdout)
	}
	n = len(readCounter(t, ctx, fc))
	ls = counterAfter(t, ctx, fc, n)
	if last := ls[len(ls)-1]; last.pid != pid || time.Since(last.at) > 5*time.Second {
		t.Fatalf("after rollback the counter is %+v, want PID %d counting again", last, pid)
	}
	_, err = c.RollbackSandbox(ctx, sb.ID, "nope")
	wantStatus(t, "rollback to a missing checkpoint", err, http.StatusNotFound, "no checkpoint")

	// Forks: independent copies that continue the checkpoint's processes.
	forks, err := c.ForkSandbox(ctx, client.CreateSandboxRequest{
		FromCheckpoint: &apitypes.CheckpointRef{SandboxID: sb.ID, Checkpoint: "c1"}, Count: 2,
		Metadata: map[string]string{"fork": "yes"},
	}, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(forks) != 2 {
		t.Fatalf("%d forks, want 2", len(forks))
	}
	for _, f := range forks {
		id := f.Sandbox.ID
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if op, err := c.DeleteSandbox(ctx, id); err == nil {
				c.WaitOperation(ctx, op.ID)
			}
		})
		if f.Operation.Kind != model.OpFork {
			t.Errorf("fork operation kind %s", f.Operation.Kind)
		}
		if _, err := c.WaitOperation(ctx, f.Operation.ID); err != nil {
			t.Fatalf("fork %s: %v", id, err)
		}
		got, _ := c.GetSandbox(ctx, id)
		if got.WorkerID != sb.WorkerID || got.Metadata["fork"] != "yes" || got.Source == nil {
			t.Errorf("fork %s: worker %s (source's %s), metadata %v, source %+v", id, got.WorkerID, sb.WorkerID, got.Metadata, got.Source)
		}
	}
	f0, f1 := forks[0].Sandbox.ID, forks[1].Sandbox.ID
	if r := sh(t, c, f0, "cat state.txt; hostname; echo fork0 > state.txt"); r.stdout != "one\n"+f0+"\n" {
		t.Fatalf("fork 0 sees %q, want the checkpoint's file and its own hostname", r.stdout)
	}
	if r := sh(t, c, f1, "cat state.txt"); strings.TrimSpace(r.stdout) != "one" {
		t.Fatalf("fork 1 sees %q after fork 0 wrote: forks are not independent", r.stdout)
	}
	ffc, err := c.Files(ctx, f1)
	if err != nil {
		t.Fatal(err)
	}
	n = len(readCounter(t, ctx, ffc))
	if ls := counterAfter(t, ctx, ffc, n); ls[len(ls)-1].pid != pid {
		t.Fatalf("fork's counter PID %d, want the checkpoint's %d", ls[len(ls)-1].pid, pid)
	}
	if r := sh(t, c, sb.ID, "cat state.txt"); strings.TrimSpace(r.stdout) != "one" {
		t.Fatalf("source sees %q after its forks wrote", r.stdout)
	}

	// Export, then import into a new sandbox.
	var archive bytes.Buffer
	nb, err := c.ExportCheckpoint(ctx, sb.ID, "c1", &archive)
	if err != nil {
		t.Fatal(err)
	}
	if nb != int64(archive.Len()) || nb < cps[0].Bytes {
		t.Fatalf("export: %d bytes reported, %d read, checkpoint has %d", nb, archive.Len(), cps[0].Bytes)
	}
	_, err = c.ExportCheckpoint(ctx, sb.ID, "nope", io.Discard)
	wantStatus(t, "export of a missing checkpoint", err, http.StatusNotFound, "no checkpoint")

	// The archive is signed by this installation: manifest.json, then
	// manifest.json.sig, then the artifacts.
	if names := tarNames(t, archive.Bytes()); len(names) < 3 || names[0] != snapshot.ManifestFile || names[1] != snapshot.SignatureFile {
		t.Fatalf("exported archive entries %v, want %s, %s, artifacts", names, snapshot.ManifestFile, snapshot.SignatureFile)
	}

	before := countSandboxes(t, ctx, c)
	// Attacks on where an archive comes from (security review M5): the
	// artifact list changed and re-signed with another key, the signature
	// stripped; a manifest that is not first; a meta-header flood (M1).
	tamper := func(m *snapshot.Manifest) { m.Artifacts[0].SHA256 = strings.Repeat("ab", 32) }
	foreign := rewriteArchive(t, archive.Bytes(), tamper, []byte("another installation's key......"))
	unsigned := rewriteArchive(t, archive.Bytes(), nil, nil)
	_, _, err = c.ImportSandbox(ctx, client.CreateSandboxRequest{}, bytes.NewReader(foreign))
	wantStatus(t, "tampered archive signed with another key", err, http.StatusUnprocessableEntity, "not exported by this installation or was modified")
	_, _, err = c.ImportSandbox(ctx, client.CreateSandboxRequest{}, bytes.NewReader(unsigned))
	wantStatus(t, "unsigned archive", err, http.StatusUnprocessableEntity, `"unsigned_imports" feature gate`)
	_, _, err = c.ImportSandbox(ctx, client.CreateSandboxRequest{}, bytes.NewReader(rewriteArchive(t, archive.Bytes(), func(m *snapshot.Manifest) { m.Name = "../" + strings.Repeat("x", 4096) }, nil)))
	wantStatus(t, "unsigned archive with a bad name", err, http.StatusUnprocessableEntity, `"unsigned_imports" feature gate`)
	_, _, err = c.ImportSandbox(ctx, client.CreateSandboxRequest{}, io.MultiReader(bytes.NewReader(tarNoEnd(t, "pages.img", []byte("x"))), bytes.NewReader(archive.Bytes())))
	wantStatus(t, "manifest not first", err, http.StatusUnprocessableEntity, `first entry is "pages.img"`)
	flood := &snapshottest.MetaFlood{}
	_, _, err = c.ImportSandbox(ctx, client.CreateSandboxRequest{}, io.LimitReader(flood, 256<<20))
	wantStatus(t, "meta-header flood", err, http.StatusUnprocessableEntity, "first entries take more than")
	if flood.N >= 256<<20 {
		t.Fatalf("the server read the whole meta-header flood (%d bytes) before refusing it", flood.N)
	}
	bad := bytes.Clone(archive.Bytes())
	bad[len(bad)/2] ^= 0xff // inside an artifact: its sha256 no longer matches
	_, _, err = c.ImportSandbox(ctx, client.CreateSandboxRequest{}, bytes.NewReader(bad))
	wantStatus(t, "corrupt archive", err, http.StatusUnprocessableEntity, "")
	_, _, err = c.ImportSandbox(ctx, client.CreateSandboxRequest{}, bytes.NewReader(archive.Bytes()[:archive.Len()/3]))
	wantStatus(t, "truncated archive", err, http.StatusUnprocessableEntity, "")
	_, _, err = c.ImportSandbox(ctx, client.CreateSandboxRequest{}, strings.NewReader("not a tar at all"))
	wantStatus(t, "not an archive", err, http.StatusUnprocessableEntity, "")
	if after := countSandboxes(t, ctx, c); after != before {
		t.Fatalf("refused imports created sandboxes: %d before, %d after", before, after)
	}

	isb, iop, err := c.ImportSandbox(ctx, client.CreateSandboxRequest{Metadata: map[string]string{"imported": "1"}}, bytes.NewReader(archive.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if op, err := c.DeleteSandbox(ctx, isb.ID); err == nil {
			c.WaitOperation(ctx, op.ID)
		}
	})
	if _, err := c.WaitOperation(ctx, iop.ID); err != nil {
		t.Fatalf("import: %v", err)
	}
	if r := sh(t, c, isb.ID, "cat state.txt"); strings.TrimSpace(r.stdout) != "one" {
		t.Fatalf("imported sandbox sees %q", r.stdout)
	}
	icps, err := c.ListCheckpoints(ctx, isb.ID)
	if err != nil || len(icps) != 1 || icps[0].Name != "c1" {
		t.Fatalf("imported sandbox's checkpoints = %+v, %v", icps, err)
	}

	// An org the operator trusts with unsigned_imports imports the
	// unsigned archive, but still not a tampered or foreign-signed one, nor
	// one whose checkpoint name breaks the naming rule.
	setFeatures(model.FeatureSnapshots, model.FeatureUnsignedImports)
	_, _, err = c.ImportSandbox(ctx, client.CreateSandboxRequest{}, bytes.NewReader(foreign))
	wantStatus(t, "trusted org, tampered archive signed with another key", err, http.StatusUnprocessableEntity, "not exported by this installation or was modified")
	_, _, err = c.ImportSandbox(ctx, client.CreateSandboxRequest{}, bytes.NewReader(rewriteArchive(t, archive.Bytes(), func(m *snapshot.Manifest) { m.Name = "../" + strings.Repeat("x", 4096) }, nil)))
	wantStatus(t, "trusted org, bad checkpoint name", err, http.StatusUnprocessableEntity, "checkpoint name")
	_, _, err = c.ImportSandbox(ctx, client.CreateSandboxRequest{}, bytes.NewReader(rewriteArchive(t, archive.Bytes(), func(m *snapshot.Manifest) { m.Template = "a/b" }, nil)))
	wantStatus(t, "trusted org, bad template reference", err, http.StatusUnprocessableEntity, "template")
	usb, uop, err := c.ImportSandbox(ctx, client.CreateSandboxRequest{}, bytes.NewReader(unsigned))
	if err != nil {
		t.Fatalf("trusted org, unsigned archive: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if op, err := c.DeleteSandbox(ctx, usb.ID); err == nil {
			c.WaitOperation(ctx, op.ID)
		}
	})
	if _, err := c.WaitOperation(ctx, uop.ID); err != nil {
		t.Fatalf("import of the unsigned archive: %v", err)
	}
	if r := sh(t, c, usb.ID, "cat state.txt"); strings.TrimSpace(r.stdout) != "one" {
		t.Fatalf("sandbox imported from the unsigned archive sees %q", r.stdout)
	}
	setFeatures(model.FeatureSnapshots)

	// Deleting one checkpoint takes it off the record and off the worker.
	op, err = c.CreateCheckpoint(ctx, sb.ID, "c-rm")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitOperation(ctx, op.ID); err != nil {
		t.Fatalf("checkpoint c-rm: %v", err)
	}
	var rm model.Checkpoint
	if cps, err := c.ListCheckpoints(ctx, sb.ID); err == nil {
		for _, cp := range cps {
			if cp.Name == "c-rm" {
				rm = cp
			}
		}
	}
	rmDir := filepath.Join(st.workerDir, "snapshots", sb.ID, rm.SnapshotID)
	if _, err := os.Stat(rmDir); rm.SnapshotID == "" || err != nil {
		t.Fatalf("checkpoint c-rm (%+v) on the worker: %v", rm, err)
	}
	if err := c.DeleteCheckpoint(ctx, sb.ID, "c-rm"); err != nil {
		t.Fatalf("delete checkpoint c-rm: %v", err)
	}
	if cps, err := c.ListCheckpoints(ctx, sb.ID); err != nil || slices.ContainsFunc(cps, func(cp model.Checkpoint) bool { return cp.Name == "c-rm" }) {
		t.Fatalf("checkpoints after deleting c-rm: %+v, %v", cps, err)
	}
	if _, err := os.Stat(rmDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("deleted checkpoint's snapshot is still on the worker: %v", err)
	}
	wantStatus(t, "delete a deleted checkpoint", c.DeleteCheckpoint(ctx, sb.ID, "c-rm"), http.StatusNotFound, "no checkpoint")

	// Deleting the source removes its checkpoints; its forks run on.
	op, err = c.DeleteSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitOperation(ctx, op.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(st.workerDir, "snapshots", sb.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("snapshots of the deleted sandbox are still on the worker: %v", err)
	}
	if r := sh(t, c, f0, "cat state.txt"); strings.TrimSpace(r.stdout) != "fork0" {
		t.Fatalf("fork after its source was deleted: %q", r.stdout)
	}
}

// wantStatus fails unless err is an API error with status and a message
// containing substr.
func wantStatus(t *testing.T, what string, err error, status int, substr string) {
	t.Helper()
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != status || !strings.Contains(ae.Message, substr) {
		t.Fatalf("%s: got %v, want HTTP %d with %q", what, err, status, substr)
	}
}

func countSandboxes(t *testing.T, ctx context.Context, c *client.Client) int {
	t.Helper()
	page, err := c.ListSandboxes(ctx, client.SandboxFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return len(page.Sandboxes)
}

// tarNames lists the entries of a tar archive.
func tarNames(t *testing.T, archive []byte) []string {
	t.Helper()
	var names []string
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatalf("read archive: %v", err)
		}
		names = append(names, h.Name)
	}
}

// rewriteArchive rewrites an exported archive: its manifest changed by edit
// (nil: unchanged), signed with key (nil: no signature entry), the
// artifacts as they were.
func rewriteArchive(t *testing.T, archive []byte, edit func(*snapshot.Manifest), key []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	tr := tar.NewReader(bytes.NewReader(archive))
	for i := 0; ; i++ {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("read archive: %v", err)
		}
		switch {
		case h.Name == snapshot.SignatureFile:
			continue
		case h.Name == snapshot.ManifestFile && i == 0:
			data, _ := io.ReadAll(tr)
			if edit != nil {
				var m snapshot.Manifest
				if err := json.Unmarshal(data, &m); err != nil {
					t.Fatal(err)
				}
				edit(&m)
				data, _ = json.Marshal(m)
			}
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: snapshot.ManifestFile, Size: int64(len(data)), Mode: 0o600})
			tw.Write(data)
			if key != nil {
				sig := snapshot.Sign(key, data)
				tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: snapshot.SignatureFile, Size: int64(len(sig)), Mode: 0o600})
				tw.Write(sig)
			}
			continue
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	return out.Bytes()
}

// tarNoEnd is a tar stream of one regular file, without the end marker.
func tarNoEnd(t *testing.T, name string, body []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: int64(len(body)), Mode: 0o600})
	tw.Write(body)
	tw.Flush()
	return buf.Bytes()
}
