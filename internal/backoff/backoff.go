// Package backoff is the exponential backoff with jitter that the
// discovery sources retry with.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Backoff waits, at attempt n, a random time between half and all of
// Min·2ⁿ, capped at Max. The zero value is not useful; use New.
type Backoff struct {
	min, max time.Duration
	attempt  int
}

// New returns a Backoff from minWait up to maxWait (minWait is lowered to
// maxWait if it is longer).
func New(minWait, maxWait time.Duration) *Backoff {
	return &Backoff{min: min(minWait, maxWait), max: maxWait}
}

// Next returns how long to wait before the next attempt.
func (b *Backoff) Next() time.Duration {
	d := b.max
	if b.attempt < 32 {
		if e := b.min << b.attempt; e > 0 && e < b.max {
			d = e
		}
	}
	b.attempt++
	return d/2 + rand.N(d/2+1)
}

// Reset starts again from the shortest wait, after a success.
func (b *Backoff) Reset() { b.attempt = 0 }
