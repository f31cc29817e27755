package model

import (
	"errors"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		s    BuildSpec
		want string
	}{
		{BuildSpec{}, "no parent"},
		{BuildSpec{From: "base", Steps: []BuildStep{{Kind: "HEALTHCHECK"}}}, "unknown kind"},
		{BuildSpec{From: "base", Steps: []BuildStep{{Kind: StepCopy, Args: []string{"/x"}}}}, "files_hash"},
		{BuildSpec{From: "base", Steps: []BuildStep{{Kind: StepEnv, Args: []string{"A"}}}}, "pairs"},
		{BuildSpec{From: "base", Steps: []BuildStep{{Kind: StepEnv, Args: []string{"A=B", "c"}}}}, "variable name"},
		{BuildSpec{From: "base", Steps: []BuildStep{{Kind: StepRun, Args: []string{"a", "b"}}}}, "one shell command"},
		{BuildSpec{From: "base", Steps: []BuildStep{{Kind: StepCopy, Args: []string{"/x"}, FilesHash: "h", Chmod: "9"}}}, "octal"},
	} {
		if err := c.s.Validate(); err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.s, err, c.want)
		}
	}
}
