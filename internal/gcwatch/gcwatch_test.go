package gcwatch

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

var keep []byte

// collectUntil collects until ok holds: the watch runs after a collection.
func collectUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, what, func() bool { runtime.GC(); return ok() })
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
	collectUntil(t, "every sentinel's cleanup ran", func() bool { return ran.Load() == n })
}
