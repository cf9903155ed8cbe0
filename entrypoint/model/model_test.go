package model

import "testing"

func TestServiceID(t *testing.T) {
	for _, tc := range []struct{ node, id, want string }{
		{"node-a", "node-a/web-1", "web-1"}, // Consul: node/serviceID
		{"", "10.0.0.1:80", "10.0.0.1:80"},  // files: no node
		{"node-a", "web-1", "web-1"},
		{"node-a", "node-b/web-1", "node-b/web-1"}, // another node's prefix is part of the ID
	} {
		if got := (Instance{Node: tc.node, ID: tc.id}).ServiceID(); got != tc.want {
			t.Errorf("ServiceID(node %q, id %q) = %q, want %q", tc.node, tc.id, got, tc.want)
		}
	}
}

func TestMergeKeepsTheFirstSourcesInstance(t *testing.T) {
	in := func(src string) Instance {
		return Instance{Source: src, Name: "web", ID: src, Address: "10.0.0.1", Port: 80}
	}
	snap := func(src string) Snapshot {
		return Snapshot{Source: src, Results: map[Query]Result{LocalCatalog: {Catalog: &Catalog{Instances: []Instance{in(src)}}}}}
	}
	st := Merge(map[string]Snapshot{"file": snap("file"), "consul": snap("consul")}, []string{"consul", "file"})
	if got := st.Local().Instances; len(got) != 1 || got[0].Source != "consul" {
		t.Errorf("merged %+v, want consul's instance only", got)
	}
}

func TestWorstStatus(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want string
	}{
		{nil, StatusPassing},
		{[]string{StatusPassing, StatusWarning}, StatusWarning},
		{[]string{StatusWarning, StatusCritical, StatusPassing}, StatusCritical},
		{[]string{StatusCritical, StatusMaintenance}, StatusMaintenance},
	} {
		if got := WorstStatus(tc.in...); got != tc.want {
			t.Errorf("WorstStatus(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
