// Package gomaxprocs runs Go code on one processor while the live heap is
// small, and on as many as Go's default gives (the CPUs, or the
// container's CPU limit) once it is large.
//
// A process whose work is short, sequential bursts (a change in, a
// configuration out) gains nothing from a second processor, and pays for
// it: each wake-up of a goroutine makes another thread spin looking for
// work before it sleeps again, and the runtime's monitor runs while any
// does. A large heap has work to share (the collector's marking beside
// the decoding and rendering of a large catalog), so it gets them all.
package gomaxprocs

import (
	"runtime"

	"github.com/seamless-lb/seamless/internal/gcwatch"
)

// Bounds are the live heaps between which the processors change. Between
// Down and Up they stay as they are, so that a heap near one bound does
// not switch at every collection (each switch stops the world).
type Bounds struct {
	// Up: from this live heap on, Go's default.
	Up uint64
	// Down: below this live heap, one processor.
	Down uint64
}

// Many reports whether a live heap of live bytes runs on Go's default
// processors, given whether it does now.
func (b Bounds) Many(live uint64, many bool) bool {
	switch {
	case live >= b.Up:
		return true
	case live < b.Down:
		return false
	}
	return many
}

// Start runs Go code on one processor, and after each collection on
// what b asks for the heap it found live. The returned stop ends that and
// puts Go's default back.
func Start(b Bounds) (stop func()) {
	many := false
	runtime.GOMAXPROCS(1)
	end := gcwatch.Start(func(live uint64) {
		was := many
		many = b.Many(live, many)
		switch {
		case many:
			// Go's default, set again after every collection (it stops
			// the world only when it changes something): a change of the
			// CPU limit that met a switch to one processor ends the
			// runtime's own updates for good.
			runtime.SetDefaultGOMAXPROCS()
		case was:
			runtime.GOMAXPROCS(1)
		}
	})
	return func() {
		end()
		runtime.SetDefaultGOMAXPROCS()
	}
}
