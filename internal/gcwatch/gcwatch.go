// Package gcwatch calls a function after garbage collections with the
// live heap the last one marked, for settings that follow the size of
// what a process keeps (the collector's headroom, how many processors
// run Go code).
package gcwatch

import (
	"runtime"
	"runtime/metrics"
	"sync"
)

type watch struct {
	mu      sync.Mutex
	f       func(live uint64)
	stopped bool
	sample  []metrics.Sample
}

// Start calls f with the live heap in bytes after collections from the
// next one on (0 when the runtime has no reading): after each, unless
// another ends before f was called for the last, and then once with the
// latest. Calls do not overlap; after stop returns, f is not called again.
func Start(f func(live uint64)) (stop func()) {
	w := &watch{f: f, sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
	w.arm()
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.stopped = true
	}
}

// sentinel is what arm registers the cleanup on. It holds a pointer: a
// small object without could share a block of the tiny allocator with a
// live one, and its cleanup would then never run, ending the watch.
type sentinel struct{ _ *byte }

// arm registers a cleanup on an object nothing holds: the next collection
// finds it unreachable and runs the cleanup, which calls f and arms again.
func (w *watch) arm() {
	runtime.AddCleanup(new(sentinel), func(w *watch) {
		if w.call() {
			w.arm()
		}
	}, w)
}

// call calls f with the live heap; false once stopped.
func (w *watch) call() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return false
	}
	metrics.Read(w.sample)
	var live uint64
	if w.sample[0].Value.Kind() == metrics.KindUint64 {
		live = w.sample[0].Value.Uint64()
	}
	w.f(live)
	return true
}
