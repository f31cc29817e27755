package agentapi

import (
	"net/netip"
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

func TestVMNet(t *testing.T) {
	n := VMNet{Addr: netip.MustParsePrefix("100.64.0.2/30"), Gateway: netip.MustParseAddr("100.64.0.1"), DNS: []netip.Addr{netip.MustParseAddr("100.64.0.1")}}
	if s := n.String(); s != "100.64.0.2/30,100.64.0.1,100.64.0.1" {
		t.Fatalf("String = %q", s)
	}
	got := ParseVMCmdline("airlock.vm=1 airlock.net=" + n.String())
	if got.Net.Addr != n.Addr || got.Net.Gateway != n.Gateway || !slices.Equal(got.Net.DNS, n.DNS) {
		t.Errorf("round trip: %+v, want %+v", got.Net, n)
	}
	if (VMNet{}).String() != "" || !(VMNet{}).IsZero() || n.IsZero() {
		t.Error("zero VMNet")
	}
	for _, bad := range []string{"", "100.64.0.2/30", "100.64.0.2,100.64.0.1", "100.64.0.2/30,100.64.0.2", "100.64.0.2/30,10.0.0.1",
		"2001:db8::2/64,2001:db8::1", "100.64.0.2/30,100.64.0.1,dns", "100.64.0.2/30,100.64.0.1,::1"} {
		if _, err := ParseVMNet(bad); err == nil {
			t.Errorf("ParseVMNet(%q) accepted", bad)
		}
		if p := ParseVMCmdline("airlock.vm=1 airlock.net=" + bad); !p.Net.IsZero() {
			t.Errorf("ParseVMCmdline with airlock.net=%q: %+v, want no network", bad, p.Net)
		}
	}
}
