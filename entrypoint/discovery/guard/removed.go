package guard

import "time"

// A Consul server that restarts restores its last Raft snapshot and
// applies the writes after it only once a leader tells it how far they
// go: for that moment it serves the snapshot's catalog, in which
// instances removed since are still registered. Consul snapshots every
// 16,384 writes (raft_snapshot_threshold), and each removal is at least
// one write, so the removals a restored snapshot can bring back are among
// the last that many; on a quiet cluster a snapshot is older, so they are
// also bounded in time.
const (
	rememberRemovals = 16384
	rememberFor      = time.Hour
)

// removals remembers which instances were passed on and then removed,
// and when; the oldest are forgotten first. Not safe for concurrent use.
type removals struct {
	at    map[key]time.Time
	order []removal // in the order recorded; an entry whose time at no longer holds was recorded again
	head  int       // order[:head] is forgotten
}

type removal struct {
	k  key
	at time.Time
}

func (r *removals) add(k key, now time.Time) {
	if r.at == nil {
		r.at = map[key]time.Time{}
	}
	r.at[k] = now
	r.order = append(r.order, removal{k, now})
	r.prune(now)
}

// has reports whether k was removed within rememberFor of now.
func (r *removals) has(k key, now time.Time) bool {
	at, ok := r.at[k]
	return ok && now.Sub(at) < rememberFor
}

func (r *removals) len() int { return len(r.at) }

// prune forgets what is too old or beyond the count.
func (r *removals) prune(now time.Time) {
	for r.head < len(r.order) && (len(r.order)-r.head > rememberRemovals || now.Sub(r.order[r.head].at) >= rememberFor) {
		if e := r.order[r.head]; r.at[e.k].Equal(e.at) {
			delete(r.at, e.k)
		}
		r.order[r.head] = removal{}
		r.head++
	}
	// The forgotten prefix is copied out once it is half the array: the
	// array stays bounded, and each removal costs O(1) amortised.
	if r.head > 0 && r.head >= len(r.order)/2 {
		n := copy(r.order, r.order[r.head:])
		clear(r.order[n:])
		r.order, r.head = r.order[:n], 0
	}
}
