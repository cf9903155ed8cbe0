package apply

import (
	"runtime"
	"slices"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

func inst(name, id, addr, status string) model.Instance {
	return model.Instance{Name: name, ID: id, Address: addr, Port: 80, Status: status}
}

func TestChange(t *testing.T) {
	p := model.StatusPassing
	before := model.Catalog{Instances: []model.Instance{
		inst("web", "1", "10.0.0.1", p), inst("web", "2", "10.0.0.2", p), inst("old", "1", "10.0.1.1", p),
	}}
	for _, tc := range []struct {
		name  string
		after []model.Instance
		want  string
	}{
		{"nothing", before.Instances, "no service changed"},
		{"scale up and a new service", append(append([]model.Instance{}, before.Instances...),
			inst("web", "3", "10.0.0.3", p), inst("web", "4", "10.0.0.4", p), inst("api", "1", "10.0.2.1", p)),
			"api: new service (1 instance); web: +2 instances"},
		{"health and removal", []model.Instance{inst("web", "1", "10.0.0.1", model.StatusCritical)},
			"old: gone; web: -1 instance, 1 now critical"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Change(before, model.Catalog{Instances: tc.after}); got != tc.want {
				t.Errorf("got %q\nwant %q", got, tc.want)
			}
		})
	}
}

// Change walks two sorted catalogs side by side: at 1000 services × 10 it
// indexes neither (two maps of a thousand services at every change), and
// says what it said with them, sorted or not.
func TestChangeOfSortedCatalogsIndexesNeither(t *testing.T) {
	before, after := benchCatalog(1000, 10, false), benchCatalog(1000, 10, true)
	after.Instances = append(after.Instances[:20:20], after.Instances[30:]...) // svc0002 gone
	after.Instances = append(after.Instances, model.Instance{Source: "consul", Name: "zz", ID: "zz-1", Address: "10.9.9.9", Port: 80})
	want := "svc0002: gone; svc0500: 1 now critical; zz: new service (1 instance)"
	if got := Change(*before, *after); got != want {
		t.Errorf("Change: %q, want %q", got, want)
	}
	rev := func(c *model.Catalog) model.Catalog {
		r := *c
		r.Instances = slices.Clone(c.Instances)
		slices.Reverse(r.Instances)
		return r
	}
	if got := Change(rev(before), rev(after)); got != want {
		t.Errorf("Change of unsorted catalogs: %q, want %q", got, want)
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	Change(*before, *after)
	runtime.ReadMemStats(&m1)
	if n := m1.TotalAlloc - m0.TotalAlloc; n > 16<<10 {
		t.Errorf("Change allocated %d KiB; want a few, for the changed services alone", n>>10)
	}
}

// BenchmarkChangeOfOneService is the log line's summary of one change at
// 1000 services × 10, as every apply makes it.
func BenchmarkChangeOfOneService(b *testing.B) {
	before, after := benchCatalog(1000, 10, false), benchCatalog(1000, 10, true)
	for b.Loop() {
		Change(*before, *after)
	}
}
