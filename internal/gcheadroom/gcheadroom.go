// Package gcheadroom keeps the garbage collector's headroom above the
// live heap a fraction of it (GOGC), raised towards a floor as far as
// Go's default GOGC of 100 allows.
//
// A low GOGC keeps a large heap small, and on a small one makes the
// collector run after every few hundred kilobytes: at 100 services × 10
// instances seamless's live heap is about 4 MB, and GOGC=30 collected it
// every megabyte, more than once per change. The floor spaces those
// collections at a cost of a few megabytes, which a large heap's fraction
// exceeds anyway.
package gcheadroom

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// maxPercent is the most the floor raises GOGC to: Go's default.
const maxPercent = 100

// Percent is the GOGC that gives live bytes of heap at least floor bytes
// of headroom, and at least percent of live: between percent and
// maxPercent.
func Percent(percent int, floor, live uint64) int {
	if live == 0 {
		return max(percent, maxPercent)
	}
	need := int((floor*100 + live - 1) / live)
	return min(max(percent, need), max(percent, maxPercent))
}

// tuner re-reads the live heap after every collection.
type tuner struct {
	mu      sync.Mutex
	percent int
	floor   uint64
	set     int // the GOGC in effect
	stopped bool
	sample  []metrics.Sample
}

// Start sets GOGC to percent, raised after each collection as far as the
// floor asks (Percent). The returned stop puts percent back and ends the
// tuning.
func Start(percent int, floor uint64) (stop func()) {
	t := &tuner{percent: percent, floor: floor, set: percent,
		sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
	debug.SetGCPercent(percent)
	t.arm()
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		t.stopped = true
		debug.SetGCPercent(t.percent)
	}
}

// sentinel is what arm registers the cleanup on. It holds a pointer: a
// small object without could share a block of the tiny allocator with a
// live one, and its cleanup would then never run, ending the tuning.
type sentinel struct{ _ *byte }

// arm registers a cleanup on an object nothing holds: the next collection
// finds it unreachable and runs the cleanup, which tunes and arms again.
func (t *tuner) arm() {
	runtime.AddCleanup(new(sentinel), func(t *tuner) {
		if t.tune() {
			t.arm()
		}
	}, t)
}

// tune sets GOGC from the live heap the last collection marked; false
// once stopped.
func (t *tuner) tune() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	metrics.Read(t.sample)
	var live uint64
	if t.sample[0].Value.Kind() == metrics.KindUint64 {
		live = t.sample[0].Value.Uint64()
	}
	if p := Percent(t.percent, t.floor, live); p != t.set {
		t.set = p
		debug.SetGCPercent(p)
	}
	return true
}
