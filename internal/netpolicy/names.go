package netpolicy

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/airlock/airlock/internal/model"
)

// NormalizeName returns the canonical form of a host name: ASCII lower case,
// one trailing dot stripped, letter-digit-hyphen labels of 1-63 characters
// that neither start nor end with a hyphen, 253 characters at most.
//
// It refuses IP literals ("1.2.3.4", "::1") and any name whose last label is
// all digits ("127.1", "2130706433"): no top-level domain is numeric, and
// such strings are addresses in the shorthand forms some resolvers and
// libraries accept, which a name rule must never admit. Non-ASCII names are
// refused too; write internationalized names in punycode ("xn--…"). The
// error wraps model.ErrUnprocessable.
func NormalizeName(s string) (string, error) {
	n, reason := normalize(s)
	if reason != "" {
		return "", model.Errorf(model.ErrUnprocessable, "%q %s", s, reason)
	}
	return n, nil
}

// normalize is NormalizeName with the reason instead of an error.
func normalize(s string) (string, string) {
	s = strings.TrimSuffix(s, ".")
	switch {
	case s == "":
		return "", "is empty"
	case len(s) > 253:
		return "", fmt.Sprintf("is %d characters long (at most 253)", len(s))
	}
	if _, err := netip.ParseAddr(s); err == nil {
		return "", "is an IP address, not a name"
	}
	b := []byte(s)
	start := 0
	for i := 0; i <= len(b); i++ {
		if i == len(b) || b[i] == '.' {
			switch label := b[start:i]; {
			case len(label) == 0:
				return "", "has an empty label"
			case len(label) > 63:
				return "", fmt.Sprintf("has a label of %d characters (at most 63)", len(label))
			case label[0] == '-' || label[len(label)-1] == '-':
				return "", fmt.Sprintf("has a label that starts or ends with a hyphen (%q)", label)
			}
			start = i + 1
			continue
		}
		c := b[i]
		switch {
		case c >= 'A' && c <= 'Z':
			b[i] = c + 'a' - 'A'
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-':
		case c >= 0x80:
			return "", "is not ASCII (write internationalized names in punycode, xn--…)"
		default:
			return "", fmt.Sprintf("has %q (only letters, digits, hyphens and dots)", rune(c))
		}
	}
	if last := s[strings.LastIndexByte(s, '.')+1:]; strings.Trim(last, "0123456789") == "" {
		return "", "ends in an all-numeric label (an IP address in disguise? put addresses in cidrs)"
	}
	return string(b), ""
}

// checkPattern reads a domains entry: a name, or "*." and a name. It returns
// the canonical pattern, or the reason it is refused.
func checkPattern(p string) (string, string) {
	rest, wild := strings.CutPrefix(p, "*.")
	if strings.Contains(rest, "*") {
		return "", `has a wildcard that is not the leading "*." label`
	}
	n, reason := normalize(rest)
	if reason != "" {
		return "", reason
	}
	if wild {
		return "*." + n, ""
	}
	return n, ""
}

// MatchDomain reports whether name matches pattern: "example.com" matches
// only itself; "*.example.com" matches every name under example.com at any
// depth (a.example.com, a.b.example.com) but not example.com. Both are
// compared in canonical form (case and one trailing dot do not matter); an
// invalid pattern or name matches nothing.
func MatchDomain(pattern, name string) bool {
	pat, reason := checkPattern(pattern)
	if reason != "" {
		return false
	}
	n, reason := normalize(name)
	if reason != "" {
		return false
	}
	if suffix, ok := strings.CutPrefix(pat, "*"); ok {
		return strings.HasSuffix(n, suffix) // suffix starts with ".", so never the apex
	}
	return n == pat
}
