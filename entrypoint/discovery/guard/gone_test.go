package guard

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

func bigCatalog(services, per int) *model.Catalog {
	c := &model.Catalog{}
	for s := range services {
		for i := range per {
			c.Instances = append(c.Instances, model.Instance{Source: "consul", Name: fmt.Sprintf("svc-%04d", s),
				ID: fmt.Sprintf("node-%d/svc-%04d-%d", i, s, i), Node: fmt.Sprintf("node-%d", i), Address: "10.0.0.1", Port: 1000 + i})
		}
	}
	model.SortCatalog(c)
	return c
}

// Comparing a snapshot with the last one costs what changed, not a map of
// the whole catalog (1 MiB at 1,000 services × 10, at every change).
func TestHoldAllocatesNothingForACatalogThatMovedOneInstance(t *testing.T) {
	g := Wrap(&fake{in: make(chan model.Snapshot)}, Options{Percent: 50, Hold: time.Minute, Log: slog.New(slog.DiscardHandler)}).(*Guard)
	prev := bigCatalog(1000, 10)
	cur := &model.Catalog{Instances: append([]model.Instance(nil), prev.Instances...)}
	cur.Instances[5005].Port = 2000 // moved: the same instance
	cur.Instances = append(cur.Instances[:7001:7001], cur.Instances[7002:]...)
	g.sent[model.LocalCatalog] = prev
	s := model.Snapshot{Source: "consul", Results: map[model.Query]model.Result{model.LocalCatalog: {Catalog: cur}}}
	res := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			g.hold(s, time.Now())
		}
	})
	if n := res.AllocedBytesPerOp(); n > 1024 {
		t.Errorf("hold allocated %d bytes for a catalog of 10,000 instances that lost one; want at most 1 KiB", n)
	}
	if len(g.held) != 0 {
		t.Errorf("one instance of 10,000 gone is held: %v", g.held)
	}
}

// gone finds the same instances with and without a sorted catalog.
func TestGoneSortedAndUnsortedAgree(t *testing.T) {
	prev := bigCatalog(20, 5)
	cur := append([]model.Instance(nil), prev.Instances...)
	cur = append(cur[:3:3], cur[9:]...) // 6 gone, across two services
	cur[40].Port = 1                    // moved, not gone
	want := []string{}
	for _, in := range prev.Instances[3:9] {
		want = append(want, in.ID)
	}
	sorted := gone(prev, &model.Catalog{Instances: cur}, nil)
	shuffled := append([]model.Instance(nil), cur...)
	for i, j := 0, len(shuffled)-1; i < j; i, j = i+1, j-1 {
		shuffled[i], shuffled[j] = shuffled[j], shuffled[i]
	}
	unsorted := gone(prev, &model.Catalog{Instances: shuffled}, nil)
	for _, got := range [][]model.Instance{sorted, unsorted} {
		ids := []string{}
		for _, in := range got {
			ids = append(ids, in.ID)
		}
		if fmt.Sprint(ids) != fmt.Sprint(want) {
			t.Errorf("gone = %v, want %v", ids, want)
		}
	}
}

// A catalog its source only re-dated (the same instances at a newer
// index) against the one before, at 1,000 services × 10:
//
//	go test -run - -bench GoneOfARedatedCatalog ./entrypoint/discovery/guard/
func BenchmarkGoneOfARedatedCatalog(b *testing.B) {
	prev := bigCatalog(1000, 10)
	redated := *prev
	redated.Index++
	for b.Loop() {
		if g := gone(prev, &redated, nil); len(g) != 0 {
			b.Fatalf("%d instances gone from a re-dated catalog", len(g))
		}
	}
}

// A mass removal at 5,000 services × 10: 2,000 services lost whole and
// 2,000 scaled down to two, 36,000 instances held, each asking whether its
// service still serves; then the next snapshot, which asks of each held
// instance whether it is back.
func BenchmarkAMassHold(b *testing.B) {
	prev := bigCatalog(5000, 10)
	cur := &model.Catalog{}
	for _, in := range prev.Instances {
		var s, i int
		fmt.Sscanf(in.ID, "node-%d/svc-%d-", &i, &s)
		if s < 2000 || s < 4000 && i >= 2 {
			continue
		}
		cur.Instances = append(cur.Instances, in)
	}
	model.SortCatalog(cur)
	s := model.Snapshot{Source: "consul", Results: map[model.Query]model.Result{model.LocalCatalog: {Catalog: cur}}}
	for b.Loop() {
		g := Wrap(&fake{in: make(chan model.Snapshot)}, Options{Percent: 50, Hold: time.Minute, Log: slog.New(slog.DiscardHandler),
			Routed: func(status string) bool { return status == model.StatusPassing }}).(*Guard)
		g.sent[model.LocalCatalog] = prev
		g.hold(s, time.Now())
		if len(g.held) != 36000 {
			b.Fatalf("%d held, want 36,000", len(g.held))
		}
		out := g.compose(s)
		g.hold(s, time.Now())
		out = g.compose(s)
		if n := out.Results[model.LocalCatalog].Catalog.Len(); n != 50000 {
			b.Fatalf("%d instances passed on, want 50,000", n)
		}
	}
}
