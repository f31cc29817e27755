package daemon

import (
	"flag"
	"io"
	"testing"
)

func TestWarmFlag(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string // String() of the parsed flag; "" with ok=false: a parse error
		ok   bool
	}{
		{"one", []string{"--warm", "base=4"}, "base=4", true},
		{"repeated with tag and digest", []string{"--warm", "base:v1=2", "--warm", "sha256:ab=0"}, "base:v1=2,sha256:ab=0", true},
		{"no size", []string{"--warm", "base"}, "", false},
		{"no template", []string{"--warm", "=3"}, "", false},
		{"negative", []string{"--warm", "base=-1"}, "", false},
		{"too large", []string{"--warm", "base=65"}, "", false},
		{"not a number", []string{"--warm", "base=x"}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			var w warmFlag
			fs.Var(&w, "warm", warmUsage)
			err := fs.Parse(tc.args)
			if (err == nil) != tc.ok {
				t.Fatalf("parse %v: err = %v, want ok=%v", tc.args, err, tc.ok)
			}
			if tc.ok && w.String() != tc.want {
				t.Fatalf("parsed %q, want %q", w.String(), tc.want)
			}
		})
	}
}
