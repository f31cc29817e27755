package agent

import (
	"sort"
	"sync"

	"github.com/airlock/airlock/internal/agentapi"
)

// chunk is one piece of output at a combined stdout+stderr offset.
type chunk struct {
	off  int64
	kind byte // agentapi.FrameStdout or FrameStderr
	data []byte
}

// outputLog keeps the newest max bytes of a process's output and wakes
// readers when output is appended or the process finishes.
type outputLog struct {
	max int64

	mu     sync.Mutex
	chunks []chunk // retained chunks are chunks[head:]
	head   int
	start  int64 // offset of the oldest retained byte
	end    int64 // offset after the newest byte
	size   int64 // retained bytes
	notify chan struct{}
	done   bool
	exit   agentapi.Exit
}

func newOutputLog(max int64) *outputLog {
	return &outputLog{max: max, notify: make(chan struct{})}
}

// retained is how many bytes of output the log holds.
func (l *outputLog) retained() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.size
}

// append adds data (which the log now owns) and drops the oldest chunks
// beyond max.
func (l *outputLog) append(kind byte, data []byte) {
	if len(data) == 0 {
		return
	}
	l.mu.Lock()
	l.chunks = append(l.chunks, chunk{off: l.end, kind: kind, data: data})
	l.end += int64(len(data))
	l.size += int64(len(data))
	for l.size > l.max && l.head < len(l.chunks)-1 {
		l.size -= int64(len(l.chunks[l.head].data))
		l.chunks[l.head] = chunk{}
		l.head++
		l.start = l.chunks[l.head].off
	}
	if l.head > 256 && l.head > len(l.chunks)/2 {
		n := copy(l.chunks, l.chunks[l.head:])
		clear(l.chunks[n:])
		l.chunks = l.chunks[:n]
		l.head = 0
	}
	close(l.notify)
	l.notify = make(chan struct{})
	l.mu.Unlock()
}

// finish records the exit and wakes all readers; no output follows.
func (l *outputLog) finish(exit agentapi.Exit) {
	l.mu.Lock()
	l.done, l.exit = true, exit
	close(l.notify)
	l.notify = make(chan struct{})
	l.mu.Unlock()
}

// offset returns the end offset.
func (l *outputLog) offset() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.end
}

// readResult is one batch for a reader.
type readResult struct {
	chunks []chunk
	next   int64 // offset after the returned chunks
	done   bool  // the process finished and no output is left after next
	exit   agentapi.Exit
	wait   <-chan struct{} // closed when there is more to read
	tooOld bool            // offset was dropped; start is the earliest retained offset
	start  int64
}

// read returns up to about limit bytes of chunks from offset.
func (l *outputLog) read(offset int64, limit int) readResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	res := readResult{next: offset, wait: l.notify, start: l.start}
	if offset < l.start {
		res.tooOld = true
		return res
	}
	live := l.chunks[l.head:]
	i := sort.Search(len(live), func(i int) bool { return live[i].off+int64(len(live[i].data)) > offset })
	n := 0
	for ; i < len(live) && n < limit; i++ {
		c := live[i]
		if c.off < offset {
			c.data = c.data[offset-c.off:]
			c.off = offset
		}
		res.chunks = append(res.chunks, c)
		n += len(c.data)
		res.next = c.off + int64(len(c.data))
	}
	if res.next >= l.end && l.done {
		res.done = true
		res.exit = l.exit
	}
	return res
}
