package routes

import (
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// BenchmarkRenderOneChange renders the built-in configuration of 1000
// services × 10 instances with 16 slots per backend after one instance's
// status flipped, the renderer and the slot table kept from the last
// rendering, as the applier keeps them:
//
//	go test -run - -bench RenderOneChange ./entrypoint/routes/
func BenchmarkRenderOneChange(b *testing.B) {
	states := [2]model.State{benchState(1000, 10, false), benchState(1000, 10, true)}
	r := mustNew(b, Options{HTTPBind: "127.0.0.1:18080", Slots: 16, Now: func() time.Time { return time.Unix(1e9, 0) }})
	render(b, r, states[0])
	cpu := cpuTime()
	n := 0
	for i := 0; b.Loop(); i++ {
		out, err := r.Render(states[(i+1)%2])
		if err != nil {
			b.Fatal(err)
		}
		out.Commit()
		n++
	}
	// CPU time (every thread, the collector's too): a machine shared with
	// other work inflates it less than the wall time.
	b.ReportMetric(float64(cpuTime()-cpu)/float64(n), "cpu-ns/op")
}

// BenchmarkRenderOneChangeShared is BenchmarkRenderOneChange with the
// changed catalog made as the Consul source makes it: a new list of
// instances whose strings, tags and maps are those of the last one, but
// for the instance that changed.
//
//	go test -run - -bench RenderOneChangeShared ./entrypoint/routes/
func BenchmarkRenderOneChangeShared(b *testing.B) {
	first := benchState(1000, 10, false)
	c := first.Local()
	changed := slices.Clone(c.Instances)
	changed[len(changed)/2].Status = model.StatusCritical
	states := [2]model.State{first, model.NewState(map[model.Query]model.Result{
		model.LocalCatalog: {Catalog: &model.Catalog{Instances: changed}}})}
	r := mustNew(b, Options{HTTPBind: "127.0.0.1:18080", Slots: 16, Now: func() time.Time { return time.Unix(1e9, 0) }})
	render(b, r, states[0])
	cpu := cpuTime()
	n := 0
	for i := 0; b.Loop(); i++ {
		out, err := r.Render(states[(i+1)%2])
		if err != nil {
			b.Fatal(err)
		}
		out.Commit()
		n++
	}
	b.ReportMetric(float64(cpuTime()-cpu)/float64(n), "cpu-ns/op")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchState(services, instances int, changed bool) model.State {
	var insts []model.Instance
	for s := range services {
		name := fmt.Sprintf("svc%04d", s)
		for n := range instances {
			in := inst(name, fmt.Sprintf("%s-%d", name, n), fmt.Sprintf("10.%d.%d.%d", 2+s/250, s%250, n+1), 8080,
				"seamless.http.host="+name+".example")
			if changed && s == services/2 && n == 0 {
				in.Status = model.StatusCritical
			}
			insts = append(insts, in)
		}
	}
	c := &model.Catalog{Instances: insts}
	model.SortCatalog(c)
	return model.NewState(map[model.Query]model.Result{model.LocalCatalog: {Catalog: c}})
}
