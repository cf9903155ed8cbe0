package apply

import (
	"testing"
	"testing/synctest"
	"time"
)

func TestDebouncer(t *testing.T) {
	t.Run("quiet for min fires once", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d := newDebouncer(Wait{Min: time.Second, Max: 10 * time.Second})
			start := time.Now()
			for range 3 {
				d.touch()
				time.Sleep(500 * time.Millisecond)
			}
			<-d.C()
			d.fired()
			// last touch at 1.0 s, quiet for 1 s after it
			if got := time.Since(start); got != 2*time.Second {
				t.Errorf("fired after %v, want 2s", got)
			}
		})
	})
	t.Run("a steady stream fires at max", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d := newDebouncer(Wait{Min: time.Second, Max: 3 * time.Second})
			start := time.Now()
			fired := false
			for !fired {
				d.touch()
				select {
				case <-d.C():
					fired = true
				case <-time.After(900 * time.Millisecond):
				}
			}
			if got := time.Since(start); got != 3*time.Second {
				t.Errorf("fired after %v, want max 3s", got)
			}
		})
	})
	t.Run("zero wait fires at once", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d := newDebouncer(Wait{})
			start := time.Now()
			d.touch()
			<-d.C()
			if got := time.Since(start); got != 0 {
				t.Errorf("fired after %v", got)
			}
		})
	})
}
