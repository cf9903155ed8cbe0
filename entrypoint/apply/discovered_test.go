package apply

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/seamless-lb/seamless/entrypoint/metrics"
	"github.com/seamless-lb/seamless/entrypoint/model"
)

// Counting the discovered services at every change walks the catalog in
// its order (a merged catalog is sorted by name) and keeps no set of
// names: 1,000 of them per change at 1000×10.
func TestCountingDiscoveredAllocatesNothing(t *testing.T) {
	a := &Applier{opts: Options{Metrics: metrics.New()}}
	a.applied = *benchCatalog(1000, 10, false)
	a.applied.Instances = append(a.applied.Instances, model.Instance{Source: "consul", Name: "consul", Node: "n1", ID: "n1/consul"})
	model.SortCatalog(&a.applied)
	if n := testing.AllocsPerRun(10, a.countDiscovered); n > 0 {
		t.Errorf("counting 10,000 instances allocated %.0f times; want none", n)
	}
	m := a.opts.Metrics.Discovered
	if s, i := testutil.ToFloat64(m.WithLabelValues("services")), testutil.ToFloat64(m.WithLabelValues("instances")); s != 1000 || i != 10000 {
		t.Errorf("counted %v services, %v instances; want 1000 and 10000 (Consul itself left out)", s, i)
	}
}

// A catalog out of order (not a merged one) is still counted right.
func TestCountingDiscoveredInAnyOrder(t *testing.T) {
	a := &Applier{opts: Options{Metrics: metrics.New()}}
	a.applied = model.Catalog{Instances: []model.Instance{{Name: "b", ID: "1"}, {Name: "a", ID: "1"}, {Name: "b", ID: "2"}}}
	a.countDiscovered()
	m := a.opts.Metrics.Discovered
	if s, i := testutil.ToFloat64(m.WithLabelValues("services")), testutil.ToFloat64(m.WithLabelValues("instances")); s != 2 || i != 3 {
		t.Errorf("counted %v services, %v instances; want 2 and 3", s, i)
	}
}
