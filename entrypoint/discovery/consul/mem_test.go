package consul

import (
	"fmt"
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
	next := slices.Collect(c.assemble().Services())
	if !model.SameInstances(next[0], lists[0]) {
		t.Error("the next catalog copied api, which did not change")
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

// The instances of one node share its node checks unless they have checks
// of their own: a node of a thousand instances held a thousand copies of
// its serfHealth check (10 MB at 10,000 × 10). A service's own checks
// still come after the node's, in order, and leave the shared list as it
// was.
func TestInstancesOfANodeShareItsChecks(t *testing.T) {
	n := &nodeInfo{Node: "n1", Address: "10.0.0.1", Checks: []*healthCheck{
		{CheckID: "serfHealth", Status: "passing"},
		{CheckID: "web-2-http", Status: "critical", ServiceID: "web-2"},
		{CheckID: "disk", Status: "passing"},
	}}
	for _, id := range []string{"web-1", "web-2", "web-3"} {
		n.Services = append(n.Services, &nodeService{ID: id, Service: "web", Port: 80})
	}
	cat := convertDump([]*nodeInfo{n}, "dc1", "")
	byID := map[string]model.Instance{}
	for _, in := range cat.All() {
		byID[in.ID] = in
	}
	ids := func(cs []model.Check) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.CheckID)
		}
		return out
	}
	one, two, three := byID[instanceID("n1", "web-1")], byID[instanceID("n1", "web-2")], byID[instanceID("n1", "web-3")]
	if want := []string{"disk", "serfHealth"}; !slices.Equal(ids(one.Checks), want) || !slices.Equal(ids(three.Checks), want) {
		t.Fatalf("checks of web-1 %v and web-3 %v, want %v", ids(one.Checks), ids(three.Checks), want)
	}
	if &one.Checks[0] != &three.Checks[0] {
		t.Errorf("web-1 and web-3 hold copies of the node's checks, want one list")
	}
	if cap(one.Checks) != len(one.Checks) {
		t.Errorf("the shared list has room for %d checks past its %d: an append to it would write the others'", cap(one.Checks), len(one.Checks))
	}
	if want := []string{"disk", "serfHealth", "web-2-http"}; !slices.Equal(ids(two.Checks), want) || two.Status != model.StatusCritical {
		t.Errorf("web-2: checks %v, status %s; want %v, critical", ids(two.Checks), two.Status, want)
	}
}
