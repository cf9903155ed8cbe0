package apply

import (
	"time"

	"github.com/seamless-lb/seamless/entrypoint/config"
)

// Wait is consul-template's quiescence: after a change, wait until nothing
// has changed for Min, but never longer than Max after the first change.
// A zero Min applies every change at once.
type Wait = config.Wait

// debouncer turns a stream of changes into apply times under a Wait. It is
// used by one goroutine only.
type debouncer struct {
	wait  Wait
	first time.Time // of the changes not yet applied; zero: none
	timer *time.Timer
}

func newDebouncer(w Wait) *debouncer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &debouncer{wait: w, timer: t}
}

// C fires when the pending changes are due.
func (d *debouncer) C() <-chan time.Time { return d.timer.C }

// touch records a change now.
func (d *debouncer) touch() {
	now := time.Now()
	if d.first.IsZero() {
		d.first = now
	}
	in := min(d.wait.Min, d.first.Add(d.wait.Max).Sub(now))
	d.timer.Reset(max(in, 0))
}

// fired is called once C has fired.
func (d *debouncer) fired() { d.first = time.Time{} }
