// Package snapshottest holds fixtures for tests of archive readers: streams
// built to make a careless tar reader read, or buffer, without end.
package snapshottest

import (
	"archive/tar"
	"fmt"
)

// MetaFlood yields tar meta headers without end, alternating GNU long-name
// ('L') and PAX ('x') headers of size 0, which archive/tar's Next skips
// while it looks for a real entry. Its zero value is ready to read; N
// counts the bytes read so far.
type MetaFlood struct {
	N int64 // bytes read
}

// floodBlocks are the two 512-byte headers MetaFlood repeats.
var floodBlocks = func() (blk [2][512]byte) {
	for i, typ := range []byte{tar.TypeGNULongName, tar.TypeXHeader} {
		b := &blk[i]
		copy(b[0:], "././@LongLink")
		copy(b[100:], "0000644\x00")
		copy(b[108:], "0000000\x00")
		copy(b[116:], "0000000\x00")
		copy(b[124:], "00000000000\x00")
		copy(b[136:], "00000000000\x00")
		b[156] = typ
		if typ == tar.TypeGNULongName {
			copy(b[257:], "ustar  \x00")
		} else {
			copy(b[257:], "ustar\x0000")
		}
		copy(b[148:156], "        ")
		sum := 0
		for _, c := range b {
			sum += int(c)
		}
		copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
	}
	return blk
}()

// Read fills p with the next bytes of the flood; it never fails.
func (f *MetaFlood) Read(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := copy(p, floodBlocks[(f.N/512)%2][f.N%512:])
		p, n, f.N = p[c:], n+c, f.N+int64(c)
	}
	return n, nil
}
