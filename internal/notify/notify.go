// Package notify provides a broadcast wake-up: any number of waiters block on
// C(), and Notify wakes all of them at once. It carries no data; waiters
// re-read the state they care about (level-triggered), so a missed or merged
// notification is harmless.
package notify

import "sync"

// Broadcaster wakes every waiter on Notify. The zero value is ready to use.
type Broadcaster struct {
	mu sync.Mutex
	ch chan struct{}
}

// C returns a channel that is closed by the next Notify.
func (b *Broadcaster) C() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

// Notify wakes every current waiter.
func (b *Broadcaster) Notify() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}
