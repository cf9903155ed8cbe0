package gomaxprocs

import (
	"runtime"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

func TestManyBetweenTheBounds(t *testing.T) {
	const MiB = 1 << 20
	b := Bounds{Up: 32 * MiB, Down: 24 * MiB}
	for _, c := range []struct {
		live       uint64
		many, want bool
	}{
		{0, false, false},        // no reading yet
		{4 * MiB, true, false},   // small: one
		{24 * MiB, false, false}, // between: as it was
		{24 * MiB, true, true},
		{31 * MiB, false, false},
		{32 * MiB, false, true}, // large: many
		{160 * MiB, true, true},
		{23 * MiB, true, false}, // small again
	} {
		if got := b.Many(c.live, c.many); got != c.want {
			t.Errorf("Many(%d MiB, %v) = %v, want %v", c.live/MiB, c.many, got, c.want)
		}
	}
}

var keep []byte

// procsUntil collects until GOMAXPROCS is want: the watch runs after a
// collection.
func procsUntil(t *testing.T, what string, want int) {
	t.Helper()
	testenv.EventuallyExplained(t, 10*time.Second, what, func() bool { runtime.GC(); return runtime.GOMAXPROCS(0) == want },
		func() { t.Logf("GOMAXPROCS is %d, want %d", runtime.GOMAXPROCS(0), want) })
}

// One processor while the heap is small, Go's default while it is large,
// and the default after stop.
func TestTheProcessorsFollowTheLiveHeap(t *testing.T) {
	was := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(was) })
	runtime.SetDefaultGOMAXPROCS() // what Start goes up to, whatever GOMAXPROCS says
	all := runtime.GOMAXPROCS(0)
	if all == 1 {
		t.Skip("Go's default here is one processor: nothing would change")
	}
	stop := Start(Bounds{Up: 64 << 20, Down: 32 << 20})
	defer stop()
	if n := runtime.GOMAXPROCS(0); n != 1 {
		t.Fatalf("at start: GOMAXPROCS %d, want 1", n)
	}
	keep = make([]byte, 128<<20)
	keep[len(keep)-1] = 1
	procsUntil(t, "a live heap of 128 MiB", all)
	keep = nil
	procsUntil(t, "the heap small again", 1)
	stop()
	if n := runtime.GOMAXPROCS(0); n != all {
		t.Errorf("after stop: GOMAXPROCS %d, want %d", n, all)
	}
}
