package gcwatch

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

var keep []byte

// collectUntil collects until ok holds.
func collectUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10s: %s", what)
		}
		runtime.GC() // the cleanup runs after a collection
		time.Sleep(time.Millisecond)
	}
}

// f sees the live heap of each collection, and nothing after stop.
func TestEachCollectionReportsTheLiveHeap(t *testing.T) {
	var last atomic.Uint64
	var calls atomic.Int64
	stop := Start(func(live uint64) {
		last.Store(live)
		calls.Add(1)
	})
	defer stop()
	keep = make([]byte, 64<<20)
	keep[len(keep)-1] = 1
	collectUntil(t, "a live heap of 64 MiB reported", func() bool { return last.Load() >= 64<<20 })
	keep = nil
	collectUntil(t, "the heap small again reported", func() bool { return last.Load() < 32<<20 })
	stop()
	n := calls.Load()
	for range 3 {
		runtime.GC()
	}
	if got := calls.Load(); got != n {
		t.Errorf("%d calls after stop", got-n)
	}
}

var kept []*int32

// A sentinel allocated beside small live objects is collected all the
// same: one without pointers (new(int64)) shared their blocks, and 1 of
// 20 cleanups ran.
func TestASentinelBesideTinyLiveObjectsIsCollected(t *testing.T) {
	var ran atomic.Int32
	const n = 20
	for range n {
		kept = append(kept, new(int32))
		runtime.AddCleanup(new(sentinel), func(int) { ran.Add(1) }, 0)
	}
	deadline := time.Now().Add(10 * time.Second)
	for ran.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d cleanups ran", ran.Load(), n)
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}
