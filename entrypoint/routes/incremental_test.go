package routes

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// A renderer that keeps its caches from one rendering to the next renders
// what a fresh one renders from the same committed table, whatever the
// sequence of changes: random changes of status, address, weight, tags
// (new routes, routes another service holds, TCP ports, bad tags),
// services coming and going, renderings HAProxy refuses (never
// committed), and the clock moving through drains. The fresh renderers
// plan from a table of their own, committed whole, never layered.
func TestRandomChangesRenderAsAFreshRenderer(t *testing.T) {
	seeds := []uint64{1, 2, 3, 4}
	steps := 150
	if testing.Short() {
		seeds, steps = seeds[:1], 50
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { randomChanges(t, seed, steps) })
	}
}

// FuzzRandomChanges is TestRandomChangesRenderAsAFreshRenderer over
// seeds of its own: go test -fuzz RandomChanges ./entrypoint/routes/
func FuzzRandomChanges(f *testing.F) {
	f.Add(uint64(5))
	f.Fuzz(func(t *testing.T, seed uint64) { randomChanges(t, seed, 60) })
}

func randomChanges(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, 7))
	now := time.Unix(1_700_000_000, 0)
	opts := Options{HTTPBind: "127.0.0.1:18080", HTTPSBind: "127.0.0.1:18443", CrtList: goldenCrtList,
		Slots: 2, DrainTimeout: 5 * time.Second, Now: func() time.Time { return now }, Table: NewSlotTable()}
	kept := mustNew(t, opts)
	fresh := opts
	fresh.Table = NewSlotTable()
	var cur []model.Instance
	for s := range 6 {
		for i := range 2 {
			cur = append(cur, inst(fmt.Sprintf("svc%d", s), fmt.Sprintf("svc%d-%d", s, i),
				fmt.Sprintf("10.0.%d.%d", s, i+1), 8080, fmt.Sprintf("seamless.http.host=svc%d.example", s)))
		}
	}
	for step := range steps {
		cur = randomChange(rng, slices.Clone(cur))
		now = now.Add(time.Duration(rng.IntN(4)) * time.Second)
		if rng.IntN(2) == 0 { // merged catalogs are sorted; the cache checks, and sorts others
			model.SortCatalog(&model.Catalog{Instances: cur})
		}
		state := catalog(cur...)
		got, gotPlan, gotSkips, err := kept.render(state)
		want, wantPlan, wantSkips, wantErr := mustNew(t, fresh).render(state)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("step %d: error %v, a fresh renderer's %v", step, err, wantErr)
		}
		if err != nil {
			continue
		}
		if !bytes.Equal(got.Config, want.Config) {
			t.Fatalf("step %d: the configurations differ:\n%s\n---- a fresh renderer's:\n%s", step, got.Config, want.Config)
		}
		if !reflect.DeepEqual(got.Servers.Flat(), want.Servers.Flat()) || !bytes.Equal(got.Structure, want.Structure) ||
			!got.Recheck.Equal(want.Recheck) {
			t.Fatalf("step %d: the slots, the structure or the recheck differ", step)
		}
		if !reflect.DeepEqual(got.Routes, want.Routes) || !slices.Equal(got.Skipped, want.Skipped) ||
			!reflect.DeepEqual(gotSkips, wantSkips) {
			t.Fatalf("step %d: routes or skips differ: %q, want %q", step, got.Skipped, want.Skipped)
		}
		if !reflect.DeepEqual(gotPlan.all(), wantPlan.all()) {
			t.Fatalf("step %d: the slot plans differ", step)
		}
		// The cache's routes are Build's, servers and all.
		rt, _ := buildCached(state.Local(), kept.policy, &kept.services)
		rt.shape = nil
		if fresh, _ := Build(state.Local(), kept.policy); !reflect.DeepEqual(rt, fresh) {
			t.Fatalf("step %d: the cached routes differ from Build's:\n%+v\n---- Build:\n%+v", step, rt, fresh)
		}
		if rng.IntN(4) > 0 { // else HAProxy refused it: nothing moves
			kept.commit(gotPlan, gotSkips)
			fresh.Table.commit(slotPlan{over: wantPlan.all()})
		}
	}
}

// randomChange changes one thing of insts.
func randomChange(rng *rand.Rand, insts []model.Instance) []model.Instance {
	if len(insts) == 0 {
		return []model.Instance{inst("svc0", "svc0-0", "10.0.0.1", 8080, "seamless.http.host=svc0.example")}
	}
	i := rng.IntN(len(insts))
	in := &insts[i]
	switch rng.IntN(10) {
	case 0:
		in.Status = []string{model.StatusPassing, model.StatusCritical, model.StatusWarning}[rng.IntN(3)]
	case 1:
		in.Address = fmt.Sprintf("10.1.%d.%d", rng.IntN(3), rng.IntN(3)+1)
	case 2:
		in.Weight = rng.IntN(3)
	case 3: // a route another service may hold
		in.Tags = append(slices.Clone(in.Tags), fmt.Sprintf("seamless.http.host=svc%d.example", rng.IntN(6)))
	case 4:
		in.Tags = append(slices.Clone(in.Tags), fmt.Sprintf("seamless.tcp.port=%d", 15000+rng.IntN(3)))
	case 5:
		in.Tags = append(slices.Clone(in.Tags), "seamless.http.path=no-slash")
	case 6:
		in.Tags = []string{fmt.Sprintf("seamless.http.host=svc%d.example", rng.IntN(6)), "seamless.http.path=/api"}
	case 7: // an instance leaves
		return slices.Delete(insts, i, i+1)
	case 8: // one joins, maybe of a new service
		s := rng.IntN(8)
		return append(insts, inst(fmt.Sprintf("svc%d", s), fmt.Sprintf("svc%d-%d", s, rng.IntN(100)),
			fmt.Sprintf("10.2.%d.%d", s, rng.IntN(200)+1), 8080, fmt.Sprintf("seamless.http.host=svc%d.example", s)))
	case 9:
		in.Tags = append(slices.Clone(in.Tags), "seamless.http.tls=redirect")
	}
	return insts
}
