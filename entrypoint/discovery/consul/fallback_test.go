package consul

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// Behind a proxy that serves only Consul's public endpoints, the source
// falls back to them and reports the same catalog, at a higher price per
// change.
func TestFallbackWithoutTheNodeDump(t *testing.T) {
	agent := testenv.Consul(t)
	registerFixture(t, agent.Client())
	consul, err := url.Parse("http://" + agent.Addr())
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(consul)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/internal/") {
			http.NotFound(w, r)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)

	direct := startSource(t, agent.Addr(), Config{}, model.LocalCatalog)
	// Over its budget (three services, two fixed watches) the source reads
	// the node dump, which the proxy does not serve.
	public := startSource(t, proxy.URL, Config{Watches: 3}, model.LocalCatalog)
	want := direct.waitFor("the fixture, directly", fixtureComplete)
	got := public.waitFor("the fixture, through public endpoints", fixtureComplete)
	// The same content; each way of reading has its own notion of the
	// newest index (model.Catalog.Index).
	g, w := flat(got.Local()), flat(want.Local())
	if !reflect.DeepEqual(g, w) {
		t.Errorf("public endpoints:\n%+v\nnode dump:\n%+v", g, w)
	}

	public.steady(3)
	before := public.src.Requests()
	register(t, agent.Client(), "node-d", "10.0.0.4", &api.AgentService{ID: "db", Service: "db", Port: 5433})
	public.waitFor("the new port", func(s model.Snapshot) bool {
		in := instances(s, "db")
		return len(in) == 1 && in[0].Port == 5433
	})
	public.steady(3)
	t.Logf("fallback: %d requests for one change with %d services", public.src.Requests()-before, 3)
	if !public.src.Status().Up {
		t.Errorf("status %+v", public.src.Status())
	}
}
