package apply

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// The Consul index behind what runs follows the source: with a change
// (applied), and without one (the same data, newer: nothing to apply, but
// the running configuration is as recent as that).
func TestTheConsulIndexBehindWhatRuns(t *testing.T) {
	src := newSource("consul")
	r := newRig(t, t.TempDir(), lines{}, src)
	send := func(index uint64, instances ...string) {
		c := &model.Catalog{Datacenter: "dc1", Index: index}
		for _, s := range instances {
			name, addr, _ := strings.Cut(s, "=")
			c.Instances = append(c.Instances, model.Instance{Source: "consul", Name: name, ID: addr, Address: addr, Port: 80, Status: model.StatusPassing})
		}
		src.ch <- model.Snapshot{Source: "consul", Results: map[model.Query]model.Result{model.LocalCatalog: {Catalog: c}}}
	}
	index := func() uint64 { return r.a.Running().ConsulIndex["dc1"] }
	metric := func() float64 { return testutil.ToFloat64(r.m.ConsulIndex.WithLabelValues("dc1")) }

	send(5, "web=10.0.0.1")
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	r.run(t)
	if index() != 5 || metric() != 5 {
		t.Errorf("at start: index %d, metric %v; want 5", index(), metric())
	}
	send(9, "web=10.0.0.1", "web=10.0.0.2")
	testenv.Eventually(t, 5*time.Second, "the change applied, at its index", func() bool { return index() == 9 && metric() == 9 })
	applies := len(r.a.History())
	send(12, "web=10.0.0.1", "web=10.0.0.2")
	testenv.Eventually(t, 5*time.Second, "the same data at a newer index shown", func() bool { return index() == 12 && metric() == 12 })
	if n := len(r.a.History()); n != applies {
		t.Errorf("%d applies for the same data at a newer index, want none", n-applies)
	}
}
