package logcap

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestEnforceWithAppendWriter: a writer holding the file open with
// O_APPEND (as QEMU's append=on console and runsc's stdio do) keeps
// writing after a cut, at the new end: no hole, no lost later bytes.
func TestEnforceWithAppendWriter(t *testing.T) {
	p := filepath.Join(t.TempDir(), "serial.log")
	w, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	chunk := bytes.Repeat([]byte("A"), 64<<10)
	for range 40 { // 2.5 MiB
		w.Write(chunk)
	}
	w.Write([]byte("END-OF-FIRST\n"))
	cut, err := Enforce(p, Max, Keep)
	if err != nil || !cut {
		t.Fatalf("Enforce = %v, %v; want a cut", cut, err)
	}
	if fi, _ := os.Stat(p); fi.Size() != 0 {
		t.Fatalf("after the cut %d bytes remain", fi.Size())
	}
	kept, _ := os.ReadFile(p + ".1")
	if len(kept) != Keep || !bytes.HasSuffix(kept, []byte("END-OF-FIRST\n")) {
		t.Fatalf("kept tail: %d bytes, suffix %q", len(kept), kept[max(0, len(kept)-20):])
	}
	w.Write([]byte("after\n"))
	b, _ := os.ReadFile(p)
	if string(b) != "after\n" {
		t.Fatalf("after the cut the file holds %q (a writer without O_APPEND would leave a hole)", b[:min(len(b), 40)])
	}
	if got := Tail(p, 20); !bytes.HasSuffix(got, []byte("END-OF-FIRST\nafter\n")) || len(got) != 20 {
		t.Fatalf("Tail across the cut = %q", got)
	}
	if cut, err := Enforce(p, Max, Keep); cut || err != nil {
		t.Fatalf("Enforce on a small file = %v, %v", cut, err)
	}
	if cut, err := Enforce(filepath.Join(t.TempDir(), "none"), Max, Keep); cut || err != nil {
		t.Fatalf("Enforce on a missing file = %v, %v", cut, err)
	}
}
