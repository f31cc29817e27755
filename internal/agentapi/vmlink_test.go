package agentapi

import (
	"slices"
	"testing"
)

func TestParseVMCmdline(t *testing.T) {
	args := []string{"--max-output", "1024", "a b", ""}
	tests := []struct {
		name    string
		cmdline string
		want    VMParams
	}{
		{"not a vm", "console=ttyS0 quiet", VMParams{}},
		{"vm off", "airlock.vm=0 airlock.hostname=h", VMParams{Hostname: "h"}},
		{"vm", "console=ttyS0 quiet tsc_early_khz=2000000 panic=-1 airlock.vm=1 airlock.hostname=box-1\n",
			VMParams{VM: true, Hostname: "box-1"}},
		{"args", "airlock.vm=1 airlock.args=" + VMCmdlineArgs(args), VMParams{VM: true, Args: args}},
		{"bad args ignored", "airlock.vm=1 airlock.args=!!!", VMParams{VM: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ParseVMCmdline(tt.cmdline)
			if got.VM != tt.want.VM || got.Hostname != tt.want.Hostname || !slices.Equal(got.Args, tt.want.Args) {
				t.Errorf("ParseVMCmdline(%q) = %+v, want %+v", tt.cmdline, got, tt.want)
			}
		})
	}
}
