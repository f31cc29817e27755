package model_test

import (
	"context"
	"errors"
	"io/fs"
	"testing"

	"github.com/airlock/airlock/internal/model"
)

func TestErrorfWrapsCause(t *testing.T) {
	cause := &fs.PathError{Op: "open", Path: "/x", Err: fs.ErrNotExist}
	err := model.Errorf(model.ErrUnavailable, "read snapshot: %w", cause)
	if got, want := err.Error(), "read snapshot: open /x: file does not exist"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(err, model.ErrUnavailable) || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("errors.Is misses the sentinel or the cause: %v", err)
	}
	var pe *fs.PathError
	if !errors.As(err, &pe) || pe.Path != "/x" {
		t.Fatalf("errors.As does not reach the cause: %v", err)
	}
	// Without %w the cause's text is kept and nothing else is matched.
	flat := model.Errorf(model.ErrConflict, "step: %v", context.Canceled)
	if errors.Is(flat, context.Canceled) || !errors.Is(flat, model.ErrConflict) || flat.Error() != "step: context canceled" {
		t.Fatalf("flat = %v", flat)
	}
	// Two causes, as fmt.Errorf allows.
	two := model.Errorf(model.ErrInvalid, "%w and %w", context.Canceled, fs.ErrExist)
	if !errors.Is(two, context.Canceled) || !errors.Is(two, fs.ErrExist) || !errors.Is(two, model.ErrInvalid) {
		t.Fatalf("two = %v", two)
	}
}

func TestGoneIsNotFound(t *testing.T) {
	if !errors.Is(model.ErrGone, model.ErrNotFound) || errors.Is(model.ErrNotFound, model.ErrGone) {
		t.Fatal("ErrGone must be a kind of ErrNotFound, not the reverse")
	}
}
