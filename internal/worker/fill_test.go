package worker

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestFillReader(t *testing.T) {
	tests := []struct {
		name    string
		r       io.Reader
		bufSize int
		want    string
		wantErr error
	}{
		{"fills across short reads", iotest.OneByteReader(strings.NewReader("abcdef")), 4, "abcd", nil},
		{"clean end", strings.NewReader("ab"), 4, "ab", io.EOF},
		{"cut short stays an error", io.MultiReader(strings.NewReader("ab"), iotest.ErrReader(io.ErrUnexpectedEOF)), 4, "ab", io.ErrUnexpectedEOF},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			buf := make([]byte, tc.bufSize)
			n, err := fillReader{tc.r}.Read(buf)
			if string(buf[:n]) != tc.want || !errors.Is(err, tc.wantErr) {
				t.Fatalf("Read = %q, %v; want %q, %v", buf[:n], err, tc.want, tc.wantErr)
			}
		})
	}
}
