package main

import (
	"runtime"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

// Without GOGC, the collector's headroom is 30 % of the live heap, raised
// towards minHeadroom: seamless's own heap here is a few megabytes, so
// GOGC goes above 30 once a collection measured it (to 100 under 4 MiB of
// live heap). GOGC set by the operator wins.
func TestTheCollectorsHeadroom(t *testing.T) {
	for _, tt := range []struct {
		gogc     string
		min, max float64
	}{
		{"", defaultGOGC + 1, 100},
		{"50", 50, 50},
		{"200", 200, 200},
	} {
		t.Run("GOGC="+tt.gogc, func(t *testing.T) {
			_, _, in := serving(t, 1, startOpts{env: []string{"GOGC=" + tt.gogc}})
			var got float64
			testenv.EventuallyExplained(t, 10*time.Second, "go_gc_gogc_percent in effect", func() bool {
				got = in.metric("go_gc_gogc_percent")
				return tt.min <= got && got <= tt.max
			}, func() { t.Logf("go_gc_gogc_percent is %v with GOGC=%q; want %v to %v", got, tt.gogc, tt.min, tt.max) })
		})
	}
}

// Without GOMAXPROCS, seamless's small heap runs on one processor;
// GOMAXPROCS set by the operator wins.
func TestOneProcessorForASmallHeap(t *testing.T) {
	was := runtime.GOMAXPROCS(0)
	runtime.SetDefaultGOMAXPROCS() // what seamless would run on without the bound
	if runtime.GOMAXPROCS(was) == 1 {
		t.Skip("Go's default here is one processor already")
	}
	for _, tt := range []struct {
		env  string
		want float64
	}{
		{"", 1},
		{"2", 2},
	} {
		t.Run("GOMAXPROCS="+tt.env, func(t *testing.T) {
			_, _, in := serving(t, 1, startOpts{env: []string{"GOMAXPROCS=" + tt.env}})
			if got := in.metric("go_sched_gomaxprocs_threads"); got != tt.want {
				t.Errorf("go_sched_gomaxprocs_threads is %v with GOMAXPROCS=%q; want %v", got, tt.env, tt.want)
			}
		})
	}
}
