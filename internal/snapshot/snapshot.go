// Package snapshot is the worker's durable snapshot store: a directory tree
// holding, per sandbox, the artifacts a runtime wrote for a suspend,
// checkpoint or template snapshot, plus a manifest with every artifact's size
// and sha256.
//
// Layout under the root (the worker uses <data-dir>/snapshots):
//
//	<sandbox-id>/<snapshot-id>/manifest.json   committed snapshot
//	<sandbox-id>/<snapshot-id>/<artifacts...>
//	<sandbox-id>/.pending-<snapshot-id>/       being written (Begin)
//	.deleting-*, <sandbox-id>/.deleting-*      being removed
//
// A snapshot exists only once Commit has fsynced and hashed every artifact,
// written manifest.json (temp file, fsync, rename, fsync dir) and renamed the
// pending directory to its id; a crash at any earlier point leaves a dot
// directory that Get and List ignore and GC removes.
package snapshot

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/airlock/airlock/internal/model"
)

// Kinds of snapshot.
const (
	KindSuspend    = "suspend"
	KindCheckpoint = "checkpoint"
	KindTemplate   = "template"
)

// ManifestFile is the name of the manifest in a snapshot directory (and the
// first entry of an exported tar stream).
const ManifestFile = "manifest.json"

// IDPrefix starts every snapshot id.
const IDPrefix = "snap-"

var (
	// ErrNotFound: no committed snapshot with that id (absent or pending).
	ErrNotFound = fmt.Errorf("snapshot not found: %w", model.ErrNotFound)
	// ErrCorrupt: a committed snapshot failed a check (missing or
	// truncated artifact, unreadable manifest, checksum mismatch).
	ErrCorrupt = fmt.Errorf("snapshot is corrupt: %w", model.ErrConflict)
)

// Meta is what the caller says about a snapshot at Commit.
type Meta struct {
	Name    string // checkpoint name, "" for suspend
	Runtime string // driver that wrote the artifacts ("gvisor")
	Kind    string // KindSuspend, KindCheckpoint or KindTemplate
	// What the snapshot needs to be restored elsewhere (export/import): the
	// template it was taken on and the sandbox's resources.
	Template       string
	TemplateDigest string
	VCPUs          int
	MemoryMiB      int
}

// Manifest describes one committed snapshot.
type Manifest struct {
	ID        string     `json:"id"`
	SandboxID string     `json:"sandbox_id"`
	Name      string     `json:"name,omitempty"`
	Runtime   string     `json:"runtime"`
	Kind      string     `json:"kind"`
	CreatedAt time.Time  `json:"created_at"`
	Bytes     int64      `json:"bytes"` // sum of artifact sizes
	Artifacts []Artifact `json:"artifacts"`
	// Template, TemplateDigest, VCPUs and MemoryMiB: see Meta.
	Template       string `json:"template,omitempty"`
	TemplateDigest string `json:"template_digest,omitempty"`
	VCPUs          int    `json:"vcpus,omitempty"`
	MemoryMiB      int    `json:"memory_mib,omitempty"`
}

// Artifact is one file of a snapshot.
type Artifact struct {
	Path   string `json:"path"` // slash-separated, relative to the snapshot dir
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"` // lowercase hex
}

// DefaultMaxImportBytes bounds the artifacts of one imported snapshot.
const DefaultMaxImportBytes int64 = 64 << 30

// Bounds on an imported manifest.
const (
	maxManifestBytes = 1 << 20
	maxArtifacts     = 10000
	maxPathLen       = 1024
)

// Store is a snapshot store rooted at one directory.
type Store struct {
	root     string
	maxBytes int64
}

// Open returns the store rooted at dir, creating dir if needed.
func Open(dir string) (*Store, error) {
	if dir == "" {
		return nil, fmt.Errorf("snapshot: open: empty directory: %w", model.ErrInvalid)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("snapshot: open %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("snapshot: open %s: %w", dir, err)
	}
	return &Store{root: abs, maxBytes: DefaultMaxImportBytes}, nil
}

// SetMaxImportBytes changes the bound on the total artifact size Import
// accepts (DefaultMaxImportBytes by default).
func (s *Store) SetMaxImportBytes(n int64) { s.maxBytes = n }

// Dir returns the root directory.
func (s *Store) Dir() string { return s.root }

// validName accepts ids usable as one path element: [A-Za-z0-9._-], not
// starting with a dot, at most 128 bytes.
func validName(kind, id string) error {
	ok := id != "" && len(id) <= 128 && id[0] != '.'
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			ok = false
		}
	}
	if !ok {
		return fmt.Errorf("snapshot: invalid %s %q: %w", kind, id, model.ErrInvalid)
	}
	return nil
}

func validKind(kind string) error {
	switch kind {
	case KindSuspend, KindCheckpoint, KindTemplate:
		return nil
	}
	return fmt.Errorf("snapshot: unknown kind %q (want suspend, checkpoint or template): %w", kind, model.ErrInvalid)
}

// newID returns "snap-" and 26 random lowercase base32 characters.
func newID() string { return model.NewID(strings.TrimSuffix(IDPrefix, "-")) }

func (s *Store) sandboxDir(sandboxID string) string { return filepath.Join(s.root, sandboxID) }

// Pending is a snapshot being written. Exactly one of Commit and Abort
// finishes it.
type Pending struct {
	s         *Store
	sandboxID string
	id        string
	dir       string
	done      bool
}

// Begin creates a pending snapshot of sandboxID; the runtime writes its
// artifacts into Dir.
func (s *Store) Begin(sandboxID string) (*Pending, error) {
	return s.begin(sandboxID, newID())
}

// begin is Begin with the snapshot's id given (Pull keeps the id it had).
func (s *Store) begin(sandboxID, id string) (*Pending, error) {
	if err := validName("sandbox id", sandboxID); err != nil {
		return nil, err
	}
	sd := s.sandboxDir(sandboxID)
	dir := filepath.Join(sd, ".pending-"+id)
	// The sandbox dir may vanish between the two steps: removing a
	// retired snapshot drops the dir once it is empty (a wake retires the
	// snapshot it woke from while a suspend may begin the next). The
	// pending dir in it keeps it from then on, so one more round makes it.
	for attempt := 0; ; attempt++ {
		if _, err := os.Stat(sd); errors.Is(err, fs.ErrNotExist) {
			if err := os.MkdirAll(sd, 0o700); err != nil {
				return nil, fmt.Errorf("snapshot: begin %s: %w", sandboxID, err)
			}
			// The new sandbox dir must survive a crash with what commits in it.
			if err := syncDir(s.root); err != nil {
				return nil, fmt.Errorf("snapshot: begin %s: %w", sandboxID, err)
			}
		}
		err := os.Mkdir(dir, 0o700)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrNotExist) || attempt == 2 {
			return nil, fmt.Errorf("snapshot: begin %s: %w", sandboxID, err)
		}
	}
	return &Pending{s: s, sandboxID: sandboxID, id: id, dir: dir}, nil
}

// ID is the id the snapshot will have once committed.
func (p *Pending) ID() string { return p.id }

// Dir is the directory the artifacts go into.
func (p *Pending) Dir() string { return p.dir }

// Abort removes the pending snapshot.
func (p *Pending) Abort() error {
	p.done = true
	os.Remove(p.markerPath())
	os.Remove(p.dir + IntentSuffix)
	os.Remove(p.dir + LockSuffix)
	if err := os.RemoveAll(p.dir); err != nil {
		return fmt.Errorf("snapshot: abort %s: %w", p.id, err)
	}
	return nil
}

// markerPath is where MarkComplete records meta: beside the pending dir,
// so it is not an artifact.
func (p *Pending) markerPath() string {
	return filepath.Join(p.s.sandboxDir(p.sandboxID), ".pending-"+p.id+completeSuffix)
}

const completeSuffix = ".complete"

// Files beside a pending snapshot's Dir (see Detach) through which a
// runtime's checkpoint that may outlive its caller records its end.
const (
	// IntentSuffix: Dir()+IntentSuffix holds the meta to commit with; the
	// writer renames it to Dir()+CompleteSuffix once the artifacts are
	// complete (and fsyncs the directory).
	IntentSuffix = ".intent"
	// CompleteSuffix: the completion marker MarkComplete writes.
	CompleteSuffix = completeSuffix
	// LockSuffix: Dir()+LockSuffix is flocked (exclusive) by the writer for
	// as long as it runs; Recover waits for it and GC leaves a locked
	// pending snapshot alone.
	LockSuffix = ".lock"
)

// Detach prepares p for a writer that may outlive the calling process (a
// worker SIGKILLed while `runsc checkpoint`, a separate process, runs on):
// it writes meta durably to Dir()+IntentSuffix and creates Dir()+LockSuffix.
// A writer that takes the lock for as long as it runs and renames the
// intent to Dir()+CompleteSuffix once its artifacts are complete (the
// gVisor driver's Checkpoint does) makes its completion durable without
// the caller: the next Recover waits for the lock, then commits the
// snapshot. A writer that ignores these files leaves the caller to
// MarkComplete as before; the files go with Commit, Abort or GC.
func (p *Pending) Detach(meta Meta) error {
	if err := validKind(meta.Kind); err != nil {
		return err
	}
	data, err := json.Marshal(meta)
	if err != nil {
		return fmt.Errorf("snapshot: detach %s: %w", p.id, err)
	}
	f, err := os.OpenFile(p.dir+LockSuffix, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("snapshot: detach %s: %w", p.id, err)
	}
	f.Close()
	if err := writeFileSync(filepath.Dir(p.dir), filepath.Base(p.dir)+IntentSuffix, data); err != nil {
		return fmt.Errorf("snapshot: detach %s: %w", p.id, err)
	}
	return nil
}

// Completed reports whether the artifacts were marked complete (by
// MarkComplete or by a detached writer).
func (p *Pending) Completed() bool {
	_, err := os.Stat(p.markerPath())
	return err == nil
}

// RecoverWait bounds how long Recover waits for one detached writer still
// running (a checkpoint the previous worker process started).
var RecoverWait = 15 * time.Minute

// locked reports whether the lock file at path is held by a writer.
func locked(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		return errors.Is(err, syscall.EWOULDBLOCK)
	}
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}

// waitUnlocked waits until no writer holds the lock file at path, at most
// RecoverWait; it reports whether the writer is gone.
func waitUnlocked(path string) bool {
	deadline := time.Now().Add(RecoverWait)
	for locked(path) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// MarkComplete records durably that the runtime has finished writing the
// artifacts, and the meta to commit them with. A crash between this and
// Commit no longer loses the snapshot: Recover (at worker start, before GC)
// commits it. Use it where the runtime's state exists only in the snapshot
// once it is written (a suspend: the guest stopped).
func (p *Pending) MarkComplete(meta Meta) error {
	if err := validKind(meta.Kind); err != nil {
		return err
	}
	data, err := json.Marshal(meta)
	if err != nil {
		return fmt.Errorf("snapshot: mark %s complete: %w", p.id, err)
	}
	if err := writeFileSync(filepath.Dir(p.markerPath()), filepath.Base(p.markerPath()), data); err != nil {
		return fmt.Errorf("snapshot: mark %s complete: %w", p.id, err)
	}
	return nil
}

// Recover commits every pending snapshot marked complete (MarkComplete)
// that a crash left uncommitted, and returns their manifests. Call it at
// worker start before GC, when no Begin, Commit or Import is in progress.
//
// A pending snapshot whose detached writer (Detach) still runs is waited
// for first, at most RecoverWait each: its completion is what decides
// whether it is committed. One still locked after that is left pending
// (GC skips it too) and reported in the error.
func (s *Store) Recover() ([]Manifest, error) {
	var errs []error
	locks, err := filepath.Glob(filepath.Join(s.root, "*", ".pending-*"+LockSuffix))
	if err != nil {
		return nil, fmt.Errorf("snapshot: recover: %w", err)
	}
	for _, lk := range locks {
		if !waitUnlocked(lk) {
			errs = append(errs, fmt.Errorf("snapshot: recover %s: its writer still runs after %v; left pending", strings.TrimSuffix(lk, LockSuffix), RecoverWait))
		}
	}
	markers, err := filepath.Glob(filepath.Join(s.root, "*", ".pending-*"+completeSuffix))
	if err != nil {
		return nil, fmt.Errorf("snapshot: recover: %w", err)
	}
	var out []Manifest
	for _, mk := range markers {
		sandboxID := filepath.Base(filepath.Dir(mk))
		id := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(mk), ".pending-"), completeSuffix)
		p := &Pending{s: s, sandboxID: sandboxID, id: id, dir: filepath.Join(filepath.Dir(mk), ".pending-"+id)}
		if locked(p.dir + LockSuffix) {
			continue // still being written (reported above)
		}
		data, err := os.ReadFile(mk)
		var meta Meta
		if err == nil {
			err = json.Unmarshal(data, &meta)
		}
		if err == nil {
			if _, serr := os.Stat(p.dir); serr != nil {
				err = serr
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("snapshot: recover %s of %s: %w", id, sandboxID, err))
			os.Remove(mk) // GC removes the rest
			continue
		}
		// A Commit the crash cut short may have left its manifest (or the
		// temp file of it) in the pending dir: names no runtime writes
		// (Commit refuses them as artifacts), so they go.
		os.Remove(filepath.Join(p.dir, ManifestFile))
		os.Remove(filepath.Join(p.dir, "."+ManifestFile+".tmp"))
		m, err := p.Commit(meta)
		if err != nil {
			errs = append(errs, fmt.Errorf("snapshot: recover %s of %s: %w", id, sandboxID, err))
			continue
		}
		out = append(out, m)
	}
	return out, errors.Join(errs...)
}

// Commit fsyncs and hashes every file under Dir, writes manifest.json
// atomically, and moves the directory to its final name. Only then does the
// snapshot exist for Get and List. Dir may hold regular files and
// directories only. On failure the snapshot stays pending (Abort it).
func (p *Pending) Commit(meta Meta) (Manifest, error) {
	if p.done {
		return Manifest{}, fmt.Errorf("snapshot: commit %s: already committed or aborted: %w", p.id, model.ErrConflict)
	}
	if err := validKind(meta.Kind); err != nil {
		return Manifest{}, err
	}
	arts, err := hashTree(p.dir)
	if err != nil {
		return Manifest{}, fmt.Errorf("snapshot: commit %s: %w", p.id, err)
	}
	m := Manifest{
		ID: p.id, SandboxID: p.sandboxID, Name: meta.Name, Runtime: meta.Runtime, Kind: meta.Kind,
		CreatedAt: time.Now().UTC(), Artifacts: arts,
		Template: meta.Template, TemplateDigest: meta.TemplateDigest, VCPUs: meta.VCPUs, MemoryMiB: meta.MemoryMiB,
	}
	for _, a := range arts {
		m.Bytes += a.Size
	}
	if err := p.commit(m); err != nil {
		return Manifest{}, err
	}
	return m, nil
}

// commit writes m as the manifest and renames the pending dir into place.
func (p *Pending) commit(m Manifest) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("snapshot: commit %s: encode manifest: %w", p.id, err)
	}
	if err := writeFileSync(p.dir, ManifestFile, data); err != nil {
		return fmt.Errorf("snapshot: commit %s: %w", p.id, err)
	}
	final := filepath.Join(p.s.sandboxDir(p.sandboxID), p.id)
	if err := os.Rename(p.dir, final); err != nil {
		return fmt.Errorf("snapshot: commit %s: %w", p.id, err)
	}
	pending := p.dir
	p.done = true
	p.dir = final
	os.Remove(p.markerPath()) // committed: the marker has served
	os.Remove(pending + IntentSuffix)
	os.Remove(pending + LockSuffix)
	if err := syncDir(filepath.Dir(final)); err != nil {
		return fmt.Errorf("snapshot: commit %s: %w", p.id, err)
	}
	return nil
}

// hashTree fsyncs and hashes every regular file under dir (sorted by path)
// and fsyncs every directory. Anything else (symlinks, devices, a file
// named like the manifest at the top) is an error.
//
// A suspend waits for this, so it overlaps what it can: files are done a
// few at a time (one per core, at most 4), and each file's fsync (the disk
// writing back what the checkpoint just wrote) runs while its sha256 is
// computed from the page cache. For a 256 MiB-dirty gVisor sandbox that is
// the difference between the sum and the larger of the two.
func hashTree(dir string) ([]Artifact, error) {
	var files, rels, dirs []string
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		switch {
		case e.IsDir():
			dirs = append(dirs, p)
			return nil
		case !e.Type().IsRegular():
			return fmt.Errorf("artifact %s is not a regular file (%v): %w", rel, e.Type(), model.ErrInvalid)
		case rel == ManifestFile || rel == SignatureFile || strings.HasPrefix(rel, "."+ManifestFile):
			return fmt.Errorf("artifact %s: the name is reserved: %w", rel, model.ErrInvalid)
		}
		files, rels = append(files, p), append(rels, rel)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("hash artifacts: %w", err)
	}
	arts := make([]Artifact, len(files))
	errs := make([]error, len(files))
	sem := make(chan struct{}, min(max(goruntime.GOMAXPROCS(0), 1), 4))
	var wg sync.WaitGroup
	for i, p := range files {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			arts[i], errs[i] = hashFile(p, true)
			arts[i].Path = rels[i]
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("hash artifacts: %w", err)
	}
	for _, d := range slices.Backward(dirs) {
		if err := syncDir(d); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(arts, func(a, b Artifact) int { return strings.Compare(a.Path, b.Path) })
	return arts, nil
}

// hashFile returns the size and sha256 of a file; when durable it also
// fsyncs the file, concurrently with the hashing, and fails if that fails.
func hashFile(p string, durable bool) (Artifact, error) {
	f, err := os.Open(p)
	if err != nil {
		return Artifact{}, err
	}
	defer f.Close()
	synced := make(chan error, 1)
	if durable {
		go func() { synced <- f.Sync() }()
	} else {
		synced <- nil
	}
	h := sha256.New()
	n, rerr := io.Copy(h, f)
	if err := <-synced; err != nil {
		return Artifact{}, fmt.Errorf("fsync %s: %w", p, err)
	}
	if rerr != nil {
		return Artifact{}, fmt.Errorf("read %s: %w", p, rerr)
	}
	return Artifact{Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// writeFileSync writes dir/name atomically and durably: a temp file,
// fsync, rename, fsync of dir.
func writeFileSync(dir, name string, data []byte) error {
	tmp := filepath.Join(dir, "."+name+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", name, err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	return nil
}

// snapDir validates the ids and returns the committed snapshot's directory.
func (s *Store) snapDir(sandboxID, snapshotID string) (string, error) {
	if err := validName("sandbox id", sandboxID); err != nil {
		return "", err
	}
	if err := validName("snapshot id", snapshotID); err != nil {
		return "", err
	}
	return filepath.Join(s.sandboxDir(sandboxID), snapshotID), nil
}

// readManifest reads and checks dir's manifest. A missing manifest is
// ErrNotFound; an unreadable or inconsistent one is ErrCorrupt.
func readManifest(dir, sandboxID, snapshotID string) (Manifest, error) {
	data, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if errors.Is(err, fs.ErrNotExist) {
		return Manifest{}, fmt.Errorf("snapshot %s of %s: %w", snapshotID, sandboxID, ErrNotFound)
	}
	if err != nil {
		return Manifest{}, fmt.Errorf("snapshot %s of %s: read manifest: %w", snapshotID, sandboxID, err)
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return Manifest{}, fmt.Errorf("snapshot %s of %s: manifest: %v: %w", snapshotID, sandboxID, err, ErrCorrupt)
	}
	if m.ID != snapshotID || m.SandboxID != sandboxID {
		return Manifest{}, fmt.Errorf("snapshot %s of %s: manifest names %s of %s: %w", snapshotID, sandboxID, m.ID, m.SandboxID, ErrCorrupt)
	}
	if err := checkArtifacts(m.Artifacts); err != nil {
		return Manifest{}, fmt.Errorf("snapshot %s of %s: manifest: %v: %w", snapshotID, sandboxID, err, ErrCorrupt)
	}
	return m, nil
}

// checkArtifacts validates artifact paths, sizes and digests of a manifest.
func checkArtifacts(arts []Artifact) error {
	if len(arts) > maxArtifacts {
		return fmt.Errorf("%d artifacts (at most %d)", len(arts), maxArtifacts)
	}
	seen := map[string]bool{}
	for _, a := range arts {
		if err := safePath(a.Path); err != nil {
			return err
		}
		if seen[a.Path] {
			return fmt.Errorf("artifact %q listed twice", a.Path)
		}
		seen[a.Path] = true
		if a.Size < 0 {
			return fmt.Errorf("artifact %q has size %d", a.Path, a.Size)
		}
		if b, err := hex.DecodeString(a.SHA256); err != nil || len(b) != sha256.Size || a.SHA256 != strings.ToLower(a.SHA256) {
			return fmt.Errorf("artifact %q has a malformed sha256 %q", a.Path, a.SHA256)
		}
	}
	// A path that is also a parent of another path cannot be a file.
	for p := range seen {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if seen[d] {
				return fmt.Errorf("artifact %q is also a directory", d)
			}
		}
	}
	return nil
}

// safePath accepts a clean, relative, slash-separated path inside the
// snapshot dir that is not the manifest (or its temp file) or an archive's
// signature entry.
func safePath(p string) error {
	if p == "" || len(p) > maxPathLen || strings.ContainsAny(p, "\\\x00") || path.IsAbs(p) || path.Clean(p) != p {
		return fmt.Errorf("artifact path %q is not a clean relative path", p)
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." || el == "." {
			return fmt.Errorf("artifact path %q has a dot element", p)
		}
	}
	if p == ManifestFile || p == SignatureFile || strings.HasPrefix(p, "."+ManifestFile) {
		return fmt.Errorf("artifact path %q is reserved", p)
	}
	return nil
}

// Get returns a committed snapshot and the directory to restore from, after
// a fast check: the manifest parses and every artifact is present with its
// recorded size. Verify does the full checksum check.
func (s *Store) Get(sandboxID, snapshotID string) (Manifest, string, error) {
	dir, err := s.snapDir(sandboxID, snapshotID)
	if err != nil {
		return Manifest{}, "", err
	}
	m, err := readManifest(dir, sandboxID, snapshotID)
	if err != nil {
		return Manifest{}, "", err
	}
	for _, a := range m.Artifacts {
		fi, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(a.Path)))
		if err != nil {
			return Manifest{}, "", fmt.Errorf("snapshot %s of %s: artifact %s: %v: %w", snapshotID, sandboxID, a.Path, err, ErrCorrupt)
		}
		if !fi.Mode().IsRegular() || fi.Size() != a.Size {
			return Manifest{}, "", fmt.Errorf("snapshot %s of %s: artifact %s: %s of %d bytes, manifest says %d: %w",
				snapshotID, sandboxID, a.Path, fi.Mode().Type(), fi.Size(), a.Size, ErrCorrupt)
		}
	}
	return m, dir, nil
}

// Verify checks the sha256 of every artifact of a committed snapshot.
func (s *Store) Verify(sandboxID, snapshotID string) error {
	m, dir, err := s.Get(sandboxID, snapshotID)
	if err != nil {
		return err
	}
	for _, a := range m.Artifacts {
		got, err := hashFile(filepath.Join(dir, filepath.FromSlash(a.Path)), false)
		if err != nil {
			return fmt.Errorf("snapshot %s of %s: artifact %s: %v: %w", snapshotID, sandboxID, a.Path, err, ErrCorrupt)
		}
		if got.Size != a.Size || got.SHA256 != a.SHA256 {
			return fmt.Errorf("snapshot %s of %s: artifact %s: sha256 %s, manifest says %s: %w",
				snapshotID, sandboxID, a.Path, got.SHA256, a.SHA256, ErrCorrupt)
		}
	}
	return nil
}

// List returns the committed snapshots of a sandbox, oldest first. Pending
// snapshots and directories without a readable manifest are left out.
func (s *Store) List(sandboxID string) ([]Manifest, error) {
	if err := validName("sandbox id", sandboxID); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(s.sandboxDir(sandboxID))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot: list %s: %w", sandboxID, err)
	}
	var out []Manifest
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		m, err := readManifest(filepath.Join(s.sandboxDir(sandboxID), e.Name()), sandboxID, e.Name())
		if err != nil {
			continue
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Manifest) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// Delete removes a committed snapshot: Retire, then its removal.
// ErrNotFound if absent.
func (s *Store) Delete(sandboxID, snapshotID string) error {
	remove, err := s.Retire(sandboxID, snapshotID)
	if err != nil {
		return err
	}
	return remove()
}

// Retire takes a committed snapshot out of sight at once, by renaming it
// (Get and List no longer return it, and a crash leaves only what GC
// removes), and returns the function that removes its files. Removing a
// few hundred MB takes tens of milliseconds, which a caller on a latency
// path (a wake, before it reports the sandbox running) spends afterwards.
// ErrNotFound if absent.
func (s *Store) Retire(sandboxID, snapshotID string) (remove func() error, err error) {
	dir, err := s.snapDir(sandboxID, snapshotID)
	if err != nil {
		return nil, err
	}
	gone := filepath.Join(s.sandboxDir(sandboxID), ".deleting-"+snapshotID)
	if err := os.Rename(dir, gone); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("snapshot %s of %s: %w", snapshotID, sandboxID, ErrNotFound)
		}
		return nil, fmt.Errorf("snapshot: delete %s of %s: %w", snapshotID, sandboxID, err)
	}
	return func() error {
		if err := os.RemoveAll(gone); err != nil {
			return fmt.Errorf("snapshot: delete %s of %s: %w", snapshotID, sandboxID, err)
		}
		// Drop the sandbox dir when it is empty (fails harmlessly otherwise).
		os.Remove(s.sandboxDir(sandboxID))
		return nil
	}, nil
}

// DeleteSandbox removes every snapshot of a sandbox, pending ones included.
// Deleting a sandbox without snapshots is not an error.
func (s *Store) DeleteSandbox(sandboxID string) error {
	if err := validName("sandbox id", sandboxID); err != nil {
		return err
	}
	gone := filepath.Join(s.root, ".deleting-"+sandboxID+"-"+newID())
	if err := os.Rename(s.sandboxDir(sandboxID), gone); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("snapshot: delete snapshots of %s: %w", sandboxID, err)
	}
	if err := os.RemoveAll(gone); err != nil {
		return fmt.Errorf("snapshot: delete snapshots of %s: %w", sandboxID, err)
	}
	return nil
}

// GC removes what a crash left: pending snapshots, half-deleted ones and
// committed-looking directories without a manifest. Call it when no Begin,
// Commit or Import is in progress (at worker start).
func (s *Store) GC() error {
	entries, err := os.ReadDir(s.root)
	if err != nil {
		return fmt.Errorf("snapshot: gc: %w", err)
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(s.root, e.Name())
		if strings.HasPrefix(e.Name(), ".") {
			errs = append(errs, os.RemoveAll(p))
			continue
		}
		if !e.IsDir() {
			continue
		}
		subs, err := os.ReadDir(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, sub := range subs {
			sp := filepath.Join(p, sub.Name())
			if busy(p, sub.Name()) {
				continue // a detached writer still runs (Recover timed out on it)
			}
			if sub.Name() == restoringFile {
				continue
			}
			if strings.HasPrefix(sub.Name(), ".") {
				errs = append(errs, os.RemoveAll(sp))
				continue
			}
			if _, err := os.Stat(filepath.Join(sp, ManifestFile)); errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, os.RemoveAll(sp))
			}
		}
		os.Remove(p) // only if empty
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("snapshot: gc: %w", err)
	}
	return nil
}

// restoringFile, in a sandbox's directory, records a restore in progress
// (MarkRestoring); GC keeps it.
const restoringFile = "restoring.json"

// Restoring is a restore in progress of a sandbox from one of its committed
// snapshots (a rollback: the runtime is released first, so a crash before
// the restore is done leaves nothing running).
type Restoring struct {
	SnapshotID string          `json:"snapshot_id"`
	Spec       json.RawMessage `json:"spec,omitempty"` // the caller's description of the sandbox
}

// MarkRestoring records r for sandboxID durably, before the caller
// releases what runs, so that a worker that dies before the restore is
// done finds it at its next start (Restorings) and finishes it.
func (s *Store) MarkRestoring(sandboxID string, r Restoring) error {
	if err := validName("sandbox id", sandboxID); err != nil {
		return err
	}
	if err := validName("snapshot id", r.SnapshotID); err != nil {
		return err
	}
	data, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("snapshot: mark %s restoring: %w", sandboxID, err)
	}
	if err := writeFileSync(s.sandboxDir(sandboxID), restoringFile, data); err != nil {
		return fmt.Errorf("snapshot: mark %s restoring: %w", sandboxID, err)
	}
	return nil
}

// ClearRestoring removes what MarkRestoring recorded for sandboxID.
func (s *Store) ClearRestoring(sandboxID string) error {
	if err := validName("sandbox id", sandboxID); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(s.sandboxDir(sandboxID), restoringFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("snapshot: clear %s restoring: %w", sandboxID, err)
	}
	return nil
}

// Restorings returns every restore in progress (MarkRestoring), by sandbox
// id. An unreadable record is removed and reported in the error.
func (s *Store) Restorings() (map[string]Restoring, error) {
	paths, err := filepath.Glob(filepath.Join(s.root, "*", restoringFile))
	if err != nil {
		return nil, fmt.Errorf("snapshot: list restores: %w", err)
	}
	out := map[string]Restoring{}
	var errs []error
	for _, p := range paths {
		id := filepath.Base(filepath.Dir(p))
		var r Restoring
		data, err := os.ReadFile(p)
		if err == nil {
			err = json.Unmarshal(data, &r)
		}
		if err == nil {
			err = validName("snapshot id", r.SnapshotID)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("snapshot: restore record of %s: %w", id, err))
			os.Remove(p)
			continue
		}
		out[id] = r
	}
	return out, errors.Join(errs...)
}

// busy reports whether entry name of sandbox dir sd belongs to a pending
// snapshot whose detached writer holds its lock.
func busy(sd, name string) bool {
	if !strings.HasPrefix(name, ".pending-") {
		return false
	}
	base := name
	for _, suf := range []string{LockSuffix, IntentSuffix, completeSuffix} {
		base = strings.TrimSuffix(base, suf)
	}
	return locked(filepath.Join(sd, base+LockSuffix))
}

// Sandboxes returns the ids of the sandboxes that have a directory in the
// store, each with the directory's modification time (when a snapshot was
// last added or removed).
func (s *Store) Sandboxes() (map[string]time.Time, error) {
	entries, err := os.ReadDir(s.root)
	if err != nil {
		return nil, fmt.Errorf("snapshot: list sandboxes: %w", err)
	}
	out := make(map[string]time.Time, len(entries))
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		out[e.Name()] = fi.ModTime()
	}
	return out, nil
}
