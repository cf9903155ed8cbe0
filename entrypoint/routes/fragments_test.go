package routes

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// A renderer that keeps its backends' text from one rendering to the next
// renders the bytes and the structure that a fresh renderer (with the same
// committed slots) renders, through a series of changes that each touch
// one input of a backend: a status, an address, a weight, a redirect, a
// service gone and back, a new TCP port, a bad tag, a conflict, and an option of the whole view.
// It executes only the backends that changed.
func TestIncrementalRenderingEqualsAFreshOne(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	base := func() []model.Instance {
		var out []model.Instance
		for s := range 5 {
			for i := range 3 {
				out = append(out, inst(fmt.Sprintf("svc%d", s), fmt.Sprintf("svc%d-%d", s, i), fmt.Sprintf("10.0.%d.%d", s, i+1), 8080,
					fmt.Sprintf("seamless.http.host=svc%d.example", s)))
			}
		}
		return out
	}
	var gone []model.Instance
	steps := []struct {
		name    string
		change  func([]model.Instance) []model.Instance
		opts    func(*Options)
		execute int // backends executed
	}{
		{name: "first", change: func(in []model.Instance) []model.Instance { return in }, execute: 5},
		{name: "same again", change: func(in []model.Instance) []model.Instance { return in }, execute: 0},
		{name: "one instance critical", change: func(in []model.Instance) []model.Instance {
			in[4].Status = model.StatusCritical
			return in
		}, execute: 1},
		{name: "one address", change: func(in []model.Instance) []model.Instance {
			in[7].Address = "10.9.9.9"
			return in
		}, execute: 1},
		{name: "one weight", change: func(in []model.Instance) []model.Instance {
			in[10].Weight = 7
			return in
		}, execute: 1},
		{name: "redirect to HTTPS", change: func(in []model.Instance) []model.Instance {
			in[0].Tags = append(in[0].Tags, "seamless.http.tls=redirect")
			return in
		}, execute: 1},
		{name: "a service gone", change: func(in []model.Instance) []model.Instance {
			gone = in[:3]
			return in[3:]
		}, execute: 0},
		{name: "and back", change: func(in []model.Instance) []model.Instance { return append(slices.Clone(gone), in...) }, execute: 1},
		{name: "a TCP port", change: func(in []model.Instance) []model.Instance {
			for i := 12; i < 15; i++ {
				in[i].Tags = append(in[i].Tags, "seamless.tcp.port=15432")
			}
			return in
		}, execute: 1},
		{name: "a bad tag", change: func(in []model.Instance) []model.Instance {
			in[4].Tags = append(slices.Clone(in[4].Tags), "seamless.http.path=no-slash")
			return in
		}, execute: 0}, // a critical instance: no server either way
		// svc1 sorts first: svc3 loses its only route, and its backend.
		{name: "a route another service holds", change: func(in []model.Instance) []model.Instance {
			in[5].Tags = append(slices.Clone(in[5].Tags), "seamless.http.host=svc3.example")
			return in
		}, execute: 0},
		{name: "the state file option", opts: func(o *Options) { o.StateFile = "" },
			change: func(in []model.Instance) []model.Instance { return in }, execute: 5},
	}
	for _, drain := range []time.Duration{0, 10 * time.Second} {
		t.Run(fmt.Sprintf("drain %v", drain), func(t *testing.T) {
			now := now // moves 3s a step: with a drain, removed instances drain, then free their slot
			opts := Options{HTTPBind: "127.0.0.1:18080", HTTPSBind: "127.0.0.1:18443", CrtList: goldenCrtList,
				StatsBind: "127.0.0.1:18404", Slots: 4, DrainTimeout: drain, StateFile: "/tmp/seamless-routes-state",
				Now: func() time.Time { return now }, Table: NewSlotTable()}
			kept := mustNew(t, opts)
			cur := base()
			for _, st := range steps {
				t.Run(st.name, func(t *testing.T) {
					if st.opts != nil {
						st.opts(&opts)
						kept = mustNew(t, opts) // a SIGHUP: a new renderer on the same table
					}
					now = now.Add(3 * time.Second)
					cur = st.change(slices.Clone(cur))
					state := catalog(cur...)
					before := kept.frags.executed
					got, err := kept.Render(state)
					if err != nil {
						t.Fatal(err)
					}
					want, err := mustNew(t, opts).Render(state)
					if err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got.Config, want.Config) {
						t.Fatalf("the kept renderer's configuration differs from a fresh one's:\n%s\n---- want\n%s", got.Config, want.Config)
					}
					// The routes and skips of the uncached Build.
					rt, skips := Build(state.Local(), kept.policy)
					var wantSkipped []string
					for _, s := range skips {
						wantSkipped = append(wantSkipped, s.String())
					}
					if !slices.Equal(got.Skipped, wantSkipped) || !reflect.DeepEqual(got.Routes, statusRoutes(rt)) {
						t.Errorf("skipped %q, want %q; or the routes differ", got.Skipped, wantSkipped)
					}
					if !bytes.Equal(got.Structure, want.Structure) {
						t.Error("the structures differ")
					}
					if !reflect.DeepEqual(got.Servers.Flat(), want.Servers.Flat()) || !got.Recheck.Equal(want.Recheck) {
						t.Error("the slots or the recheck differ")
					}
					if n := kept.frags.executed - before; n != st.execute && drain == 0 {
						t.Errorf("executed %d backends, want %d", n, st.execute)
					}
					got.Commit()
				})
			}
		})
	}
}

// The configuration rendered in parts is the template executed whole,
// which is also what a template without a top-level range over .Backends
// gets.
func TestRenderingInPartsIsTheWholeTemplate(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	opts := Options{HTTPBind: "127.0.0.1:18080", HTTPSBind: "127.0.0.1:18443", CrtList: goldenCrtList,
		StatsBind: "127.0.0.1:18404", Slots: 4, Now: func() time.Time { return now }}
	st := catalog(
		inst("shop", "shop-1", "10.0.0.1", 8080, "seamless.http.host=shop.example", "seamless.http.tls=redirect"),
		inst("pg", "pg-1", "10.0.0.2", 5432, "seamless.tcp.port=15432"),
		inst("web", "web-1", "10.0.0.3", 8080, "seamless.http.path=/"))
	parts, err := mustNew(t, opts).Render(st)
	if err != nil {
		t.Fatal(err)
	}
	split, back := mainTmpl, backendTmpl
	mainTmpl, backendTmpl = nil, nil
	t.Cleanup(func() { mainTmpl, backendTmpl = split, back })
	whole, err := mustNew(t, opts).Render(st)
	if err != nil {
		t.Fatal(err)
	}
	if split == nil || !bytes.Equal(parts.Config, whole.Config) {
		t.Fatalf("in parts:\n%s\n---- whole:\n%s", parts.Config, whole.Config)
	}
}

// A backend's text is kept once: as the part of the last configuration
// that holds it, not as a copy beside it. After a change, the unchanged
// backends' texts move into the new configuration too, so that the last
// one is not kept alive by them.
func TestBackendTextsAreKeptInTheConfiguration(t *testing.T) {
	var insts []model.Instance
	for s := range 4 {
		insts = append(insts, inst(fmt.Sprintf("svc%d", s), fmt.Sprintf("svc%d-0", s), fmt.Sprintf("10.0.%d.1", s), 8080,
			fmt.Sprintf("seamless.http.host=svc%d.example", s)))
	}
	r := mustNew(t, Options{HTTPBind: "127.0.0.1:18080", Slots: 4, Table: NewSlotTable()})
	var last []byte
	for step := range 2 {
		if step == 1 {
			insts[2].Address = "10.9.9.9"
		}
		rend, err := r.Render(catalog(slices.Clone(insts)...))
		if err != nil {
			t.Fatal(err)
		}
		rend.Commit()
		if len(r.frags.order) != 4 {
			t.Fatalf("%d backends kept, want 4", len(r.frags.order))
		}
		cfg := rend.Config
		for _, fr := range r.frags.order {
			if !within(fr.text, cfg) {
				t.Errorf("step %d: a backend's text is a copy beside the configuration", step)
			}
		}
		// The changed backend's old fragment, kept for reuse, would keep
		// the whole last configuration (7.8 MB at 10,000 backends).
		for _, m := range []map[string]*fragment{r.frags.cache, r.frags.spare} {
			for name, fr := range m {
				if within(fr.text, last) {
					t.Errorf("step %d: backend %s's kept fragment holds the last configuration", step, name)
				}
			}
		}
		last = cfg
	}
}

// within reports whether part is a slice of whole's memory.
func within(part, whole []byte) bool {
	if len(part) == 0 || len(whole) == 0 {
		return false
	}
	p, w := uintptr(unsafe.Pointer(&part[0])), uintptr(unsafe.Pointer(&whole[0]))
	return p >= w && p+uintptr(len(part)) <= w+uintptr(len(whole))
}
