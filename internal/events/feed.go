package events

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/notify"
)

// FeedPage is how many events one store read of the feed returns.
const FeedPage = 500

// SubscriptionBuffer is how many events a subscription holds for a slow
// reader; beyond it the subscription lags (see Subscription.Lagged).
const SubscriptionBuffer = 1024

// Subscription receives the log's new events that match its filter, in
// Seq order, from the Log's one fan-out goroutine.
type Subscription struct {
	// C carries the events (shared by every subscription: read only).
	C <-chan *model.Event
	// Lagged is closed when the reader fell behind by more than
	// SubscriptionBuffer events: events were dropped, nothing more comes
	// on C. Read the rest from the store and subscribe again.
	Lagged <-chan struct{}

	l         *Log
	org, sbx  string
	c         chan *model.Event
	lagged    chan struct{}
	closeOnce sync.Once
}

// feed is the fan-out: subscribers and the position the goroutine has read
// the log to.
type feed struct {
	mu      sync.Mutex
	subs    map[*Subscription]struct{}
	running bool
	cursor  int64              // events up to here are delivered (or needed by nobody)
	known   bool               // cursor is a committed Seq (else probe the store)
	reads   int64              // store reads by the feed, for tests and metrics
	wake    notify.Broadcaster // the last subscription closed
}

// Subscribe returns a subscription to the events of org orgID ("" all) and,
// if sandboxID is set, of that sandbox only — the filter of
// store.ListEvents. It delivers events appended after the moment it is
// called; a reader that must not miss any reads the store from its own
// position after subscribing and drops the duplicates (Seq at or below
// what it has).
//
// One goroutine per Log serves every subscription: it reads new events once
// per append (its own or, with Listen, another server's), however many
// subscriptions there are. It runs while there is a subscription.
func (l *Log) Subscribe(ctx context.Context, orgID, sandboxID string) (*Subscription, error) {
	f := &l.feed
	f.mu.Lock()
	known := f.known
	f.mu.Unlock()
	if !known {
		// The first feed of this Log starts at the end of the log as it is
		// now (subscribers read their own past), found with a few one-row
		// reads; before Subscribe returns, so nothing after is missed.
		seq, err := l.lastSeq(ctx)
		if err != nil {
			return nil, fmt.Errorf("events: find the end of the log: %w", err)
		}
		f.mu.Lock()
		if !f.known {
			f.cursor, f.known = seq, true
		}
		f.mu.Unlock()
	}
	s := &Subscription{l: l, org: orgID, sbx: sandboxID, c: make(chan *model.Event, SubscriptionBuffer), lagged: make(chan struct{})}
	s.C, s.Lagged = s.c, s.lagged
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.subs == nil {
		f.subs = map[*Subscription]struct{}{}
	}
	f.subs[s] = struct{}{}
	if !f.running {
		f.running = true
		// Take the wake-up channel now: an event appended between here
		// and the goroutine's first read is not missed.
		go l.runFeed(l.streams.C(), f.cursor)
	}
	return s, nil
}

// Close ends the subscription.
func (s *Subscription) Close() {
	s.closeOnce.Do(func() {
		f := &s.l.feed
		f.mu.Lock()
		delete(f.subs, s)
		last := len(f.subs) == 0
		f.mu.Unlock()
		if last {
			f.wake.Notify() // let the goroutine end now, not at the next event
		}
	})
}

func (s *Subscription) matches(ev model.Event) bool {
	return (s.org == "" || s.org == ev.OrgID) && (s.sbx == "" || s.sbx == ev.SandboxID)
}

// FeedReads is how many store reads the fan-out has made.
func (l *Log) FeedReads() int64 {
	l.feed.mu.Lock()
	defer l.feed.mu.Unlock()
	return l.feed.reads
}

// runFeed reads the log after the cursor at every wake-up and delivers each
// event to the matching subscriptions, until there are none.
func (l *Log) runFeed(changed <-chan struct{}, cursor int64) {
	ctx := context.Background()
	f := &l.feed
	stop := f.wake.C()
	for {
		if f.idle() {
			return
		}
		evs, err := l.Store.ListEvents(ctx, "", "", cursor, FeedPage)
		f.mu.Lock()
		f.reads++
		f.mu.Unlock()
		if err == nil {
			for i := range evs {
				l.deliver(&evs[i])
				cursor = max(cursor, evs[i].Seq)
			}
			l.advance(cursor)
			if len(evs) == FeedPage {
				continue // more to read before waiting
			}
		} else {
			// Read again at the next wake-up: subscribers keep their place,
			// the cursor has not moved.
			slog.Default().Warn("event feed: list events", "err", err)
		}
		select {
		case <-changed:
		case <-stop:
		}
		changed, stop = l.streams.C(), f.wake.C()
	}
}

// idle stops the goroutine when no subscription is left (under the lock,
// so a Subscribe either sees it running or starts a new one).
func (f *feed) idle() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.subs) == 0 {
		f.running = false
		return true
	}
	return false
}

// appended records the Seq of an event this Log appended: with no
// subscription, nobody needs it, and a feed started later begins after it.
func (l *Log) appended(seq int64) {
	f := &l.feed
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.running && f.known {
		f.cursor = max(f.cursor, seq)
	}
}

// advance records that events up to seq are delivered.
func (l *Log) advance(seq int64) {
	f := &l.feed
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cursor = max(f.cursor, seq)
}

func (l *Log) deliver(ev *model.Event) {
	f := &l.feed
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.subs {
		if !s.matches(*ev) {
			continue
		}
		select {
		case s.c <- ev:
		default: // the reader is too far behind: it reads the store instead
			delete(f.subs, s)
			close(s.lagged)
		}
	}
}

// lastSeq finds the log's highest Seq with one-row reads: doubling, then
// bisecting (about 2·log2(seq) index lookups, once per feed start).
func (l *Log) lastSeq(ctx context.Context) (int64, error) {
	exists := func(after int64) (bool, error) {
		evs, err := l.Store.ListEvents(ctx, "", "", after, 1)
		return len(evs) > 0, err
	}
	lo, hi := int64(0), int64(1) // an event exists after lo (or lo is 0); none after hi?
	for {
		ok, err := exists(hi)
		if err != nil {
			return 0, err
		}
		if !ok {
			break
		}
		lo, hi = hi, hi*2
	}
	// No event after hi; the answer is in [lo, hi].
	for lo < hi {
		mid := lo + (hi-lo)/2
		ok, err := exists(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo, nil
}
