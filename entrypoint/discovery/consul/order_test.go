package consul

import (
	"encoding/json"
	"testing"

	"github.com/hashicorp/consul/api"
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
