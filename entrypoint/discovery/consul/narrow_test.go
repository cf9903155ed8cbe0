package consul

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/entrypoint/routes"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// routed is the built-in template's choice (what cmd/seamless wires).
var routed = routes.Routed

// pathRecorder is a reverse proxy in front of a Consul that counts the
// requests by path. notFound answers 404 to paths with that prefix.
type pathRecorder struct {
	url   string
	mu    sync.Mutex
	at    map[string][]time.Time // by path, when each request to it came
	waits map[string][]string    // by path, the wait of each blocking query (one with an index)
}

func recordPaths(t *testing.T, addr, notFound string) *pathRecorder {
	t.Helper()
	u, err := url.Parse("http://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	p := &pathRecorder{at: map[string][]time.Time{}, waits: map[string][]string{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.at[r.URL.Path] = append(p.at[r.URL.Path], time.Now())
		if q := r.URL.Query(); q.Has("index") {
			p.waits[r.URL.Path] = append(p.waits[r.URL.Path], q.Get("wait"))
		}
		p.mu.Unlock()
		if notFound != "" && strings.HasPrefix(r.URL.Path, notFound) {
			http.NotFound(w, r)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p.url = srv.URL
	return p
}

// with returns the paths requested that start with prefix, sorted.
func (p *pathRecorder) with(prefix string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for path := range p.at {
		if strings.HasPrefix(path, prefix) {
			out = append(out, path)
		}
	}
	slices.Sort(out)
	return out
}

// times returns when the requests to path came, in order.
func (p *pathRecorder) times(path string) []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.at[path])
}

// registerTagged puts instance id of service name on node (one of
// populate's ten, at its address, or another) with tags, straight into
// the catalog.
func registerTagged(t *testing.T, c *api.Client, node, name, id string, port int, tags ...string) {
	t.Helper()
	addr := "10.0.1.1"
	var i int
	if _, err := fmt.Sscanf(node, "node-%d", &i); err == nil {
		addr = fmt.Sprintf("10.0.0.%d", i+1)
	}
	register(t, c, node, addr, &api.AgentService{ID: id, Service: name, Port: port, Tags: tags},
		check(id+"-http", api.HealthPassing))
}

// serviceNames lists the services of the local catalog of s.
func serviceNames(s model.Snapshot) []string {
	var out []string
	if s.Local() == nil {
		return nil
	}
	for _, in := range s.Local().All() {
		if !slices.Contains(out, in.Name) {
			out = append(out, in.Name)
		}
	}
	slices.Sort(out)
	return out
}

func hasServices(want ...string) func(model.Snapshot) bool {
	return func(s model.Snapshot) bool { return slices.Equal(serviceNames(s), want) }
}

// With the built-in template's choice, a catalog of 20 untagged services
// and 3 with seamless.* tags holds one health query per tagged service
// (and the service and node lists), reports those three alone, and never
// asks for the others.
func TestOnlyUsedServicesAreWatched(t *testing.T) {
	agent := testenv.Consul(t)
	c := agent.Client()
	populate(t, c, 20)
	for i, name := range []string{"web", "api", "shop"} {
		registerTagged(t, c, "node-x", name, name, 9000+i, "seamless.http.host="+name+".example", "v1")
	}
	proxy := recordPaths(t, agent.Addr(), "")
	r := startSource(t, proxy.url, Config{Wanted: routed}, model.LocalCatalog)
	r.waitFor("the tagged services alone", hasServices("api", "shop", "web"))
	r.steady(watching(3))
	if got := proxy.with("/v1/health/service/"); !slices.Equal(got, []string{
		"/v1/health/service/api", "/v1/health/service/shop", "/v1/health/service/web"}) {
		t.Errorf("health queries for %v, want the three tagged services'", got)
	}
	if listed, watched := r.src.Services(); listed != 24 || watched != 3 {
		t.Errorf("Services() = %d listed, %d watched; want 24 (20, 3 and consul) and 3", listed, watched)
	}
	if !strings.Contains(r.logged(), "watching 3 of the 24 services listed") {
		t.Errorf("no log line says how many services are watched:\n%s", r.logged())
	}
}

// 250 untagged services and 3 tagged ones, on an agent with the default
// limit of 200 connections per client address: the three fit the default
// budget, so the catalog is watched per service, with no failed request
// and no node dump.
func TestUnusedServicesDoNotCountAgainstTheBudget(t *testing.T) {
	agent := testenv.Consul(t)
	c := agent.Client()
	populate(t, c, 250)
	for i, name := range []string{"web", "api", "shop"} {
		registerTagged(t, c, "node-x", name, name, 9000+i, "seamless.tcp.port="+fmt.Sprint(7000+i))
	}
	r := startSource(t, agent.Addr(), Config{Wanted: routed}, model.LocalCatalog)
	r.waitFor("web", func(s model.Snapshot) bool { return len(instances(s, "web")) == 1 })
	r.src.mu.Lock()
	split := r.src.watches[model.LocalCatalog].f.(*catalogFetcher).split
	r.src.mu.Unlock()
	if split == nil {
		t.Error("the catalog is read from the node dump, not per service")
	}
	if st := r.src.Status(); st.LastError != "" || !st.Up {
		t.Errorf("status %+v, want up and no error", st)
	}
	if logs := r.logged(); strings.Contains(logs, "node dump") || strings.Contains(logs, "query failed") {
		t.Errorf("the source fell back or failed:\n%s", logs)
	}
	r.waitFor("the tagged services alone", hasServices("api", "shop", "web"))
	r.steady(watching(3))
}

// A service that gains its first seamless.* tag is watched and reported;
// one that loses its last is dropped. A service's tags are those of all
// its instances: one tagged instance brings the others along.
func TestATagAddedOrRemovedMovesTheService(t *testing.T) {
	agent := testenv.Consul(t)
	c := agent.Client()
	populate(t, c, 5)
	registerTagged(t, c, "node-x", "web", "web", 9000, "seamless.http.host=web.example")
	r := startSource(t, agent.Addr(), Config{Wanted: routed}, model.LocalCatalog)
	r.waitFor("web alone", hasServices("web"))
	r.steady(watching(1))

	t.Log("svc-1's one instance is tagged")
	registerTagged(t, c, "node-1", "svc-1", "svc-1", 8001, "seamless.http.host=one.example")
	r.waitFor("svc-1 too", hasServices("svc-1", "web"))
	r.steady(watching(2))

	t.Log("svc-1 gets a second, untagged instance: the service is used, so it is reported")
	registerTagged(t, c, "node-2", "svc-1", "svc-1", 8001)
	r.waitFor("both instances of svc-1", func(s model.Snapshot) bool { return len(instances(s, "svc-1")) == 2 })

	t.Log("the tagged instance loses its tag: no instance is routed, the service goes")
	registerTagged(t, c, "node-1", "svc-1", "svc-1", 8001, "v2")
	r.waitFor("web alone again", hasServices("web"))
	r.steady(watching(1))

	logs := r.logged()
	for _, want := range []string{"services now used: watching them", "services no longer used: not watching them"} {
		if !slices.ContainsFunc(strings.Split(logs, "\n"), func(l string) bool {
			return strings.Contains(l, want) && strings.Contains(l, " services=svc-1 ")
		}) {
			t.Errorf("no log line %q names svc-1:\n%s", want, logs)
		}
	}
}

// The per-service watches, the node dump and the public endpoints leave
// out the same services: a switch between them changes nothing.
func TestEveryModeNarrowsAlike(t *testing.T) {
	agent := testenv.Consul(t)
	c := agent.Client()
	registerVaried(t, c)
	// web's instances carry "lb" on all three, api's on one of two, db's
	// on none.
	lb := func(_ string, tags []string) bool { return slices.Contains(tags, "lb") }
	proxy := recordPaths(t, agent.Addr(), "/v1/internal/")
	all := startSource(t, agent.Addr(), Config{}, model.LocalCatalog)
	split := startSource(t, agent.Addr(), Config{Wanted: lb, seedAt: -1}, model.LocalCatalog)
	seeded := startSource(t, agent.Addr(), Config{Wanted: lb, seedAt: 1}, model.LocalCatalog)
	// Over the budget (two services, two fixed watches), the node dump.
	dump := startSource(t, agent.Addr(), Config{Wanted: lb, Watches: 3}, model.LocalCatalog)
	public := startSource(t, proxy.url, Config{Wanted: lb, Watches: 3}, model.LocalCatalog)

	full := flat(all.waitFor("every service", hasServices("api", "consul", "db", "web")).Local())
	want := full
	want.Instances = slices.DeleteFunc(slices.Clone(full.Instances), func(in model.Instance) bool {
		return in.Name != "api" && in.Name != "web"
	})
	for name, r := range map[string]*running{"per service": split, "seeded from the dump": seeded, "node dump": dump, "public endpoints": public} {
		got := flat(r.waitFor(name, hasServices("api", "web")).Local())
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n%+v\nwant the full catalog's api and web:\n%+v", name, got, want)
		}
	}
	if got := proxy.with("/v1/health/service/"); !slices.Equal(got, []string{"/v1/health/service/api", "/v1/health/service/web"}) {
		t.Errorf("public endpoints read %v, want api and web alone", got)
	}
}

// The node dump's tags of a service are the union over its instances,
// as /v1/catalog/services lists them; a service is kept or dropped whole.
func TestNarrowDumpKeepsWholeServices(t *testing.T) {
	dump := []*nodeInfo{
		{Node: "a", Services: []*nodeService{
			{ID: "web-1", Service: "web", Tags: []string{"seamless.http.host=w"}},
			{ID: "db-1", Service: "db", Tags: []string{"primary"}}}},
		{Node: "b", Services: []*nodeService{
			{ID: "web-2", Service: "web"},
			{ID: "db-2", Service: "db"}}},
		{Node: "p", PeerName: "other", Services: []*nodeService{
			{ID: "db-3", Service: "db", Tags: []string{"seamless.http.host=d"}}}},
	}
	tags := serviceTags(dump)
	if !reflect.DeepEqual(tags, map[string][]string{"web": {"seamless.http.host=w"}, "db": {"primary"}}) {
		t.Errorf("tags %v", tags)
	}
	w := newWatchSet(&Source{cfg: Config{Wanted: routed}, log: slog.New(slog.DiscardHandler)}, "")
	w.narrowDump(dump)
	var kept []string
	for _, n := range dump[:2] {
		for _, s := range n.Services {
			kept = append(kept, s.ID)
		}
	}
	if !slices.Equal(kept, []string{"web-1", "web-2"}) {
		t.Errorf("kept %v, want both instances of web", kept)
	}
	if w.listed.Load() != 2 || w.watched.Load() != 1 {
		t.Errorf("%d listed, %d watched; want 2 and 1", w.listed.Load(), w.watched.Load())
	}
}

// flat is c as one list and without its index, to compare catalogs made
// per service and whole.
func flat(c *model.Catalog) model.Catalog {
	return model.Catalog{Datacenter: c.Datacenter, Nodes: c.Nodes, Instances: c.All()}
}
