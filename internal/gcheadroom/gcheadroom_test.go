package gcheadroom

import (
	"runtime"
	"runtime/metrics"
	"testing"
	"time"
)

func TestPercentWithAFloor(t *testing.T) {
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
		if got := (Headroom{Percent: c.percent, Floor: c.floor}).For(c.live); got != c.want {
			t.Errorf("Percent %d, floor %d: For(%d) = %d, want %d", c.percent, c.floor, c.live, got, c.want)
		}
	}
}

func TestPercentWithACeiling(t *testing.T) {
	const MiB = 1 << 20
	h := Headroom{Percent: 30, Floor: 4 * MiB, Ceiling: 24 * MiB, LeastPercent: 15}
	for _, c := range []struct {
		live uint64
		want int
	}{
		{4 * MiB, 100},  // the floor as before
		{18 * MiB, 30},  // 5.4 MiB: the fraction
		{80 * MiB, 30},  // 24 MiB: the fraction is the ceiling
		{96 * MiB, 25},  // 24 of 96
		{160 * MiB, 15}, // 24 of 160
		{400 * MiB, 15}, // 6 %: no less than LeastPercent
		{0, 100},        // no reading yet
	} {
		if got := h.For(c.live); got != c.want {
			t.Errorf("For(%d MiB) = %d, want %d", c.live/MiB, got, c.want)
		}
	}
	if got := (Headroom{Percent: 30, Floor: 8 * MiB, Ceiling: 4 * MiB}).For(16 * MiB); got != 50 {
		t.Errorf("a floor above the ceiling: %d, want the floor's 50", got)
	}
	if got := (Headroom{Percent: 30, Ceiling: 1}).For(1 << 30); got != 1 {
		t.Errorf("no least percent: %d, want 1 (GOGC=0 turns the collector off)", got)
	}
	if got := (Headroom{Percent: 30, Ceiling: 24 * MiB, LeastPercent: 50}).For(100 * MiB); got != 30 {
		t.Errorf("a least percent above the percent: %d, want the percent, 30, not more", got)
	}
	if got := (Headroom{Percent: 30, Ceiling: 1 << 62}).For(1); got != 30 {
		t.Errorf("a ceiling whose percentage does not fit 64 bits: %d, want 30", got)
	}
	if got := (Headroom{Percent: 30, Floor: 1 << 62}).For(1 << 20); got != 100 {
		t.Errorf("a floor whose percentage does not fit 64 bits: %d, want 100", got)
	}
}

// gogc reads the GOGC in effect.
func gogc() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

var keep []byte

// eventually collects until want accepts the GOGC in effect.
func eventually(t *testing.T, what string, want func(int) bool) {
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

// With a small live heap the tuner raises GOGC after a collection; with a
// live heap whose fraction exceeds the floor it lowers it back.
func TestTheTunerFollowsTheLiveHeap(t *testing.T) {
	stop := Start(Headroom{Percent: 30, Floor: 4 << 20})
	defer stop()
	keep = nil
	eventually(t, "a live heap of a few hundred kilobytes: Go's default", func(p int) bool { return p == 100 })
	keep = make([]byte, 256<<20)
	keep[len(keep)-1] = 1
	eventually(t, "a live heap of 256 MiB: the fraction", func(p int) bool { return p == 30 })
	keep = nil
	eventually(t, "the heap small again", func(p int) bool { return p == 100 })
	stop()
	runtime.GC()
	if p := gogc(); p != 30 {
		t.Errorf("after stop: GOGC %d, want 30", p)
	}
}

// With a ceiling, a live heap whose fraction exceeds it gets less than
// the fraction, and the fraction again once it is small.
func TestTheTunerBoundsALargeHeapsHeadroom(t *testing.T) {
	stop := Start(Headroom{Percent: 30, Floor: 4 << 20, Ceiling: 24 << 20, LeastPercent: 15})
	defer stop()
	keep = make([]byte, 128<<20)
	keep[len(keep)-1] = 1
	eventually(t, "a live heap of 128 MiB: 24 MiB of headroom", func(p int) bool { return p == 18 })
	keep = make([]byte, 40<<20)
	keep[len(keep)-1] = 1
	eventually(t, "a live heap of 40 MiB: the fraction", func(p int) bool { return p == 30 })
	keep = nil
}
