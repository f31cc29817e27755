package model

import "time"

// Template builds: a recipe (BuildSpec) turned into a template by a
// worker's builder (internal/worker build.go), one step at a time, each
// step cached by its parent and its inputs. Airlock's Dockerfile frontend
// (internal/image/build) and E2B's template build API
// (internal/e2bcompat) both produce a BuildSpec, so both run the same
// builder.

// Build step kinds. RUN and COPY change the filesystem (RUN in a sandbox
// of the parent, COPY on the worker, confined to the root); the others
// change only the template's config, except that WORKDIR creates its
// directory when the parent lacks it.
const (
	StepRun        = "RUN"
	StepCopy       = "COPY"
	StepEnv        = "ENV"
	StepWorkdir    = "WORKDIR"
	StepUser       = "USER"
	StepCmd        = "CMD"
	StepEntrypoint = "ENTRYPOINT"
)

// BuildStep is one step of a recipe. ARG is resolved by the frontend: a
// step's Args hold the values substituted.
type BuildStep struct {
	Kind string `json:"kind"`
	// Args by kind: RUN: one shell command (run with /bin/sh -c), or
	// several words when Exec is set; ENV: name, value[, name, value…];
	// WORKDIR: a directory (relative to the current one); USER: a user
	// (name or uid, optionally :group); CMD, ENTRYPOINT: the argv (Exec)
	// or one shell command; COPY: the destination directory (the tar's
	// paths are relative to it; but see ToFile), relative to the current
	// working directory unless absolute.
	Args []string `json:"args"`
	Exec bool     `json:"exec,omitempty"`
	// FilesHash names the uploaded build file (a tar, optionally gzip'ed,
	// of the files to copy, paths relative to the destination) of a COPY:
	// the key it was uploaded under (Service.PutBuildFile).
	FilesHash string `json:"files_hash,omitempty"`
	// Chown (COPY) is the owner of the copied files: user[:group] as
	// names or ids ("": root, or the tar's own owners when KeepOwners).
	Chown string `json:"chown,omitempty"`
	// Chmod (COPY) overrides the copied files' permission bits (octal,
	// "": the tar's).
	Chmod string `json:"chmod,omitempty"`
	// ToFile (COPY): the tar holds one file, written at the destination
	// itself, unless the destination is a directory of the tree (then
	// into it, as Docker's COPY of one file without a trailing slash).
	ToFile bool `json:"to_file,omitempty"`
	// Force re-runs the step (and every later one) even when cached.
	Force bool `json:"force,omitempty"`
	// Text is the step as the user wrote it, for progress and reports
	// ("RUN apt-get install -y jq").
	Text string `json:"text,omitempty"`
}

// BuildSpec is a recipe: a parent template and the steps on top of it.
type BuildSpec struct {
	// Name and Tag name the result ("" tag: "latest").
	Name string `json:"name"`
	Tag  string `json:"tag,omitempty"`
	// From is the parent: a template reference (name[:tag] or sha256:…).
	From  string      `json:"from"`
	Steps []BuildStep `json:"steps,omitempty"`
	// StartCmd is started (in the background, as the template's user,
	// in its working directory) whenever a sandbox from the template
	// starts; ReadyCmd is run until it exits 0 before the sandbox counts
	// as running ("": ready at once). Both are shell commands.
	StartCmd string `json:"start_cmd,omitempty"`
	ReadyCmd string `json:"ready_cmd,omitempty"`
	// Force ignores the step cache for every step.
	Force bool `json:"force,omitempty"`
}

// BuildState is a build's phase.
type BuildState string

const (
	BuildWaiting  BuildState = "waiting" // created; files may still be uploaded (E2B)
	BuildBuilding BuildState = "building"
	BuildReady    BuildState = "ready"
	BuildFailed   BuildState = "failed"
)

// Build is one run of a recipe.
type Build struct {
	ID    string     `json:"id"`
	OrgID string     `json:"org_id"`
	State BuildState `json:"state"`
	Spec  BuildSpec  `json:"spec"`
	// Worker is the worker that builds it.
	Worker string `json:"worker,omitempty"`
	// Digest is the result (state ready).
	Digest string `json:"digest,omitempty"`
	Error  string `json:"error,omitempty"`
	// Steps reports each step as the builder ran it (cached or not).
	Steps      []BuildStepReport `json:"steps,omitempty"`
	CreatedAt  time.Time         `json:"created_at"`
	FinishedAt *time.Time        `json:"finished_at,omitempty"`
}

// BuildStepReport is how one step went.
type BuildStepReport struct {
	Index  int    `json:"index"` // in Spec.Steps; -1: FROM
	Text   string `json:"text"`
	Cached bool   `json:"cached"`
	// Key is the step's cache key: sha256 over the parent's key and the
	// step's inputs (file contents by digest).
	Key        string  `json:"key,omitempty"`
	DurationMS float64 `json:"duration_ms"`
}

// BuildEvent is one line of a build's progress, as the worker streams it
// and the server keeps it (numbered from 1 by Seq).
type BuildEvent struct {
	Seq  int       `json:"seq"`
	Time time.Time `json:"time"`
	// Type: "step" (a step begins: Step, Text, Cached), "output" (a line
	// of a RUN step's output: Stream "stdout"/"stderr", Text), "info",
	// "done" (Digest), "error" (Text).
	Type   string           `json:"type"`
	Step   *BuildStepReport `json:"step,omitempty"`
	Stream string           `json:"stream,omitempty"`
	Text   string           `json:"text,omitempty"`
	Digest string           `json:"digest,omitempty"`
}

// Bounds of builds.
const (
	MaxBuildSteps     = 256
	MaxBuildFileBytes = 512 << 20 // one uploaded COPY archive
	MaxBuildEvents    = 20000     // kept per build; later output is dropped with a note
	MaxBuildLineBytes = 8 << 10   // one output line
)
