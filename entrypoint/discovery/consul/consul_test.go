package consul

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// registerFixture registers four instances of web with every kind of
// status, and db without checks.
func registerFixture(t testing.TB, c *api.Client) {
	t.Helper()
	weights := api.AgentWeights{Passing: 10, Warning: 2}
	register(t, c, "node-a", "10.0.0.1", &api.AgentService{ID: "web-1", Service: "web", Port: 8001,
		Tags: []string{"v1", "public"}, Meta: map[string]string{"version": "1"}, Weights: weights,
		TaggedAddresses: map[string]api.ServiceAddress{"wan": {Address: "192.0.2.1", Port: 80}}},
		check("web-1-http", api.HealthPassing))
	register(t, c, "node-a", "10.0.0.1", &api.AgentService{ID: "web-2", Service: "web", Port: 8002, Address: "10.0.0.9"},
		check("web-2-http", api.HealthWarning), check("web-2-disk", api.HealthPassing))
	register(t, c, "node-b", "10.0.0.2", &api.AgentService{ID: "web-1", Service: "web", Port: 8001},
		check("web-1-http", api.HealthPassing), nodeCheck("node-b-alive", api.HealthCritical))
	register(t, c, "node-c", "10.0.0.3", &api.AgentService{ID: "web-3", Service: "web", Port: 8003},
		check("web-3-http", api.HealthCritical), nodeCheck("_node_maintenance", api.HealthCritical))
	register(t, c, "node-d", "10.0.0.4", &api.AgentService{ID: "db", Service: "db", Port: 5432})
}

func fixtureComplete(s model.Snapshot) bool {
	return len(instances(s, "web")) == 4 && len(instances(s, "db")) == 1
}

func TestCatalogReportsInstancesWithTheirStatus(t *testing.T) {
	agent := testenv.Consul(t)
	registerFixture(t, agent.Client())
	r := startSource(t, agent.Addr(), Config{}, model.LocalCatalog)
	snap := r.waitFor("four web instances and db", fixtureComplete)
	byID := map[string]model.Instance{}
	for _, in := range append(instances(snap, "web"), instances(snap, "db")...) {
		byID[in.ID] = in
	}

	tests := []struct {
		name, id, status, address string
		port, checks              int
	}{
		{"passing service check", "node-a/web-1", model.StatusPassing, "10.0.0.1", 8001, 1},
		{"worst service check wins", "node-a/web-2", model.StatusWarning, "10.0.0.9", 8002, 2},
		{"critical node check makes the instance critical", "node-b/web-1", model.StatusCritical, "10.0.0.2", 8001, 2},
		{"maintenance wins over critical", "node-c/web-3", model.StatusMaintenance, "10.0.0.3", 8003, 2},
		{"no checks is passing", "node-d/db", model.StatusPassing, "10.0.0.4", 5432, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in, ok := byID[tt.id]
			if !ok {
				t.Fatalf("no instance %s in %v", tt.id, snap.Results[model.LocalCatalog].Catalog.All())
			}
			if checks := len(in.NodeChecks) + len(in.Checks); in.Status != tt.status || in.Address != tt.address || in.Port != tt.port || checks != tt.checks {
				t.Errorf("got status %s address %s:%d with %d checks, want %s %s:%d with %d",
					in.Status, in.Address, in.Port, checks, tt.status, tt.address, tt.port, tt.checks)
			}
			if in.Source != Name || in.Datacenter != "dc1" || in.NodeMeta["rack"] != "r1" {
				t.Errorf("source %q datacenter %q node meta %v", in.Source, in.Datacenter, in.NodeMeta)
			}
		})
	}

	t.Run("service fields are carried", func(t *testing.T) {
		in := byID["node-a/web-1"]
		if !slices.Equal(in.Tags, []string{"v1", "public"}) || in.Meta["version"] != "1" ||
			in.Weight != 10 || in.WarningWeight != 2 || in.TaggedAddresses["wan"] != "192.0.2.1:80" ||
			in.Node != "node-a" || in.NodeAddress != "10.0.0.1" {
			t.Errorf("instance %+v", in)
		}
	})
	t.Run("nodes are reported, the agent's own included", func(t *testing.T) {
		cat := snap.Results[model.LocalCatalog].Catalog
		var names []string
		for _, n := range cat.Nodes {
			names = append(names, n.Name)
			if n.Datacenter != "dc1" {
				t.Errorf("node %s in datacenter %q", n.Name, n.Datacenter)
			}
		}
		want := []string{"node-a", "node-b", "node-c", "node-d", agent.Node()}
		slices.Sort(want)
		if cat.Datacenter != "dc1" || !slices.Equal(names, want) {
			t.Errorf("datacenter %q nodes %v, want dc1 %v", cat.Datacenter, names, want)
		}
	})
}

func TestTTLCheckAndDeregistration(t *testing.T) {
	agent := testenv.Consul(t)
	c := agent.Client()
	reg := &api.AgentServiceRegistration{ID: "api-1", Name: "api", Port: 9000,
		Check: &api.AgentServiceCheck{CheckID: "api-ttl", TTL: "10m", Status: api.HealthPassing}}
	if err := c.Agent().ServiceRegister(reg); err != nil {
		t.Fatal(err)
	}
	r := startSource(t, agent.Addr(), Config{}, model.LocalCatalog)
	status := func(want string) func(model.Snapshot) bool {
		return func(s model.Snapshot) bool {
			in := instances(s, "api")
			return len(in) == 1 && in[0].Status == want
		}
	}
	r.waitFor("api passing", status(model.StatusPassing))

	if err := c.Agent().UpdateTTL("api-ttl", "backend gone", api.HealthCritical); err != nil {
		t.Fatal(err)
	}
	snap := r.waitFor("api critical after its TTL check failed", status(model.StatusCritical))
	if out := instances(snap, "api")[0].Checks; !slices.ContainsFunc(out, func(c model.Check) bool {
		return c.CheckID == "api-ttl" && c.Output == "backend gone"
	}) {
		t.Errorf("checks %+v lack the failed TTL check's output", out)
	}

	if err := c.Agent().ServiceDeregister("api-1"); err != nil {
		t.Fatal(err)
	}
	r.waitFor("api gone after deregistration", func(s model.Snapshot) bool {
		return s.Results[model.LocalCatalog].Catalog != nil && len(instances(s, "api")) == 0
	})
}

func TestTagFilter(t *testing.T) {
	agent := testenv.Consul(t)
	c := agent.Client()
	register(t, c, "n1", "10.0.0.1", &api.AgentService{ID: "a", Service: "web", Port: 1, Tags: []string{"lb"}})
	register(t, c, "n1", "10.0.0.1", &api.AgentService{ID: "b", Service: "web", Port: 2, Tags: []string{"other"}})
	register(t, c, "n1", "10.0.0.1", &api.AgentService{ID: "c", Service: "web", Port: 3})

	tests := []struct {
		name, filter string
		want         []string
	}{
		{"no filter reports every instance", "", []string{"n1/a", "n1/b", "n1/c"}},
		{"a filter reports only the tagged instances", "lb", []string{"n1/a"}},
		{"a tag nobody has reports none", "nope", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := startSource(t, agent.Addr(), Config{TagFilter: tt.filter}, model.LocalCatalog)
			snap := r.waitFor("the catalog", func(s model.Snapshot) bool { return s.Local() != nil })
			var ids []string
			for _, in := range instances(snap, "web") {
				ids = append(ids, in.ID)
			}
			if !slices.Equal(ids, tt.want) {
				t.Errorf("instances %v, want %v", ids, tt.want)
			}
			if len(snap.Local().Nodes) != 2 {
				t.Errorf("nodes %v: the filter applies to instances only", snap.Local().Nodes)
			}
		})
	}
}

func TestKV(t *testing.T) {
	agent := testenv.Consul(t)
	kv := agent.Client().KV()
	for k, v := range map[string]string{"app/a": "1", "app/sub/b": "2", "apple": "x", "single": "one"} {
		if _, err := kv.Put(&api.KVPair{Key: k, Value: []byte(v), Flags: 7}, nil); err != nil {
			t.Fatal(err)
		}
	}
	qKey := model.Query{Kind: model.QueryKey, Key: "single"}
	qMissing := model.Query{Kind: model.QueryKey, Key: "missing"}
	qPrefix := model.Query{Kind: model.QueryPrefix, Key: "app/"}
	r := startSource(t, agent.Addr(), Config{}, qKey, qMissing, qPrefix)
	snap := r.waitFor("three KV answers", func(s model.Snapshot) bool { return len(s.Results) == 3 })

	keys := func(ps []model.KVPair) []string {
		var out []string
		for _, p := range ps {
			out = append(out, p.Key+"="+p.Value)
		}
		return out
	}
	tests := []struct {
		name string
		q    model.Query
		want []string
	}{
		{"a key is its pair", qKey, []string{"single=one"}},
		{"a missing key is no pair", qMissing, nil},
		{"a prefix is every key under it, recursively", qPrefix, []string{"app/a=1", "app/sub/b=2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, ok := snap.Results[tt.q]
			if !ok {
				t.Fatalf("no answer for %s", tt.q)
			}
			if got := keys(res.Pairs); !slices.Equal(got, tt.want) {
				t.Errorf("%s: %v, want %v", tt.q, got, tt.want)
			}
			for _, p := range res.Pairs {
				if p.Flags != 7 || p.ModifyIndex == 0 {
					t.Errorf("pair %+v lacks flags or index", p)
				}
			}
		})
	}

	t.Run("changes arrive", func(t *testing.T) {
		if _, err := kv.Put(&api.KVPair{Key: "missing", Value: []byte("now here")}, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Delete("app/a", nil); err != nil {
			t.Fatal(err)
		}
		r.waitFor("the new key and the deleted one", func(s model.Snapshot) bool {
			return slices.Equal(keys(s.Results[qMissing].Pairs), []string{"missing=now here"}) &&
				slices.Equal(keys(s.Results[qPrefix].Pairs), []string{"app/sub/b=2"})
		})
	})
}

func TestWantAddsAndRemovesQueries(t *testing.T) {
	agent := testenv.Consul(t)
	if _, err := agent.Client().KV().Put(&api.KVPair{Key: "k", Value: []byte("v")}, nil); err != nil {
		t.Fatal(err)
	}
	qKey := model.Query{Kind: model.QueryKey, Key: "k"}
	qDCs := model.Query{Kind: model.QueryDatacenters}
	r := startSource(t, agent.Addr(), Config{}, model.LocalCatalog)
	r.waitFor("the catalog alone", func(s model.Snapshot) bool { return len(s.Results) == 1 && s.Local() != nil })
	r.steady(watching(1)) // the consul service

	r.src.Want([]model.Query{model.LocalCatalog, qKey, qDCs})
	snap := r.waitFor("catalog, key and datacenters", func(s model.Snapshot) bool { return len(s.Results) == 3 })
	if dcs := snap.Results[qDCs].Datacenters; !slices.Equal(dcs, []string{"dc1"}) {
		t.Errorf("datacenters %v", dcs)
	}
	r.steady(watching(1) + 1) // the datacenter list is polled, not held open

	r.src.Want([]model.Query{qKey})
	r.waitFor("the key alone", func(s model.Snapshot) bool {
		_, ok := s.Results[qKey]
		return len(s.Results) == 1 && ok
	})
	r.steady(1) // the catalog's blocking queries were cancelled

	r.src.Want(nil)
	r.waitFor("nothing", func(s model.Snapshot) bool { return len(s.Results) == 0 })
	r.steady(0)
}

func TestConsulDownKeepsDataAndRecovers(t *testing.T) {
	agent := testenv.Consul(t)
	c := agent.Client()
	register(t, c, "n1", "10.0.0.1", &api.AgentService{ID: "web-1", Service: "web", Port: 80})
	r := startSource(t, agent.Addr(), Config{}, model.LocalCatalog)
	r.waitFor("web-1", func(s model.Snapshot) bool { return len(instances(s, "web")) == 1 })
	testenv.Eventually(t, wait, "status up", func() bool { return r.src.Status().Up })

	agent.Stop()
	testenv.Eventually(t, wait, "status down", func() bool { return !r.src.Status().Up })
	st := r.src.Status()
	for _, want := range []string{agent.Addr(), "CONSUL_HTTP_ADDR", "catalog"} {
		if !strings.Contains(st.LastError, want) {
			t.Errorf("last error %q does not name %q", st.LastError, want)
		}
	}
	if st.LastErrorAt.IsZero() || st.LastSuccess.IsZero() || st.LastErrorAt.Before(st.LastSuccess) {
		t.Errorf("status %+v", st)
	}
	requests := r.src.Requests()
	testenv.Eventually(t, wait, "a few retries", func() bool { return r.src.Requests() >= requests+2 })

	agent.Start()
	register(t, agent.Client(), "n2", "10.0.0.2", &api.AgentService{ID: "web-2", Service: "web", Port: 80})
	deregister(t, agent.Client(), "n1", "web-1")
	r.waitFor("web-2 alone, registered while the source was away", func(s model.Snapshot) bool {
		in := instances(s, "web")
		return len(in) == 1 && in[0].ID == "n2/web-2"
	})
	testenv.Eventually(t, wait, "status up again", func() bool { return r.src.Status().Up })

	for i, s := range r.history() {
		if s.Local() == nil {
			t.Errorf("snapshot %d has no catalog", i)
		}
	}
}

func TestCancelReturnsDuringABlockingQuery(t *testing.T) {
	agent := testenv.Consul(t)
	r := startSource(t, agent.Addr(), Config{WaitTime: 10 * time.Minute}, model.LocalCatalog,
		model.Query{Kind: model.QueryKey, Key: "k"})
	r.waitFor("both answers", func(s model.Snapshot) bool { return len(s.Results) == 2 })
	r.steady(watching(1) + 1)

	start := time.Now()
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run still runs 5s after its context ended")
	}
	t.Logf("Run returned %s after the cancel", time.Since(start).Round(time.Millisecond))
	if n := r.src.InFlight(); n != 0 {
		t.Errorf("%d requests still in flight after Run returned", n)
	}
}

func TestSlowConsumerGetsTheNewestState(t *testing.T) {
	agent := testenv.Consul(t)
	c := agent.Client()
	src, err := New(Config{API: &api.Config{Address: agent.Addr()}}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	src.Want([]model.Query{model.LocalCatalog})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	out := make(chan model.Snapshot)
	go func() { defer close(done); src.Run(ctx, out) }()
	defer func() { cancel(); <-done }()

	first := <-out
	if first.Local() == nil {
		t.Fatal("first snapshot without the catalog")
	}
	// Nobody reads out while five services come and go: the watch must
	// keep reading Consul all the same.
	for i := range 5 {
		register(t, c, "n1", "10.0.0.1", &api.AgentService{ID: "s", Service: "svc", Port: 1000 + i})
		testenv.Eventually(t, wait, "the source read the change", func() bool {
			src.mu.Lock()
			defer src.mu.Unlock()
			in := src.results[model.LocalCatalog].Catalog.All()
			return slices.ContainsFunc(in, func(in model.Instance) bool { return in.Port == 1000+i })
		})
	}
	select {
	case snap := <-out:
		if in := instances(snap, "svc"); len(in) != 1 || in[0].Port != 1004 {
			t.Errorf("after a slow read: %+v, want the newest (port 1004)", in)
		}
	case <-time.After(wait):
		t.Fatal("no snapshot")
	}
}

func TestQueriesOfAnotherDatacenter(t *testing.T) {
	agent := testenv.Consul(t)
	qSame := model.Query{Kind: model.QueryCatalog, Datacenter: "dc1"}
	qOther := model.Query{Kind: model.QueryCatalog, Datacenter: "nowhere"}
	r := startSource(t, agent.Addr(), Config{}, qSame, qOther)
	snap := r.waitFor("the named datacenter", func(s model.Snapshot) bool { return len(s.Results) > 0 })
	if cat := snap.Results[qSame].Catalog; cat == nil || cat.Datacenter != "dc1" {
		t.Errorf("catalog of dc1: %+v", cat)
	}
	if _, ok := snap.Results[qOther]; ok {
		t.Error("an unknown datacenter has an answer")
	}
	testenv.Eventually(t, wait, "the unknown datacenter's error", func() bool {
		return strings.Contains(r.src.Status().LastError, "nowhere")
	})
	if r.src.Status().Up {
		t.Error("up while a query fails")
	}
}
