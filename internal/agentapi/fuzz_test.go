package agentapi

import (
	"bytes"
	"testing"
)

// FuzzReadFrame feeds ReadFrame arbitrary bytes, as a hostile guest (or a
// replaced agent) can: it must never panic, never return more than
// MaxFramePayload, and what it returns must write back to the same bytes.
func FuzzReadFrame(f *testing.F) {
	var b bytes.Buffer
	WriteFrame(&b, FrameStdout, []byte("hello"))
	WriteFrame(&b, FrameExit, []byte(`{"code":0}`))
	f.Add(b.Bytes())
	f.Add([]byte{FrameStderr, 0, 0, 0, 0})
	f.Add([]byte{FrameStdout, 0xff, 0xff, 0xff, 0xff, 'x'})
	f.Add([]byte{FrameStdout, 0, 0x10, 0, 1})
	f.Add([]byte{1, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		for {
			start := len(data) - r.Len()
			kind, payload, err := ReadFrame(r)
			if err != nil {
				return
			}
			if len(payload) > MaxFramePayload {
				t.Fatalf("payload of %d bytes over the %d limit", len(payload), MaxFramePayload)
			}
			var w bytes.Buffer
			if err := WriteFrame(&w, kind, payload); err != nil {
				t.Fatalf("write back: %v", err)
			}
			end := len(data) - r.Len()
			if !bytes.Equal(w.Bytes(), data[start:end]) {
				t.Fatalf("frame does not round-trip: read %x, wrote %x", data[start:end], w.Bytes())
			}
		}
	})
}
