package testenv

import (
	"flag"
	"os"
	"strings"
	"testing"
)

// setShort sets -test.short for the rest of t.
func setShort(t *testing.T, on bool) {
	t.Helper()
	was := flag.Lookup("test.short").Value.String()
	v := "false"
	if on {
		v = "true"
	}
	if err := flag.Set("test.short", v); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { flag.Set("test.short", was) })
}

// TestReasons: in the fast tier every gate skips, naming the tier, what is
// needed and where it runs; in the full suite only root decides.
func TestReasons(t *testing.T) {
	setShort(t, true)
	for _, got := range []string{ShortReason("builds airlock-agent"), RootReason("creates cgroups")} {
		if !strings.HasPrefix(got, "-short: ") || !strings.HasSuffix(got, FullSuite) {
			t.Errorf("under -short: %q does not name the tier and the full suite", got)
		}
	}
	if got := RootReason("creates cgroups"); !strings.Contains(got, "needs root (creates cgroups)") {
		t.Errorf("RootReason = %q, want it to say root is needed and what for", got)
	}

	setShort(t, false)
	if got := ShortReason("builds airlock-agent"); got != "" {
		t.Errorf("ShortReason without -short = %q, want none", got)
	}
	got := RootReason("creates cgroups")
	switch root := os.Geteuid() == 0; {
	case root && got != "":
		t.Errorf("RootReason as root = %q, want none", got)
	case !root && (!strings.Contains(got, "needs root (creates cgroups)") || strings.Contains(got, "-short")):
		t.Errorf("RootReason as uid %d = %q, want root named, not the tier", os.Geteuid(), got)
	}
}

// TestSkips: the Require functions skip (never fail) what they cannot give.
func TestSkips(t *testing.T) {
	setShort(t, true)
	for name, f := range map[string]func(testing.TB){
		"Short":          func(tb testing.TB) { Short(tb, "testenv's own check of Short") },
		"RequireRoot":    func(tb testing.TB) { RequireRoot(tb, "testenv's own check of RequireRoot") },
		"RequireRunsc":   RequireRunsc,
		"RequireQEMU":    RequireQEMU,
		"RequireGoBuild": func(tb testing.TB) { RequireGoBuild(tb, "airlock-agent") },
		"RequireTool":    func(tb testing.TB) { RequireTool(tb, "airlock-no-such-tool", "testenv's own check of RequireTool") },
	} {
		t.Run(name, func(t *testing.T) {
			ran := false
			t.Run("gated", func(t *testing.T) {
				f(t)
				ran = true
			})
			if ran {
				t.Errorf("%s did not skip", name)
			}
		})
	}
}
