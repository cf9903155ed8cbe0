package consul

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/entrypoint/routes"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// A service's CreateIndex, in the node dump and through the public
// endpoints, is its instances' registration order (issue 10, item 2).
func TestCreateIndexIsTheRegistrationOrder(t *testing.T) {
	var dump []*nodeInfo
	if err := json.Unmarshal([]byte(`[{"Node":"n1","Address":"10.0.0.1","Services":[
		{"ID":"web","Service":"web","Port":80,"CreateIndex":17,"ModifyIndex":40}]}]`), &dump); err != nil {
		t.Fatal(err)
	}
	dump[0].Services = append(dump[0].Services, fromAgentService(&api.AgentService{ID: "aaa", Service: "aaa", Port: 80, CreateIndex: 42}))
	cat := convertDump(dump, "dc1", "")
	got := map[string]uint64{}
	for _, in := range cat.Instances {
		got[in.Name] = in.Registered
	}
	if got["web"] != 17 || got["aaa"] != 42 {
		t.Fatalf("Registered = %v, want web 17 (the dump's CreateIndex), aaa 42 (the health endpoint's)", got)
	}
}

// Through a real Consul: a service registered after web, whose name sorts
// first, does not take web's host, also after web's registration is
// updated (CreateIndex stays, ModifyIndex moves); once web is deregistered
// and registered again, the newcomer holds it.
func TestTheFirstRegisteredKeepsItsHostInConsul(t *testing.T) {
	agent := testenv.Consul(t)
	c := agent.Client()
	tags := []string{"seamless.http.host=web.test"}
	register(t, c, "node-w", "10.0.0.1", &api.AgentService{ID: "web", Service: "web", Port: 80, Tags: tags})
	register(t, c, "node-x", "10.0.0.9", &api.AgentService{ID: "aaa", Service: "aaa", Port: 80, Tags: tags})
	r := startSource(t, agent.Addr(), Config{}, model.LocalCatalog)
	holder := func(s model.Snapshot) string {
		rt, _ := routes.Build(*s.Local(), routes.Policy{Sources: []string{Name}})
		for _, rule := range rt.Rules {
			if rule.Host == "web.test" {
				return rule.Service
			}
		}
		return ""
	}
	snap := r.waitFor("web and aaa", func(s model.Snapshot) bool { return len(instances(s, "web")) == 1 && len(instances(s, "aaa")) == 1 })
	if h := holder(snap); h != "web" {
		t.Fatalf("web.test is %s's, want web's (registered first)", h)
	}

	register(t, c, "node-w", "10.0.0.1", &api.AgentService{ID: "web", Service: "web", Port: 80, Tags: append(tags, "v2")})
	snap = r.waitFor("web updated", func(s model.Snapshot) bool {
		w := instances(s, "web")
		return len(w) == 1 && slices.Contains(w[0].Tags, "v2")
	})
	if h := holder(snap); h != "web" {
		t.Fatalf("after web's update web.test is %s's, want web's", h)
	}

	deregister(t, c, "node-w", "web")
	r.waitFor("web gone", func(s model.Snapshot) bool { return len(instances(s, "web")) == 0 })
	register(t, c, "node-w", "10.0.0.1", &api.AgentService{ID: "web", Service: "web", Port: 80, Tags: tags})
	snap = r.waitFor("web back", func(s model.Snapshot) bool { return len(instances(s, "web")) == 1 })
	if h := holder(snap); h != "aaa" {
		t.Fatalf("after web registered again web.test is %s's, want aaa's (now the earlier)", h)
	}
}
