package backoff

import (
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	b := New(250*time.Millisecond, 30*time.Second)
	for i, top := range []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second} {
		if d := b.Next(); d < top/2 || d > top {
			t.Errorf("attempt %d waits %s, want %s-%s", i, d, top/2, top)
		}
	}
	for range 40 {
		if d := b.Next(); d > 30*time.Second {
			t.Fatalf("waits %s, past the cap", d)
		}
	}
	b.Reset()
	if d := b.Next(); d > 250*time.Millisecond {
		t.Errorf("after Reset waits %s", d)
	}
	if d := New(250*time.Millisecond, 50*time.Millisecond).Next(); d > 50*time.Millisecond {
		t.Errorf("waits %s, longer than the cap", d)
	}
}
