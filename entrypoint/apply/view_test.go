package apply

import (
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/entrypoint/routes"
)

// A change publishes the running rendering for /status without copying
// its slots or indexing the catalog: at 1000 services × 10 that was a
// copy of 16,000 slots and a map of 10,000 instances at every change.
// Running makes the view when asked, once per change.
func TestPublishingAChangeCopiesNothing(t *testing.T) {
	r, err := routes.New(routes.Options{HTTPBind: "127.0.0.1:18080", Slots: 16}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cat := benchCatalog(1000, 10, false)
	rend, err := r.Render(model.NewState(map[model.Query]model.Result{model.LocalCatalog: {Catalog: cat}}))
	if err != nil {
		t.Fatal(err)
	}
	a := &Applier{runRend: &rend, applied: *cat}
	if n := testing.AllocsPerRun(10, a.publish); n > 0 {
		t.Errorf("publishing a change allocated %.0f times; want none", n)
	}
	v := a.Running()
	if len(v.Slots) != rend.Servers.Len() || len(v.Health) != len(v.Slots) {
		t.Fatalf("the view holds %d slots and %d health states, want %d", len(v.Slots), len(v.Health), rend.Servers.Len())
	}
	filled := 0
	for i, s := range v.Slots {
		if s.Instance != "" {
			filled++
			if v.Health[i] != model.StatusPassing {
				t.Errorf("slot %s/%s of %s: health %q, want passing", s.Backend, s.Server, s.Instance, v.Health[i])
			}
		}
	}
	if filled != 10000 {
		t.Errorf("%d slots filled, want 10000", filled)
	}
	if n := testing.AllocsPerRun(10, func() { a.Running() }); n > 0 {
		t.Errorf("asking again for an unchanged view allocated %.0f times; want none", n)
	}
}
