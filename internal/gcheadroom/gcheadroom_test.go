package gcheadroom

import (
	"runtime"
	"runtime/metrics"
	"sync/atomic"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	const MiB = 1 << 20
	for _, c := range []struct {
		percent     int
		floor, live uint64
		want        int
	}{
		{30, 4 * MiB, 4 * MiB, 100},    // the floor asks for 100: Go's default at most
		{30, 4 * MiB, 8 * MiB, 50},     // half the live heap
		{30, 4 * MiB, 10 * MiB, 40},    // 4 MiB over 10: 40
		{30, 4 * MiB, 100 * MiB, 30},   // the fraction's headroom exceeds the floor
		{30, 4 * MiB, 160 * MiB, 30},   //
		{30, 4 * MiB, 1, 100},          // a tiny heap: Go's default
		{30, 4 * MiB, 0, 100},          // no reading yet
		{150, 4 * MiB, 100 * MiB, 150}, // never below percent
		{30, 0, 100 * MiB, 30},         // no floor
	} {
		if got := Percent(c.percent, c.floor, c.live); got != c.want {
			t.Errorf("Percent(%d, %d, %d) = %d, want %d", c.percent, c.floor, c.live, got, c.want)
		}
	}
}

// gogc reads the GOGC in effect.
func gogc() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

var keep []byte

// With a small live heap the tuner raises GOGC after a collection; with a
// live heap whose fraction exceeds the floor it lowers it back.
func TestTheTunerFollowsTheLiveHeap(t *testing.T) {
	stop := Start(30, 4<<20)
	defer stop()
	eventually := func(what string, want func(int) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !want(gogc()) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: GOGC is %d", what, gogc())
			}
			runtime.GC() // the cleanup runs after a collection
			time.Sleep(time.Millisecond)
		}
	}
	keep = nil
	eventually("a live heap of a few hundred kilobytes: Go's default", func(p int) bool { return p == 100 })
	keep = make([]byte, 256<<20)
	keep[len(keep)-1] = 1
	eventually("a live heap of 256 MiB: the fraction", func(p int) bool { return p == 30 })
	keep = nil
	eventually("the heap small again", func(p int) bool { return p == 100 })
	stop()
	runtime.GC()
	if p := gogc(); p != 30 {
		t.Errorf("after stop: GOGC %d, want 30", p)
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
