package model

import (
	"fmt"
	"reflect"
	"testing"
)

// EqualInstances sees a change to any field of an Instance, including
// one added later: each field of a filled instance is set to another
// value in turn, by reflection.
func TestEqualInstancesSeesEveryField(t *testing.T) {
	full := Instance{Source: "s", Datacenter: "dc", Node: "n", NodeID: "nid", NodeAddress: "10.0.0.1",
		NodeTaggedAddresses: map[string]string{"lan": "10.0.0.1"}, NodeMeta: map[string]string{"rack": "1"},
		ID: "id", Name: "web", Kind: "k", Namespace: "ns", Address: "10.0.0.2", Port: 80, Tags: []string{"a"},
		Meta: map[string]string{"v": "1"}, TaggedAddresses: map[string]string{"wan": "192.0.2.1"}, Weight: 2,
		WarningWeight: 1, Status: StatusPassing, Checks: []Check{{CheckID: "c", Status: StatusPassing}},
		NodeChecks: []Check{{CheckID: "serfHealth", Status: StatusPassing}}, Registered: 7}
	if !EqualInstances([]Instance{full}, []Instance{full}) {
		t.Fatal("an instance differs from itself")
	}
	typ := reflect.TypeOf(full)
	for i := range typ.NumField() {
		changed := full
		f := reflect.ValueOf(&changed).Elem().Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString(f.String() + "x")
		case reflect.Int:
			f.SetInt(f.Int() + 1)
		case reflect.Uint64:
			f.SetUint(f.Uint() + 1)
		case reflect.Slice:
			f.Set(reflect.Append(f, f.Index(0)))
		case reflect.Map:
			m := reflect.MakeMap(f.Type())
			m.SetMapIndex(reflect.ValueOf("other"), reflect.ValueOf("1"))
			f.Set(m)
		default:
			t.Fatalf("field %s: kind %s not covered by this test", typ.Field(i).Name, f.Kind())
		}
		if EqualInstances([]Instance{full}, []Instance{changed}) {
			t.Errorf("a change to %s is not seen", typ.Field(i).Name)
		}
	}
	if EqualInstances([]Instance{full}, nil) {
		t.Error("one instance equals none")
	}
}

// EqualResults sees a change to any field of a Node (the instances are
// EqualInstances'), and to a Result's KV pairs and datacenters.
func TestEqualResultsSeesEveryNodeField(t *testing.T) {
	node := Node{ID: "i", Name: "n", Address: "10.0.0.1", Datacenter: "dc", TaggedAddresses: map[string]string{"lan": "x"},
		Meta: map[string]string{"m": "1"}}
	results := func(n Node) map[Query]Result {
		return map[Query]Result{
			LocalCatalog:               {Catalog: &Catalog{Datacenter: "dc", Nodes: []Node{n}}},
			{Kind: QueryKey, Key: "k"}: {Pairs: []KVPair{{Key: "k", Value: "v"}}},
			{Kind: QueryDatacenters}:   {Datacenters: []string{"dc"}},
		}
	}
	if !EqualResults(results(node), results(node)) {
		t.Fatal("results differ from themselves")
	}
	typ := reflect.TypeOf(node)
	for i := range typ.NumField() {
		changed := node
		f := reflect.ValueOf(&changed).Elem().Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString(f.String() + "x")
		case reflect.Map:
			f.Set(reflect.ValueOf(map[string]string{"other": "1"}))
		default:
			t.Fatalf("field %s: kind %s not covered by this test", typ.Field(i).Name, f.Kind())
		}
		if EqualResults(results(node), results(changed)) {
			t.Errorf("a change to Node.%s is not seen", typ.Field(i).Name)
		}
	}
	other := results(node)
	other[Query{Kind: QueryKey, Key: "k"}] = Result{Pairs: []KVPair{{Key: "k", Value: "w"}}}
	if EqualResults(results(node), other) {
		t.Error("a changed value is not seen")
	}
	other[Query{Kind: QueryKey, Key: "k"}] = Result{}
	if EqualResults(results(node), other) {
		t.Error("a key gone is not seen")
	}
}

// The local catalog of a single source, sorted and without an instance
// twice, is the merged one itself, not a copy made at every change; with a
// duplicate, or unsorted, it is merged as before.
func TestMergeOfOneSourceSharesItsCatalog(t *testing.T) {
	in := func(name, node, addr string, port int) Instance {
		return Instance{Source: "consul", Name: name, ID: name + "-" + node, Node: node, Address: addr, Port: port}
	}
	kv := Query{Kind: QueryKey, Key: "k"}
	snap := func(c *Catalog) map[string]Snapshot {
		return map[string]Snapshot{"consul": {Source: "consul", Results: map[Query]Result{
			LocalCatalog: {Catalog: c}, kv: {Pairs: []KVPair{{Key: "k", Value: "v"}}}}}}
	}
	sorted := &Catalog{Datacenter: "dc1", Nodes: []Node{{Name: "n1"}, {Name: "n2"}},
		Instances: []Instance{in("api", "n1", "10.0.0.1", 80), in("web", "n1", "10.0.0.1", 80), in("web", "n2", "10.0.0.2", 80)}}
	st := Merge(snap(sorted), []string{"consul"})
	if r, _ := st.Result(LocalCatalog); r.Catalog != sorted {
		t.Error("the sole sorted catalog was copied")
	}
	if r, _ := st.Result(kv); len(r.Pairs) != 1 {
		t.Errorf("the other answers: %+v", r)
	}
	dup := &Catalog{Instances: []Instance{in("web", "n1", "10.0.0.1", 80), in("web", "n2", "10.0.0.1", 80)}}
	if got := Merge(snap(dup), []string{"consul"}).Local(); len(got.Instances) != 1 {
		t.Errorf("an instance twice at one address: merged to %d instances, want 1", len(got.Instances))
	}
	unsorted := &Catalog{Instances: []Instance{in("web", "n1", "10.0.0.1", 80), in("api", "n1", "10.0.0.1", 80)}}
	if got := Merge(snap(unsorted), []string{"consul"}).Local(); got.Instances[0].Name != "api" {
		t.Errorf("an unsorted catalog was not sorted: %+v", got.Instances)
	}
}

// A catalog re-dated by its source (the same instances at a newer index,
// as every change's answer to the service list makes one) against the
// one before, at 1,000 services × 10 instances:
//
//	go test -run - -bench EqualResultsOfARedatedCatalog ./entrypoint/model/
func BenchmarkEqualResultsOfARedatedCatalog(b *testing.B) {
	cat := &Catalog{Datacenter: "dc1", Index: 7}
	for i := range 10_000 {
		cat.Instances = append(cat.Instances, Instance{Source: "consul", Name: fmt.Sprintf("svc-%04d", i/10),
			ID: fmt.Sprintf("node-%d/svc-%04d", i%10, i/10), Address: "10.0.0.1", Port: 8000 + i, Status: StatusPassing,
			Tags: []string{"seamless.http.host=x.example"}, Checks: []Check{{CheckID: "c", Status: StatusPassing}}})
	}
	redated := *cat
	redated.Index = 8
	before := map[Query]Result{LocalCatalog: {Catalog: cat}}
	after := map[Query]Result{LocalCatalog: {Catalog: &redated}}
	for b.Loop() {
		if !EqualResults(before, after) {
			b.Fatal("a re-dated catalog differs from its original")
		}
	}
}
