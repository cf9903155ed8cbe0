package apply

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// counting counts the renders of the renderer it wraps.
type counting struct {
	model.Renderer
	n atomic.Int64
}

func (c *counting) Render(st model.State) (model.Rendering, error) {
	c.n.Add(1)
	return c.Renderer.Render(st)
}

// Each state renders once: at start, the state with no data (which says
// what to fetch) and then the state after each snapshot; in Run, once per
// change.
func TestEachStateRendersOnce(t *testing.T) {
	src := newSource("consul")
	c := &counting{Renderer: lines{}}
	r := newRig(t, t.TempDir(), c, src)
	src.send("web=10.0.0.1")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	if n := c.n.Load(); n != 2 {
		t.Errorf("Start rendered %d times, want 2: the empty state, then the source's first snapshot", n)
	}
	r.run(t)
	for i := 2; i <= 4; i++ {
		before := c.n.Load()
		src.send("web=10.0.0." + string(rune('0'+i)))
		testenv.Eventually(t, 5*time.Second, "the change is applied", func() bool { return r.reloadCount() == i-1 })
		if n := c.n.Load() - before; n != 1 {
			t.Errorf("change %d rendered %d times, want 1", i, n)
		}
	}
}
