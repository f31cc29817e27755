package model_test

import (
	"regexp"
	"testing"

	"github.com/airlock/airlock/internal/model"
)

func TestNewIDHasFixedForm(t *testing.T) {
	re := regexp.MustCompile(`^sb-[a-z2-7]{26}$`)
	seen := map[string]bool{}
	for range 1000 {
		id := model.NewID("sb")
		if !re.MatchString(id) || seen[id] {
			t.Fatalf("id %q (duplicate=%v)", id, seen[id])
		}
		seen[id] = true
	}
}
