package apply

import (
	"fmt"
	"strings"
	"time"
)

// Wait is consul-template's quiescence: after a change, wait until nothing
// has changed for Min, but never longer than Max after the first change.
// A zero Min applies every change at once.
type Wait struct {
	Min, Max time.Duration
}

// ParseWait reads "min:max", or "min" alone (max is then 4×min, as
// consul-template does). "0" disables waiting.
func ParseWait(s string) (Wait, error) {
	lo, hi, two := strings.Cut(s, ":")
	minD, err := time.ParseDuration(strings.TrimSpace(lo))
	if err != nil {
		return Wait{}, fmt.Errorf("%q: min: %v", s, err)
	}
	maxD := 4 * minD
	if two {
		if maxD, err = time.ParseDuration(strings.TrimSpace(hi)); err != nil {
			return Wait{}, fmt.Errorf("%q: max: %v", s, err)
		}
	}
	switch {
	case minD < 0 || maxD < 0:
		return Wait{}, fmt.Errorf("%q: durations must not be negative", s)
	case maxD < minD:
		return Wait{}, fmt.Errorf("%q: max is shorter than min", s)
	}
	return Wait{Min: minD, Max: maxD}, nil
}

func (w Wait) String() string { return w.Min.String() + ":" + w.Max.String() }

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
