package routes

import (
	"runtime"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// One instance's change must allocate what its backend costs, not what
// the catalog does: a rendering shares what did not change with the one
// before. Rendering the same change at 100 and at 1000 services × 10
// instances allocates as many objects, and as many bytes within a margin
// of a few backends but for two things that grow with the catalog: the
// configuration's text (one block, as long as the configuration) and the
// rendering's list of its backends' slot lists (model.Slots, 24 bytes a
// backend). A bound on allocations, not a timing.
func TestOneChangeAllocatesForOneBackendNotTheCatalog(t *testing.T) {
	if testing.Short() {
		t.Skip("renders 1000 services")
	}
	type cost struct{ allocs, bytes, text float64 }
	measure := func(services int) cost {
		states := [2]model.State{benchState(services, 10, false), benchState(services, 10, true)}
		r := mustNew(t, Options{HTTPBind: "127.0.0.1:18080", Slots: 16, Now: func() time.Time { return time.Unix(1e9, 0) }})
		render(t, r, states[0])
		render(t, r, states[1]) // every cache warm for both states
		const runs = 20
		var text int
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := range runs {
			out, err := r.Render(states[i%2])
			if err != nil {
				t.Fatal(err)
			}
			out.Commit()
			text += len(out.Config)
		}
		runtime.ReadMemStats(&after)
		return cost{
			allocs: float64(after.Mallocs-before.Mallocs) / runs,
			bytes:  float64(after.TotalAlloc-before.TotalAlloc) / runs,
			text:   float64(text) / runs,
		}
	}
	small, large := measure(100), measure(1000)
	t.Logf("per rendering of one change: 100 services: %.0f allocations, %.0f bytes (text %.0f); 1000 services: %.0f allocations, %.0f bytes (text %.0f)",
		small.allocs, small.bytes, small.text, large.allocs, large.bytes, large.text)
	// One backend of 16 slots: its servers, slots and text come to some
	// 5 KiB and 60 objects. 900 more backends' lists take 21 KiB.
	const backendBytes, backendAllocs = 5 << 10, 60
	if grew := large.allocs - small.allocs; grew > 2*backendAllocs {
		t.Errorf("1000 services allocate %.0f objects more than 100 per change: the rendering allocates for the catalog, not for the change", grew)
	}
	if grew := (large.bytes - large.text) - (small.bytes - small.text); grew > 8*backendBytes {
		t.Errorf("1000 services allocate %.0f bytes more than 100 per change, the text aside: the rendering allocates for the catalog, not for the change", grew)
	}
}

// A service's servers are kept for as long as it does not change: their
// list holds no spare room (append's growth left 16 places for 10
// servers, 7 MB of the live heap at 10,000 services × 10).
func TestBuiltServersKeepNoSpareRoom(t *testing.T) {
	st := benchState(1, 10, false)
	c, ok := buildService(st.Local().Instances, Policy{}, &skips{})
	if !ok {
		t.Fatal("the service is not built")
	}
	if len(c.servers) != 10 || cap(c.servers) != len(c.servers) {
		t.Errorf("servers: %d, room for %d; want 10 and no spare room", len(c.servers), cap(c.servers))
	}
}
