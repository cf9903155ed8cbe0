package consul

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// One service's answer converts to instances that keep no spare room: a
// per-service catalog holds a thousand of them for as long as it runs,
// and appending one at a time left up to twice the room needed (16 for 10).
func TestConvertedInstancesKeepNoSpareRoom(t *testing.T) {
	for _, n := range []int{1, 3, 10, 17} {
		var entries []*api.ServiceEntry
		for i := range n {
			node := fmt.Sprintf("node-%d", i)
			entries = append(entries, &api.ServiceEntry{
				Node:    &api.Node{Node: node, Address: "10.0.0.1"},
				Service: &api.AgentService{ID: "web", Service: "web", Port: 8080 + i},
				Checks:  api.HealthChecks{{Node: node, CheckID: "web-http", Status: api.HealthPassing, ServiceID: "web"}},
			})
		}
		got := convertEntries(entriesFromAPI(entries), "dc1", "")
		if len(got) != n || cap(got) != n {
			t.Errorf("%d entries: %d instances with room for %d, want %d and no more", n, len(got), cap(got), n)
		}
	}
}

// The connections that hold blocking queries keep small buffers: one per
// watched service, each waiting for minutes.
func TestHeldConnectionsKeepSmallBuffers(t *testing.T) {
	rt := holdingTransport(http.DefaultTransport.(*http.Transport), 1016)
	if rt.ReadBufferSize == 0 || rt.ReadBufferSize > 1024 || rt.WriteBufferSize == 0 || rt.WriteBufferSize > 1024 {
		t.Errorf("buffers of %d bytes to read and %d to write per connection; want at most 1 KiB each",
			rt.ReadBufferSize, rt.WriteBufferSize)
	}
	if rt.MaxIdleConnsPerHost < 1016 {
		t.Errorf("%d idle connections kept, want one per watch", rt.MaxIdleConnsPerHost)
	}
}

// A per-service catalog holds each service's instances once: the
// catalog's lists are the parts themselves, and the sub-watch that
// answered keeps no copy to compare the next answer with (fetch compares
// with the part). An answer equal to the part changes nothing; a changed
// one makes a catalog that shares every other service's list with the
// one before and leaves that one as it was.
func TestSplitCatalogHoldsEachInstanceOnce(t *testing.T) {
	c := &splitCatalog{s: &Source{}, health: map[string]*sub{}, parts: map[string][]model.Instance{}, indexes: map[*sub]uint64{}}
	for _, name := range []string{"api", "web"} {
		c.health[name] = &sub{kind: partHealth, name: name}
		c.order = append(c.order, name)
	}
	answer := func(name string, ports ...int) event {
		ev := event{sub: c.health[name], changed: true}
		for i, p := range ports {
			ev.instances = append(ev.instances, model.Instance{Source: Name, Name: name,
				ID: fmt.Sprintf("n%d/%s", i, name), Node: fmt.Sprintf("n%d", i), Address: "10.0.0.1", Port: p})
		}
		return ev
	}
	c.apply(answer("api", 80))
	c.apply(answer("web", 80, 81))
	c.apply(event{sub: &sub{kind: partNodes}, changed: true, nodes: []model.Node{{Name: "n0"}, {Name: "n1"}}})
	cat := c.assemble()
	c.dirty = false
	lists := slices.Collect(cat.Services())
	if len(lists) != 2 || !model.SameInstances(lists[0], c.parts["api"]) || !model.SameInstances(lists[1], c.parts["web"]) {
		t.Error("the catalog's lists are copies of the parts, not the parts")
	}
	c.apply(answer("web", 80, 81))
	if c.dirty {
		t.Error("an answer equal to the part held marked the catalog changed")
	}
	c.apply(answer("web", 80, 82))
	if !c.dirty {
		t.Error("a changed answer left the catalog unchanged")
	}
	nextCat := c.assemble()
	next := slices.Collect(nextCat.Services())
	if !model.SameInstances(next[0], lists[0]) {
		t.Error("the next catalog copied api, which did not change")
	}
	if len(nextCat.Nodes) != 2 || &nextCat.Nodes[0] != &cat.Nodes[0] {
		t.Error("the next catalog copied the node list, which did not change")
	}
	if next[1][1].Port != 82 || lists[1][1].Port != 81 {
		t.Error("the next assembly changed the catalog sent before")
	}
}

// A health answer whose index did not move (a wait that ran out: most
// answers of a thousand watched services) is not converted again.
func TestAnUnmovedAnswerIsNotConvertedAgain(t *testing.T) {
	var (
		mu     sync.Mutex
		health int
	)
	addr := stub(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/health/service/s" {
			stubCatalog(w, r)
			return
		}
		mu.Lock()
		health++
		mu.Unlock()
		w.Header().Set("X-Consul-Index", "7") // at once, as if the wait ran out
		fmt.Fprint(w, healthOf("a"))
	})
	r := startSource(t, addr, Config{}, model.LocalCatalog)
	r.waitFor("s", func(s model.Snapshot) bool { return len(instances(s, "s")) == 1 })
	testenv.Eventually(t, wait, "five answers", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return health >= 5
	})
	r.src.mu.Lock()
	split := r.src.watches[model.LocalCatalog].f.(*catalogFetcher).split
	r.src.mu.Unlock()
	if n := split.converted.Load(); n != 1 {
		t.Errorf("%d answers converted, want the first alone", n)
	}
}

// A catalog assembled after one service of 1,000 changed copies no
// instance: it costs a list of the services, not the 10,000 instances
// (some 2.9 MB) that a flat catalog would copy at every change.
func TestAssemblingAfterOneChangeCopiesNoInstance(t *testing.T) {
	c := &splitCatalog{s: &Source{}, parts: map[string][]model.Instance{}}
	for s := range 1000 {
		name := fmt.Sprintf("svc-%04d", s)
		c.order = append(c.order, name)
		for i := range 10 {
			c.parts[name] = append(c.parts[name], model.Instance{Source: Name, Name: name,
				ID: fmt.Sprintf("n%d/%s", i, name), Node: fmt.Sprintf("n%d", i), Address: "10.0.0.1", Port: 8000 + i})
		}
	}
	first := c.assemble()
	c.parts["svc-0500"] = slices.Clone(c.parts["svc-0500"])
	c.parts["svc-0500"][0].Port = 9000
	var next *model.Catalog
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	next = c.assemble()
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 64<<10 {
		t.Errorf("assembling after one change allocated %d KiB; want at most 64 KiB", n>>10)
	}
	if next.Len() != first.Len() || slices.Collect(next.Services())[500][0].Port != 9000 {
		t.Errorf("the assembled catalog holds %d instances, svc-0500 first at %d; want 10,000 and 9000",
			next.Len(), slices.Collect(next.Services())[500][0].Port)
	}
}

// The instances of a node share one list of its checks: a node of a
// thousand instances held a thousand copies of its serfHealth check (10
// MB at 10,000 × 10). A service's own checks are its alone, and count in
// its status with the node's.
func TestInstancesOfANodeShareItsChecks(t *testing.T) {
	n := &nodeInfo{Node: "n1", Address: "10.0.0.1", Checks: []*healthCheck{
		{CheckID: "serfHealth", Status: "passing"},
		{CheckID: "web-2-http", Status: "critical", ServiceID: "web-2"},
		{CheckID: "disk", Status: "passing"},
		{CheckID: "web-3-http", Status: "passing", ServiceID: "web-3"},
	}}
	for _, id := range []string{"web-1", "web-2", "web-3"} {
		n.Services = append(n.Services, &nodeService{ID: id, Service: "web", Port: 80})
	}
	cat := convertDump([]*nodeInfo{n}, "dc1", "")
	byID := map[string]model.Instance{}
	for _, in := range cat.All() {
		byID[in.ID] = in
	}
	one, two, three := byID[instanceID("n1", "web-1")], byID[instanceID("n1", "web-2")], byID[instanceID("n1", "web-3")]
	for _, in := range []model.Instance{one, two, three} {
		if want := []string{"disk", "serfHealth"}; !slices.Equal(checkIDs(in.NodeChecks), want) {
			t.Fatalf("%s: node checks %v, want %v", in.ID, checkIDs(in.NodeChecks), want)
		}
		if &in.NodeChecks[0] != &one.NodeChecks[0] {
			t.Errorf("%s holds a copy of the node's checks, want the one list", in.ID)
		}
	}
	if cap(one.NodeChecks) != len(one.NodeChecks) {
		t.Errorf("the shared list has room for %d checks past its %d: an append to it would write the others'", cap(one.NodeChecks), len(one.NodeChecks))
	}
	for in, want := range map[*model.Instance]struct {
		checks []string
		status string
	}{&one: {nil, model.StatusPassing}, &two: {[]string{"web-2-http"}, model.StatusCritical}, &three: {[]string{"web-3-http"}, model.StatusPassing}} {
		if !slices.Equal(checkIDs(in.Checks), want.checks) || in.Status != want.status {
			t.Errorf("%s: checks %v, status %s; want %v, %s", in.ID, checkIDs(in.Checks), in.Status, want.checks, want.status)
		}
	}
}

// Each health answer brings its own copy of its nodes' checks: services
// read apart after a change of their node must end up sharing one list
// per node again, and a node gone from the node list, or left without
// checks, is forgotten.
func TestServicesReadApartShareTheirNodesChecks(t *testing.T) {
	c := &splitCatalog{parts: map[string][]model.Instance{}, nodeChecks: map[string][]model.Check{}, indexes: map[*sub]uint64{}}
	for i, name := range []string{"api", "web"} {
		var entries []healthEntry
		if err := json.Unmarshal(consulHealth(name, 3), &entries); err != nil {
			t.Fatal(err)
		}
		c.apply(event{sub: &sub{kind: partHealth, name: name}, index: uint64(10 + i), instances: convertEntries(entries, "dc1", "")})
	}
	api, web := c.parts["api"], c.parts["web"]
	if len(api) != 3 || len(web) != 3 {
		t.Fatalf("parts: %d api, %d web instances; want 3 each", len(api), len(web))
	}
	for i := range api {
		if api[i].Node != web[i].Node || len(web[i].NodeChecks) == 0 {
			t.Fatalf("instance %d: api on %s, web on %s with %d node checks", i, api[i].Node, web[i].Node, len(web[i].NodeChecks))
		}
		if &api[i].NodeChecks[0] != &web[i].NodeChecks[0] {
			t.Errorf("api and web on %s hold a copy each of its checks, want one list", api[i].Node)
		}
	}
	c.apply(event{sub: &sub{kind: partNodes}, nodes: []model.Node{{Name: "node-000"}, {Name: "node-002"}}})
	if got := slices.Sorted(maps.Keys(c.nodeChecks)); !slices.Equal(got, []string{"node-000", "node-002"}) {
		t.Errorf("node checks kept for %v after node-001 left the node list; want node-000 and node-002", got)
	}
	c.apply(event{sub: &sub{kind: partHealth, name: "db"}, index: 13, instances: []model.Instance{{Node: "node-000", Name: "db", ID: "node-000/db"}}})
	if _, kept := c.nodeChecks["node-000"]; kept {
		t.Error("node-000's old checks kept after an answer showed it without any")
	}
}

func checkIDs(cs []model.Check) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.CheckID)
	}
	return out
}

// The seed's parts are arrays of their own: one part kept alive keeps
// its own service's instances, not the whole catalog's (a slice of one
// array held 29 MB at 10,000 × 10 for as long as any service had not
// been read again). Each part is sorted and sized as the service's run
// of the whole catalog.
func TestASeededPartKeepsOnlyItsService(t *testing.T) {
	parse := func() []*nodeInfo {
		var dump []*nodeInfo
		if err := json.Unmarshal([]byte(synthDump(100, 100)), &dump); err != nil {
			t.Fatal(err)
		}
		return dump
	}
	keep := map[string]bool{}
	for s := range 100 {
		keep[fmt.Sprintf("svc-%d", s)] = true
	}
	whole := convertDump(parse(), "dc1", "")
	parts := seedParts(parse(), "dc1", "", keep)
	if len(parts) != 100 {
		t.Fatalf("%d parts, want 100", len(parts))
	}
	for group := range whole.Services() {
		p := parts[group[0].Name]
		if !model.EqualInstances(p, group) || cap(p) != len(p) {
			t.Fatalf("part %s: %d instances (room for %d), not the catalog's %d in its order", group[0].Name, len(p), cap(p), len(group))
		}
	}
	whole = nil

	var withOne, withNone runtime.MemStats
	one := parts["svc-7"]
	parts = nil
	runtime.GC()
	runtime.ReadMemStats(&withOne)
	runtime.KeepAlive(one)
	one = nil
	runtime.GC()
	runtime.ReadMemStats(&withNone)
	// 100 instances with their checks are about 50 KB; the catalog's
	// array alone is 2.9 MB.
	if kept := int64(withOne.HeapAlloc) - int64(withNone.HeapAlloc); kept > 1<<20 {
		t.Errorf("one part of 100 instances keeps %d KB alive", kept>>10)
	}
}

// A seeded part's array is sized for the instances it holds: the count
// leaves out what the conversion does (peers, the tag filter), or the
// spare room would live as long as the part.
func TestASeededPartHasRoomForItsInstancesOnly(t *testing.T) {
	parse := func() []*nodeInfo {
		var dump []*nodeInfo
		if err := json.Unmarshal([]byte(synthDump(3, 2)), &dump); err != nil {
			t.Fatal(err)
		}
		dump[0].Services[0].Tags = []string{"v1"} // svc-0 on node-0: not "http"
		dump[1].Services[1].PeerName = "other"    // svc-1 on node-1: a peer's
		dump[2].PeerName = "other"                // node-2: a peer's
		return dump
	}
	keep := map[string]bool{"svc-0": true, "svc-1": true}
	room := seedRoom(parse(), "http", keep)
	parts := seedParts(parse(), "dc1", "http", keep)
	for name, want := range map[string]int{"svc-0": 1, "svc-1": 1} {
		if len(parts[name]) != want || room[name] != want {
			t.Errorf("%s: %d instances, room counted for %d; want %d", name, len(parts[name]), room[name], want)
		}
	}
}
