package consul

import (
	"fmt"
	"net/http"
	"slices"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// A catalog carries the index of the newest change it reflects, watched
// per service and through the node dump alike.
func TestCatalogCarriesTheIndexOfItsNewestChange(t *testing.T) {
	for _, tt := range []struct {
		name    string
		watches int
	}{
		{"per service", 0},
		{"node dump", 1}, // a budget no catalog fits
	} {
		t.Run(tt.name, func(t *testing.T) {
			agent := testenv.Consul(t)
			c := agent.Client()
			healthIndex := func() uint64 {
				_, meta, err := c.Health().Service("web", "", false, nil)
				if err != nil {
					t.Fatal(err)
				}
				return meta.LastIndex
			}
			register(t, c, "n1", "10.0.0.1", &api.AgentService{ID: "web-1", Service: "web", Port: 80})
			first := healthIndex()
			r := startSource(t, agent.Addr(), Config{Watches: tt.watches}, model.LocalCatalog)
			s := r.waitFor("web-1", func(s model.Snapshot) bool { return len(instances(s, "web")) == 1 })
			if got := s.Local().Index; got < first {
				t.Errorf("the first catalog's index is %d, below web-1's registration at %d", got, first)
			}
			register(t, c, "n2", "10.0.0.2", &api.AgentService{ID: "web-2", Service: "web", Port: 80})
			change := healthIndex()
			s = r.waitFor("web-2", func(s model.Snapshot) bool { return len(instances(s, "web")) == 2 })
			if got := s.Local().Index; got < change {
				t.Errorf("the catalog with web-2 has index %d, below web-2's registration at %d", got, change)
			}
			t.Logf("index %d after web-2 (registered at %d; web-1 at %d)", s.Local().Index, change, first)
		})
	}
}

// A node list that comes back empty (a Consul restarted empty, before its
// agents join again) does not take the catalog's datacenter away: the
// catalog's index is reported by datacenter.
func TestAnEmptyNodeListKeepsTheDatacenter(t *testing.T) {
	addr := stub(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/catalog/nodes" {
			stubCatalog(w, r)
			return
		}
		switch r.URL.Query().Get("index") {
		case "":
			w.Header().Set("X-Consul-Index", "1")
			fmt.Fprint(w, `[{"Node": "a", "Datacenter": "dc9"}]`)
		case "1":
			w.Header().Set("X-Consul-Index", "2")
			fmt.Fprint(w, `[]`)
		default:
			<-r.Context().Done()
		}
	})
	r := startSource(t, addr, Config{}, model.LocalCatalog)
	s := r.waitFor("the empty node list", func(s model.Snapshot) bool { return s.Local() != nil && s.Local().Index == 2 })
	if dc := s.Local().Datacenter; dc != "dc9" {
		t.Errorf("the catalog after an empty node list is in datacenter %q, want dc9", dc)
	}
}

// An answer that repeats the same data at a newer index (a change the
// catalog does not show, a fresh read after a cut) makes the catalog as
// recent as that index, without a copy of its instances: every change
// answers the service list that way too, and the copy was half of a
// change's garbage at 1000×10.
func TestTheSameAnswerAtANewerIndexMovesTheCatalogsIndex(t *testing.T) {
	release := make(chan struct{}) // the repeat waits until the first catalog was seen
	addr := stub(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/health/service/s" {
			stubCatalog(w, r)
			return
		}
		switch r.URL.Query().Get("index") {
		case "", "1": // the first read waits on 1
			w.Header().Set("X-Consul-Index", "5")
		case "5":
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
			w.Header().Set("X-Consul-Index", "7") // the same instance
		default:
			<-r.Context().Done()
			return
		}
		fmt.Fprint(w, healthOf("a"))
	})
	r := startSource(t, addr, Config{}, model.LocalCatalog)
	first := r.waitFor("the first catalog", func(s model.Snapshot) bool { return s.Local() != nil }).Local()
	close(release)
	moved := r.waitFor("the catalog at index 7", func(s model.Snapshot) bool { return s.Local() != nil && s.Local().Index == 7 }).Local()
	if moved.Len() != 1 || first.Len() != 1 {
		t.Fatalf("instances: %d at first, %d at index 7; want 1 and 1", first.Len(), moved.Len())
	}
	if !model.SameInstances(slices.Collect(moved.Services())[0], slices.Collect(first.Services())[0]) {
		t.Errorf("the catalog at index 7 copied the instances of the one at index %d; an index that moved alone must not copy them", first.Index)
	}
}
