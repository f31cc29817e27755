package netpolicy_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/netpolicy"
)

func TestNormalizeName(t *testing.T) {
	long := strings.Repeat("a", 63)
	for _, c := range []struct{ in, want string }{
		{"example.com", "example.com"},
		{"Example.COM.", "example.com"},
		{"xn--bcher-kva.example", "xn--bcher-kva.example"},
		{"a-b.c0.example", "a-b.c0.example"},
		{"localhost", "localhost"},
		{"1password.com", "1password.com"},
		{long + "." + long + "." + long + "." + strings.Repeat("a", 61), long + "." + long + "." + long + "." + strings.Repeat("a", 61)}, // 253
	} {
		got, err := netpolicy.NormalizeName(c.in)
		if err != nil || got != c.want {
			t.Errorf("NormalizeName(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, c := range []struct{ in, why string }{
		{"", "is empty"},
		{".", "is empty"},
		{"example.com..", "empty label"},
		{".example.com", "empty label"},
		{"a..b", "empty label"},
		{long + "a.com", "label of 64 characters"},
		{long + "." + long + "." + long + "." + strings.Repeat("a", 62), "254 characters"},
		{"-a.com", "hyphen"},
		{"a-.com", "hyphen"},
		{"a_b.com", "'_'"},
		{"a b.com", "' '"},
		{"*.example.com", "'*'"},
		{"bücher.example", "not ASCII"},
		{"1.2.3.4", "IP address"},
		{"::1", "IP address"},
		{"127.1", "all-numeric"},
		{"2130706433", "all-numeric"},
		{"0x7f.1", "all-numeric"},
		{"a.b..", "empty label"},
	} {
		_, err := netpolicy.NormalizeName(c.in)
		if err == nil || !errors.Is(err, model.ErrUnprocessable) || !strings.Contains(err.Error(), c.why) {
			t.Errorf("NormalizeName(%q) = %v, want an error saying %q", c.in, err, c.why)
		}
	}
}

func TestMatchDomain(t *testing.T) {
	for _, c := range []struct {
		pattern, name string
		want          bool
	}{
		{"example.com", "example.com", true},
		{"example.com", "EXAMPLE.com.", true},
		{"example.com", "www.example.com", false},
		{"example.com", "notexample.com", false},
		{"*.example.com", "www.example.com", true},
		{"*.example.com", "a.b.c.example.com", true},
		{"*.Example.COM.", "www.example.com", true},
		{"*.example.com", "example.com", false},          // not the apex
		{"*.example.com", "wwwexample.com", false},       // a label boundary, not a string suffix
		{"*.example.com", "www.example.com.evil", false}, // no suffix games
		{"*.example.com", "www.example.co", false},
		{"*.*.example.com", "a.b.example.com", false}, // invalid pattern matches nothing
		{"www.*.com", "www.example.com", false},
		{"example.com", "exa mple.com", false}, // invalid name matches nothing
		{"*.com", "example.com", true},
	} {
		if got := netpolicy.MatchDomain(c.pattern, c.name); got != c.want {
			t.Errorf("MatchDomain(%q, %q) = %v, want %v", c.pattern, c.name, got, c.want)
		}
	}
}
