package workerapi

import (
	"fmt"
	"unicode/utf8"
)

// MaxReason bounds Observed.Reason and TaskResult.Error. Reasons can carry
// text a guest controls (a QEMU guest's panic line, runsc output), so the
// worker truncates them before every Sync and the server truncates what a
// worker sends over it: one sandbox's reason can never make a Sync body
// too large for the server, which would cut the whole worker off.
const MaxReason = 1024

// TruncateReason returns s cut to at most MaxReason bytes (at a UTF-8
// boundary), marked with how much was cut.
func TruncateReason(s string) string {
	return Truncate(s, MaxReason)
}

// Truncate returns s cut to at most n bytes (n ≥ 64) at a UTF-8 boundary,
// ending in " …[N bytes cut]" when anything was cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	mark := fmt.Sprintf(" …[%d bytes cut]", len(s))
	keep := max(n-len(mark), 0)
	for keep > 0 && !utf8.RuneStart(s[keep]) {
		keep--
	}
	return s[:keep] + fmt.Sprintf(" …[%d bytes cut]", len(s)-keep)
}
