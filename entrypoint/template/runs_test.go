package template

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// perService is a state whose local catalog is lists, as the Consul
// source makes it: one list per service, shared with the previous catalog
// when the service did not change.
func perService(lists ...[]model.Instance) model.State {
	return model.NewState(map[model.Query]model.Result{
		model.LocalCatalog: {Catalog: model.PerService("dc1", nil, lists, 1)},
	})
}

func instanceOf(name string, node, port int, tags ...string) model.Instance {
	return model.Instance{
		Source: "consul", Datacenter: "dc1", Name: name, ID: fmt.Sprintf("%s-%d", name, node),
		Node: fmt.Sprintf("node%d", node), NodeAddress: fmt.Sprintf("10.0.0.%d", node),
		Address: fmt.Sprintf("10.0.0.%d", node), Port: port, Status: model.StatusPassing, Tags: tags,
	}
}

// A change to one service converts that service's list alone: the other
// lists' runs are the previous render's, the replaced list's run is
// forgotten, and what cleaning left out of a kept run is still reported.
func TestAChangeConvertsOnlyTheServiceThatChanged(t *testing.T) {
	tmpl, err := parseText("c.tmpl", `{{range services}}{{range service .Name}}{{.Name}} {{.Address}}:{{.Port}} {{.Tags}}
{{end}}{{end}}`, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	api := []model.Instance{instanceOf("api", 1, 9090)}
	db := []model.Instance{instanceOf("db", 2, 5432, "primary", "bad\ntag")}
	web := []model.Instance{instanceOf("web", 1, 8080, "http"), instanceOf("web", 2, 8080, "http")}
	first, err := tmpl.Render(perService(api, db, web))
	if err != nil {
		t.Fatal(err)
	}
	runs := keptRuns(tmpl)
	runOf := func(list []model.Instance) *run { return runs[runKey{first: &list[0], n: len(list)}] }
	before := map[string]*run{"api": runOf(api), "db": runOf(db), "web": runOf(web)}
	for name, rn := range before {
		if rn == nil {
			t.Fatalf("no run kept for %s after the first render: %v", name, runs)
		}
	}

	moved := []model.Instance{instanceOf("api", 1, 9191)}
	second, err := tmpl.Render(perService(moved, db, web))
	if err != nil {
		t.Fatal(err)
	}
	want := "api 10.0.0.1:9191 []\ndb 10.0.0.2:5432 [primary]\nweb 10.0.0.1:8080 [http]\nweb 10.0.0.2:8080 [http]\n"
	if string(second.Config) != want {
		t.Fatalf("after the change:\n%s\nwant\n%s", second.Config, want)
	}
	runs = keptRuns(tmpl)
	if runOf(db) != before["db"] || runOf(web) != before["web"] {
		t.Errorf("an unchanged service was converted again")
	}
	if runOf(api) != nil || runOf(moved) == nil || len(runs) != 3 {
		t.Errorf("the runs kept: %v; want those of the three lists of the second catalog", runs)
	}
	if len(first.Skipped) != 1 || !slices.Equal(first.Skipped, second.Skipped) {
		t.Errorf("skipped: first %q, second %q; want db's tag reported at both", first.Skipped, second.Skipped)
	}
}

// keptRuns is the runs of the local catalog's view the last render kept,
// by list.
func keptRuns(tmpl *Template) map[runKey]*run {
	runs := map[runKey]*run{}
	if v := tmpl.runs.last.views[model.LocalCatalog]; v != nil {
		for i, rn := range v.runs {
			runs[v.keys[i]] = rn
		}
	}
	return runs
}

// Renders that reuse the previous one's runs produce what a template that
// never rendered produces, whatever changes between them: lists kept,
// replaced, added, removed, hostile, or a name in several runs of a
// catalog not sorted by service.
func TestRendersReusingRunsEqualFreshRenders(t *testing.T) {
	const text = `{{range services}}{{.Name}} {{.Tags}}:{{range service .Name "any"}} {{.ID}}@{{.Node}}={{.Address}}:{{.Port}}/{{.Status}}{{.Tags}}{{.NodeDatacenter}}{{end}}
{{end}}release:{{range service "release.web"}} {{.ID}}{{end}}
dc2:{{range service "web@dc2|any"}} {{.ID}}/{{.NodeDatacenter}}{{end}}
warning:{{range service "web|warning"}} {{.ID}}{{end}}
{{with node "node1"}}{{range .Services}}{{.Service}}/{{.ID}} {{end}}{{end}}
{{range nodes}}{{.Node}} {{.Meta}} {{end}}`
	cached, err := parseText("r.tmpl", text, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	statuses := []string{model.StatusPassing, model.StatusWarning, model.StatusCritical}
	newList := func(name string) []model.Instance {
		var l []model.Instance
		for node := range 1 + rng.IntN(3) {
			in := instanceOf(name, node+1, 8000+rng.IntN(3), "release")
			in.Status = statuses[rng.IntN(len(statuses))]
			if rng.IntN(2) == 0 {
				in.Datacenter = "" // the catalog's, which dc2's shares the lists with dc1's
			}
			switch rng.IntN(8) {
			case 0:
				in.Tags = append(in.Tags, "bad\ntag")
			case 1:
				in.Address = "10.0.0.1 backup"
			}
			l = append(l, in)
		}
		return l
	}
	// Nodes, hostile or not, kept from step to step or replaced: a view
	// shares the previous one's when they are the same.
	newNodes := func() []model.Node {
		nodes := []model.Node{{Name: "node1", Address: "10.0.0.1"}}
		switch rng.IntN(3) {
		case 0:
			nodes = append(nodes, model.Node{Name: "node2", Address: "10.0.0.2", Meta: map[string]string{"rack": "r1\nbackend x"}})
		case 1:
			nodes = append(nodes, model.Node{Name: "node3", Address: "10.0.0.3 backup"})
		}
		return nodes
	}
	nodes := newNodes()
	lists := map[string][]model.Instance{}
	for step := range 200 {
		if rng.IntN(6) == 0 {
			nodes = newNodes()
		}
		name := fmt.Sprintf("svc%d", rng.IntN(6))
		if name == "svc0" {
			name = "web"
		}
		if rng.IntN(5) == 0 {
			delete(lists, name)
		} else {
			lists[name] = newList(name)
		}
		var st model.State
		if rng.IntN(4) == 0 {
			// One list, not sorted by service: a name may come in
			// several runs.
			var all []model.Instance
			for _, l := range lists {
				all = append(all, l...)
			}
			rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
			st = model.NewState(map[model.Query]model.Result{
				model.LocalCatalog: {Catalog: &model.Catalog{Datacenter: "dc1", Instances: all, Nodes: nodes}},
			})
		} else {
			var names []string
			for n := range lists {
				names = append(names, n)
			}
			slices.Sort(names)
			var ls [][]model.Instance
			for _, n := range names {
				ls = append(ls, lists[n])
			}
			st = model.NewState(map[model.Query]model.Result{
				model.LocalCatalog: {Catalog: model.PerService("dc1", nodes, ls, 1)},
				{Kind: model.QueryCatalog, Datacenter: "dc2"}: {Catalog: model.PerService("dc2", nodes, ls, 1)},
			})
		}
		fresh, err := parseText("r.tmpl", text, testOptions())
		if err != nil {
			t.Fatal(err)
		}
		got, err := cached.Render(st)
		if err != nil {
			t.Fatal(err)
		}
		want, err := fresh.Render(st)
		if err != nil {
			t.Fatal(err)
		}
		if string(got.Config) != string(want.Config) || !slices.Equal(got.Skipped, want.Skipped) {
			t.Fatalf("step %d: reusing runs rendered\n%s%q\na fresh template\n%s%q", step, got.Config, got.Skipped, want.Config, want.Skipped)
		}
	}
}

// One change in a catalog of 1,000 services of 10 instances each, as
// the peer benchmark makes them, rendered by its classic template.
func BenchmarkRenderOneChangeAt1000x10(b *testing.B) {
	change := oneChangeAt1000x10(b)
	b.ReportAllocs()
	for b.Loop() {
		change()
	}
}

// A render of one change at 1,000 services walks no range over `services`
// item by item: each is one call that reuses the kept output of every
// service but the changed one. text/template's own walk of the classic
// template's two ranges made some 19 allocations per service (18,887 a
// render with this catalog); the calls made about 3.5, most of them the
// catalog's view made anew and a snippet per service. The view now
// shares the previous render's and the snippets come in one block: under
// one allocation per service, the benchmark's own making of the state
// included.
func TestARenderOfOneChangeAllocatesLittlePerService(t *testing.T) {
	change := oneChangeAt1000x10(t)
	change() // the first render executes every body
	if per := testing.AllocsPerRun(20, func() { change() }) / 1000; per > 1 {
		t.Errorf("%.2f allocations per service to render one change at 1000 services, want at most 1", per)
	}
}

// The output of a range over `services` is written where the range stood,
// once: returned as one string, it was joined, then copied whole again by
// the print of the call's value, before the copy into the rendering. A
// render of one change allocates less than three times its output (the
// output itself, a buffer grown to its last size, and the change).
func TestARenderOfOneChangeCopiesItsOutputOnce(t *testing.T) {
	change := oneChangeAt1000x10(t)
	size := len(change())
	const renders = 20
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range renders {
		change()
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / renders; per > 3*uint64(size) {
		t.Errorf("a render of one change allocated %d KiB for %d KiB of output, want under three times that", per>>10, size>>10)
	}
}

// oneChangeAt1000x10 returns a function that moves an instance of the
// next service of 1,000 (10 instances each), renders the classic
// template and returns the rendering.
func oneChangeAt1000x10(tb testing.TB) func() []byte {
	tmpl, err := parseText("peer.tmpl", peerTemplate, testOptions())
	if err != nil {
		tb.Fatal(err)
	}
	lists := make([][]model.Instance, 1000)
	for s := range lists {
		for i := range 10 {
			lists[s] = append(lists[s], instanceOf(fmt.Sprintf("svc%04d", s), i+1, 20000+i))
		}
	}
	kv := map[model.Query]model.Result{keyQ("service/haproxy/maxconn"): {}}
	state := func() model.State {
		res := map[model.Query]model.Result{model.LocalCatalog: {Catalog: model.PerService("dc1", nil, lists, 1)}}
		for q, r := range kv {
			res[q] = r
		}
		return model.NewState(res)
	}
	n := 0
	return func() []byte {
		s := n % len(lists)
		moved := slices.Clone(lists[s])
		moved[0].Port++
		lists[s] = moved
		n++
		r, err := tmpl.Render(state())
		if err != nil {
			tb.Fatal(err)
		}
		return r.Config
	}
}

func TestAMergeWritesNothingTheNextRenderReads(t *testing.T) {
	const text = `{{range service "web"}}{{.ID}}:{{.Port}}:{{.ServiceMeta}} {{end}}
{{- with service "web"}}{{$_ := sprig_mergeOverwrite (sprig_dict "s" (index . 0)) (sprig_dict "s" (index . 1))}}
{{- $_ := mergeMap (sprig_dict "m" (index . 0).ServiceMeta) (sprig_dict "m" (index . 1).ServiceMeta)}}{{end}}
{{- range service "web"}}{{.ID}}:{{.Port}}:{{.ServiceMeta}} {{end}}`
	tmpl, err := parseText("m.tmpl", text, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	web1, web2 := instanceOf("web", 1, 8080), instanceOf("web", 2, 9090)
	web1.Meta = map[string]string{"version": "1"}
	web2.Meta = map[string]string{"version": "2", "rack": "r2"}
	st := perService([]model.Instance{web1, web2})
	const want = "web-1:8080:map[version:1] web-2:9090:map[rack:r2 version:2] web-1:8080:map[version:1] web-2:9090:map[rack:r2 version:2] "
	for i := range 2 {
		r, err := tmpl.Render(st)
		if err != nil {
			t.Fatal(err)
		}
		if string(r.Config) != want {
			t.Fatalf("render %d:\n%s\nwant\n%s", i+1, r.Config, want)
		}
	}
}

// A list and a shorter one starting at the same instance are two lists.
func TestAShorterListFromTheSameArrayIsAnotherList(t *testing.T) {
	tmpl, err := parseText("s.tmpl", `{{range service "web"}}{{.ID}} {{end}}`, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	all := []model.Instance{instanceOf("web", 1, 80), instanceOf("web", 2, 80), instanceOf("web", 3, 80)}
	for _, n := range []int{3, 2} {
		st := model.NewState(map[model.Query]model.Result{
			model.LocalCatalog: {Catalog: &model.Catalog{Datacenter: "dc1", Instances: all[:n]}},
		})
		r, err := tmpl.Render(st)
		if err != nil {
			t.Fatal(err)
		}
		want := "web-1 web-2 web-3 "[:6*n]
		if string(r.Config) != want {
			t.Errorf("%d instances: %q, want %q", n, r.Config, want)
		}
	}
}

// Two datacenters' catalogs may share a list; an instance without a
// datacenter of its own takes its catalog's.
func TestCatalogsSharingAListFallBackToTheirOwnDatacenter(t *testing.T) {
	tmpl, err := parseText("d.tmpl", `{{range service "web|any"}}{{.ID}}/{{.NodeDatacenter}}{{end}} {{range service "web@dc2|any"}}{{.ID}}/{{.NodeDatacenter}}{{end}}`, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	in := instanceOf("web", 1, 80)
	in.Datacenter = ""
	lists := [][]model.Instance{{in}}
	st := model.NewState(map[model.Query]model.Result{
		model.LocalCatalog: {Catalog: model.PerService("dc1", nil, lists, 1)},
		{Kind: model.QueryCatalog, Datacenter: "dc2"}: {Catalog: model.PerService("dc2", nil, lists, 1)},
	})
	for range 2 {
		r, err := tmpl.Render(st)
		if err != nil {
			t.Fatal(err)
		}
		if string(r.Config) != "web-1/dc1 web-1/dc2" {
			t.Fatalf("got %q, want web-1/dc1 web-1/dc2", r.Config)
		}
	}
	// The same lists under the same query, now of another datacenter: the
	// previous view's runs fell back to the old one.
	st = model.NewState(map[model.Query]model.Result{
		model.LocalCatalog: {Catalog: model.PerService("dc3", nil, lists, 1)},
		{Kind: model.QueryCatalog, Datacenter: "dc2"}: {Catalog: model.PerService("dc2", nil, lists, 1)},
	})
	if r, err := tmpl.Render(st); err != nil || string(r.Config) != "web-1/dc3 web-1/dc2" {
		t.Fatalf("after the datacenter changed: %q, %v; want web-1/dc3 web-1/dc2", r.Config, err)
	}
}
