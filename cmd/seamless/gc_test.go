package main

import "testing"

// Without GOGC, the collector keeps half the live heap as headroom
// instead of all of it; GOGC set by the operator wins.
func TestTheCollectorsHeadroom(t *testing.T) {
	for _, tt := range []struct {
		gogc string
		want float64
	}{
		{"", defaultGOGC},
		{"100", 100},
		{"200", 200},
	} {
		t.Run("GOGC="+tt.gogc, func(t *testing.T) {
			_, _, in := serving(t, 1, startOpts{env: []string{"GOGC=" + tt.gogc}})
			if got := in.metric("go_gc_gogc_percent"); got != tt.want {
				t.Errorf("go_gc_gogc_percent is %v with GOGC=%q; want %v", got, tt.gogc, tt.want)
			}
		})
	}
}
