// Package gcheadroom keeps the garbage collector's headroom above the
// live heap a fraction of it (GOGC), raised towards a floor as far as
// Go's default GOGC of 100 allows, and lowered towards a ceiling as far as
// a least fraction allows.
//
// A low GOGC keeps a large heap small, and on a small one makes the
// collector run after every few hundred kilobytes: at 100 services × 10
// instances seamless's live heap is about 4 MB, and GOGC=30 collected it
// every megabyte, more than once per change. The floor spaces those
// collections at a cost of a few megabytes, which a large heap's fraction
// exceeds anyway. What a change allocates grows more slowly than the
// catalog, so on a large heap the fraction is memory that only spaces
// collections further apart than changes need: the ceiling bounds it.
package gcheadroom

import (
	"math"
	"runtime/debug"

	"github.com/seamless-lb/seamless/internal/gcwatch"
)

// maxPercent is the most the floor raises GOGC to: Go's default.
const maxPercent = 100

// Headroom is how far the heap may grow over the live heap before the
// next collection.
type Headroom struct {
	// Percent of the live heap, as GOGC.
	Percent int
	// Floor: at least this many bytes, as far as a GOGC of
	// max(Percent, 100) allows.
	Floor uint64
	// Ceiling: at most this many bytes, as far as a GOGC of LeastPercent
	// allows (at least 1). 0: no ceiling.
	Ceiling      uint64
	LeastPercent int
}

// For is the GOGC that gives live bytes of heap the headroom h asks for.
// The floor wins over the ceiling.
func (h Headroom) For(live uint64) int {
	if live == 0 {
		return max(h.Percent, maxPercent)
	}
	p := h.Percent
	if h.Ceiling > 0 {
		p = max(min(p, percentOf(h.Ceiling, live, math.Floor)), min(h.LeastPercent, p), 1)
	}
	need := percentOf(h.Floor, live, math.Ceil)
	return min(max(p, need), max(h.Percent, maxPercent))
}

// percentOf is bytes as a percentage of live, rounded by round, at most
// a billion: in floating point, since bytes*100 may not fit 64 bits.
func percentOf(bytes, live uint64, round func(float64) float64) int {
	return int(min(round(float64(bytes)*100/float64(live)), 1e9))
}

// Start sets GOGC to h.Percent, tuned after each collection to what h
// asks for the heap it found live (Headroom.For). The returned stop puts
// h.Percent back and ends the tuning.
func Start(h Headroom) (stop func()) {
	set := h.Percent
	debug.SetGCPercent(set)
	end := gcwatch.Start(func(live uint64) {
		if p := h.For(live); p != set {
			set = p
			debug.SetGCPercent(p)
		}
	})
	return func() {
		end()
		debug.SetGCPercent(h.Percent)
	}
}
