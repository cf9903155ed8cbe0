package model

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
)

// services is a catalog of names, two instances each, sorted, per
// service; port is each instance's port.
func services(port int, names ...string) [][]Instance {
	var out [][]Instance
	for _, n := range names {
		out = append(out, []Instance{
			{Source: "consul", Name: n, Node: "n1", ID: "n1/" + n, Address: "10.0.0.1", Port: port},
			{Source: "consul", Name: n, Node: "n2", ID: "n2/" + n, Address: "10.0.0.2", Port: port},
		})
	}
	return out
}

// A catalog made per service reads as the same catalog made whole, to
// every reader: its length, its one list, its runs, its order, equality
// and merging.
func TestAPerServiceCatalogReadsAsTheWholeOne(t *testing.T) {
	parts := services(80, "api", "db", "web")
	per := PerService("dc1", []Node{{Name: "n1"}, {Name: "n2"}}, append(parts[:1:1], nil, parts[1], parts[2]), 7)
	whole := &Catalog{Datacenter: "dc1", Nodes: per.Nodes, Instances: slices.Concat(parts...), Index: 7}

	if per.Len() != 6 || !reflect.DeepEqual(per.All(), whole.Instances) {
		t.Errorf("Len %d, All %+v; want the 6 instances of the whole catalog", per.Len(), per.All())
	}
	if got, want := slices.Collect(per.Services()), slices.Collect(whole.Services()); !reflect.DeepEqual(got, want) {
		t.Errorf("runs %+v, want %+v (the empty list left out)", got, want)
	}
	if got := slices.Collect(per.Services()); !SameInstances(got[1], parts[1]) {
		t.Error("a run is a copy of the list it was made from, not that list")
	}
	if !per.SortedByService() || !whole.SortedByService() {
		t.Error("a sorted catalog is not sorted by service")
	}
	for _, pair := range [][2]*Catalog{{per, whole}, {whole, per}, {per, PerService("dc1", per.Nodes, parts, 8)}} {
		a := map[Query]Result{LocalCatalog: {Catalog: pair[0]}}
		b := map[Query]Result{LocalCatalog: {Catalog: pair[1]}}
		if !EqualResults(a, b) {
			t.Errorf("%+v and %+v differ", pair[0], pair[1])
		}
	}
	moved := slices.Clone(parts)
	moved[2] = services(81, "web")[0]
	if EqualResults(map[Query]Result{LocalCatalog: {Catalog: per}},
		map[Query]Result{LocalCatalog: {Catalog: PerService("dc1", per.Nodes, moved, 7)}}) {
		t.Error("a catalog whose web moved equals the one before")
	}

	sole := Merge(map[string]Snapshot{"consul": {Results: map[Query]Result{LocalCatalog: {Catalog: per}}}}, []string{"consul"})
	if r, _ := sole.Result(LocalCatalog); r.Catalog != per {
		t.Error("the merge of one sorted per-service catalog is a copy, not the catalog")
	}
	file := &Catalog{Instances: []Instance{{Source: "file", Name: "cache", ID: "c", Address: "10.0.0.9", Port: 6379},
		{Source: "file", Name: "web", ID: "w", Address: "10.0.0.1", Port: 80}}} // consul's n1/web is first
	both := Merge(map[string]Snapshot{"consul": {Results: map[Query]Result{LocalCatalog: {Catalog: per}}},
		"file": {Results: map[Query]Result{LocalCatalog: {Catalog: file}}}}, []string{"consul", "file"}).Local()
	var got []string
	for _, in := range both.All() {
		got = append(got, in.Source+":"+in.ID)
	}
	want := []string{"consul:n1/api", "consul:n2/api", "file:c", "consul:n1/db", "consul:n2/db", "consul:n1/web", "consul:n2/web"}
	if !slices.Equal(got, want) {
		t.Errorf("merged %v, want %v", got, want)
	}
}

// A per-service catalog whose lists break the order (a service twice, an
// instance twice at one address) is not shared as the merged one.
func TestAnUnsortedPerServiceCatalogIsMerged(t *testing.T) {
	web := services(80, "web")[0]
	for _, tt := range []struct {
		name string
		c    *Catalog
		want int
	}{
		{"a service twice", PerService("", nil, [][]Instance{web, web}, 0), 2},
		{"an instance twice", PerService("", nil, [][]Instance{{web[0], web[0]}}, 0), 1},
	} {
		got := Merge(map[string]Snapshot{"consul": {Results: map[Query]Result{LocalCatalog: {Catalog: tt.c}}}}, []string{"consul"}).Local()
		if got.Len() != tt.want || !got.SortedByService() {
			t.Errorf("%s: merged to %d instances (sorted by service: %t), want %d, sorted", tt.name, got.Len(), got.SortedByService(), tt.want)
		}
	}
}

// ZipServices pairs the services of two catalogs by name, whatever their
// order and however they were made.
func TestZipServicesPairsByName(t *testing.T) {
	a := PerService("", nil, services(80, "api", "db", "web"), 0)
	b := &Catalog{Instances: slices.Concat(services(81, "web", "cache", "api")...)} // unsorted
	c := &Catalog{Instances: slices.Concat(services(81, "api", "cache", "web")...)}
	want := "api:2/2 cache:0/2 db:2/0 web:2/2 "
	for name, other := range map[string]*Catalog{"sorted": c, "unsorted": b} {
		got := ""
		ZipServices(a, other, func(n string, as, bs []Instance) {
			for _, in := range slices.Concat(as, bs) {
				if in.Name != n {
					t.Errorf("%s: %s's instances hold %s", name, n, in.Name)
				}
			}
			got += fmt.Sprintf("%s:%d/%d ", n, len(as), len(bs))
		})
		if got != want {
			t.Errorf("%s: zipped %q, want %q", name, got, want)
		}
	}
}

// A Merger checks only the services whose lists changed since the
// catalog it shared last. To see that it does not read the others, the
// test breaks the rule that lists are never written: an unchanged list
// made unsorted behind its back is still shared; a new list that is
// unsorted is not, and Merge, which remembers nothing, reads them all.
func TestAMergerReadsOnlyTheServicesThatChanged(t *testing.T) {
	parts := services(80, "api", "db", "web")
	snap := func(parts [][]Instance) map[string]Snapshot {
		return map[string]Snapshot{"consul": {Results: map[Query]Result{LocalCatalog: {Catalog: PerService("dc1", nil, parts, 1)}}}}
	}
	var m Merger
	first := snap(parts)
	if r, _ := m.Merge(first, []string{"consul"}).Result(LocalCatalog); r.Catalog != first["consul"].Local() {
		t.Fatal("the first sorted catalog is not shared")
	}
	parts[0][0], parts[0][1] = parts[0][1], parts[0][0] // api, unsorted behind the merger's back
	next := snap(slices.Concat(parts[:2], services(81, "web")))
	if r, _ := m.Merge(next, []string{"consul"}).Result(LocalCatalog); r.Catalog != next["consul"].Local() {
		t.Error("a catalog where only web changed was checked whole: api's list was read again")
	}
	if r, _ := Merge(next, []string{"consul"}).Result(LocalCatalog); r.Catalog == next["consul"].Local() {
		t.Error("Merge shared a catalog with an unsorted service")
	}
	web := services(81, "web")[0]
	web[0], web[1] = web[1], web[0]
	bad := snap(slices.Concat(parts[1:2], [][]Instance{web}))
	got, _ := m.Merge(bad, []string{"consul"}).Result(LocalCatalog)
	if got.Catalog == bad["consul"].Local() || !slices.IsSortedFunc(got.Catalog.All(), compareInstances) {
		t.Error("a changed list that is unsorted was shared, not sorted")
	}
}
