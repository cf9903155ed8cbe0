package main

import (
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

// Without GOGC, the collector's headroom is 30 % of the live heap but
// never under minHeadroom: seamless's own heap here is a few megabytes,
// so GOGC goes to Go's default once a collection measured it. GOGC set by
// the operator wins.
func TestTheCollectorsHeadroom(t *testing.T) {
	for _, tt := range []struct {
		gogc string
		want float64
	}{
		{"", 100},
		{"50", 50},
		{"200", 200},
	} {
		t.Run("GOGC="+tt.gogc, func(t *testing.T) {
			_, _, in := serving(t, 1, startOpts{env: []string{"GOGC=" + tt.gogc}})
			var got float64
			testenv.EventuallyExplained(t, 10*time.Second, "go_gc_gogc_percent in effect", func() bool {
				got = in.metric("go_gc_gogc_percent")
				return got == tt.want
			}, func() { t.Logf("go_gc_gogc_percent is %v with GOGC=%q; want %v", got, tt.gogc, tt.want) })
		})
	}
}
