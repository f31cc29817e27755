package model

import (
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"time"
)

// Template builds: a recipe (BuildSpec) turned into a template by a
// worker's builder (internal/worker build.go), one step at a time, each
// step cached by its parent and its inputs. Airlock's Dockerfile frontend
// (internal/dockerfile) and E2B's template build API
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
	// names or ids ("": root).
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
	// Type: "step" (a step begins: Step, Text, Cached), "step_done" (a
	// step that ran has ended: Step with its duration, Text), "output" (a
	// line of a RUN step's output: Stream "stdout"/"stderr", Text),
	// "info", "done" (Digest), "error" (Text).
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

// Validate checks a recipe's form (not its parent or files): the errors
// say what to fix and match ErrInvalid.
func (s BuildSpec) Validate() error {
	if len(s.Steps) > MaxBuildSteps {
		return Errorf(ErrInvalid, "the recipe has %d steps; at most %d", len(s.Steps), MaxBuildSteps)
	}
	if strings.TrimSpace(s.From) == "" {
		return Errorf(ErrInvalid, "the recipe names no parent (FROM)")
	}
	for i, st := range s.Steps {
		bad := func(format string, args ...any) error {
			return Errorf(ErrInvalid, "step %d (%s): %s", i+1, st.Kind, fmt.Sprintf(format, args...))
		}
		for _, a := range st.Args {
			if strings.ContainsRune(a, 0) {
				return bad("an argument holds a NUL byte")
			}
		}
		switch st.Kind {
		case StepRun:
			if len(st.Args) == 0 || (!st.Exec && len(st.Args) != 1) || strings.TrimSpace(strings.Join(st.Args, "")) == "" {
				return bad("RUN needs one shell command, or the words of one (exec form)")
			}
		case StepCopy:
			if len(st.Args) != 1 || strings.TrimSpace(st.Args[0]) == "" {
				return bad("COPY needs one destination directory")
			}
			if st.FilesHash == "" {
				return bad("COPY names no uploaded files (files_hash)")
			}
			if st.Chmod != "" {
				if _, err := ParseMode(st.Chmod); err != nil {
					return bad("%v", err)
				}
			}
		case StepEnv:
			if len(st.Args) == 0 || len(st.Args)%2 != 0 {
				return bad("ENV needs name and value pairs")
			}
			for j := 0; j < len(st.Args); j += 2 {
				if st.Args[j] == "" || strings.ContainsAny(st.Args[j], "= \t\n") {
					return bad("%q is not a variable name", st.Args[j])
				}
			}
		case StepWorkdir, StepUser:
			if len(st.Args) != 1 || strings.TrimSpace(st.Args[0]) == "" {
				return bad("%s needs one argument", st.Kind)
			}
		case StepCmd, StepEntrypoint:
			if len(st.Args) == 0 && st.Exec {
				continue // CMD [] clears it
			}
			if len(st.Args) == 0 {
				return bad("%s needs a command", st.Kind)
			}
		default:
			return Errorf(ErrInvalid, "step %d: unknown kind %q (RUN, COPY, ENV, WORKDIR, USER, CMD, ENTRYPOINT)", i+1, st.Kind)
		}
	}
	return nil
}

// ParseMode reads a COPY's --chmod (octal permission bits).
func ParseMode(s string) (fs.FileMode, error) {
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, fmt.Errorf("--chmod=%s is not an octal mode", s)
	}
	return fs.FileMode(m), nil
}
