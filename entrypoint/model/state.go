package model

import (
	"cmp"
	"maps"
	"reflect"
	"slices"
	"strings"
)

// State is the merged view of every source that templates render from.
// Merge builds it sorted, so the same inputs always render the same bytes.
type State struct {
	results map[Query]Result
}

// NewState returns a State answering exactly results; for tests and for
// `seamless render`.
func NewState(results map[Query]Result) State { return State{results: results} }

// Result returns the answer to q and whether one has arrived. A template
// that needs a query without an answer is not applied yet (as
// consul-template waits for every dependency before its first render).
func (s State) Result(q Query) (Result, bool) {
	r, ok := s.results[q]
	return r, ok
}

// Local returns the merged local catalog (empty when no source has one).
func (s State) Local() Catalog {
	if r, ok := s.results[LocalCatalog]; ok && r.Catalog != nil {
		return *r.Catalog
	}
	return Catalog{}
}

// Merge combines the latest snapshot of every source. order lists source
// names by precedence: when two sources report the same service at the
// same address and port, the earlier source's instance is kept. Local
// catalogs are merged; every other query is answered by the first source
// that has it.
func Merge(snaps map[string]Snapshot, order []string) State {
	st, _ := merge(snaps, order, nil)
	return st
}

// Merger is Merge with a memory of the last catalog it passed on as
// merged (see soleCatalog), so that the next one's check reads only the
// services whose lists changed: a per-service catalog of 10,000 × 10
// costs a pass a few milliseconds less. The zero Merger is ready; it is
// not safe for concurrent use.
type Merger struct{ shared *Catalog }

// Merge is model.Merge.
func (m *Merger) Merge(snaps map[string]Snapshot, order []string) State {
	var st State
	st, m.shared = merge(snaps, order, m.shared)
	return st
}

// merge is Merge; it also returns the local catalog when it is one
// source's, shared as it came, which checked was if not nil.
func merge(snaps map[string]Snapshot, order []string, checked *Catalog) (State, *Catalog) {
	names := slices.Clone(order)
	for n := range snaps {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	slices.Sort(names[len(order):])

	results := map[Query]Result{}
	if only := soleCatalog(snaps, checked); only != nil {
		for _, n := range names {
			for q, r := range snaps[n].Results {
				if _, dup := results[q]; !dup && q != LocalCatalog {
					results[q] = r
				}
			}
		}
		results[LocalCatalog] = Result{Catalog: only}
		return State{results: results}, only
	}
	var local *Catalog
	type instKey struct {
		name, address string
		port          int
	}
	total := 0
	for _, snap := range snaps {
		if r, ok := snap.Results[LocalCatalog]; ok && r.Catalog != nil {
			total += r.Catalog.Len()
		}
	}
	seenInst := make(map[instKey]bool, total)
	seenNode := map[string]bool{}
	for _, n := range names {
		snap, ok := snaps[n]
		if !ok {
			continue
		}
		for q, r := range snap.Results {
			if q != LocalCatalog {
				if _, dup := results[q]; !dup {
					results[q] = r
				}
				continue
			}
			if local == nil {
				local = &Catalog{Instances: make([]Instance, 0, total)}
			}
			if r.Catalog == nil {
				continue
			}
			if local.Datacenter == "" {
				local.Datacenter = r.Catalog.Datacenter
			}
			local.Index = max(local.Index, r.Catalog.Index) // Consul's alone sets one
			for _, node := range r.Catalog.Nodes {
				if !seenNode[node.Name] {
					seenNode[node.Name] = true
					local.Nodes = append(local.Nodes, node)
				}
			}
			for s := range r.Catalog.Services() {
				for _, in := range s {
					k := instKey{in.Name, in.Address, in.Port}
					if !seenInst[k] {
						seenInst[k] = true
						local.Instances = append(local.Instances, in)
					}
				}
			}
		}
	}
	if local != nil {
		SortCatalog(local)
		results[LocalCatalog] = Result{Catalog: local}
	}
	return State{results: results}, nil
}

// soleCatalog returns the one local catalog of snaps when it is already
// what merging it would make (sorted, no instance twice at one address,
// no node twice): the merged state then shares it rather than copy every
// instance at every change. Snapshots are never written once sent. A
// service whose list is one that checked (an earlier catalog soleCatalog
// returned) holds is not read again.
func soleCatalog(snaps map[string]Snapshot, checked *Catalog) *Catalog {
	var only *Catalog
	for _, snap := range snaps {
		if r, ok := snap.Results[LocalCatalog]; ok {
			if only != nil || r.Catalog == nil {
				return nil
			}
			only = r.Catalog
		}
	}
	if only == nil || !slices.IsSortedFunc(only.Nodes, compareNodes) || !only.SortedByService() {
		return nil
	}
	for i := 1; i < len(only.Nodes); i++ {
		if only.Nodes[i].Name == only.Nodes[i-1].Name {
			return nil
		}
	}
	if checked == nil {
		checked = &Catalog{}
	}
	ok := true
	ZipServices(checked, only, func(_ string, was, svc []Instance) {
		if ok && svc != nil && !SameInstances(was, svc) {
			ok = mergedService(svc)
		}
	})
	if !ok {
		return nil
	}
	return only
}

// mergedService reports whether the instances of one service are as
// merging makes them: sorted, and none twice at one address.
func mergedService(svc []Instance) bool {
	if !instancesSorted(svc) {
		return false
	}
	for a := range svc {
		for b := a + 1; b < len(svc); b++ {
			if svc[a].Address == svc[b].Address && svc[a].Port == svc[b].Port {
				return false
			}
		}
	}
	return true
}

func compareNodes(a, b Node) int { return cmp.Compare(a.Name, b.Name) }

func compareInstances(a, b Instance) int { return compareInstanceAt(&a, &b) }

// compareInstanceAt stops at the first field that differs (cmp.Or would
// compare all five) and copies no instance: Merge checks the order of
// every instance of each service that changed.
func compareInstanceAt(a, b *Instance) int {
	if c := strings.Compare(a.Name, b.Name); c != 0 {
		return c
	}
	if c := strings.Compare(a.Node, b.Node); c != 0 {
		return c
	}
	if c := strings.Compare(a.Address, b.Address); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Port, b.Port); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID)
}

// instancesSorted is slices.IsSortedFunc(in, compareInstances) without
// copying two instances per comparison.
func instancesSorted(in []Instance) bool {
	for i := 1; i < len(in); i++ {
		if compareInstanceAt(&in[i], &in[i-1]) < 0 {
			return false
		}
	}
	return true
}

// SortCatalog orders nodes by name and instances by service name, node,
// address, port and ID.
func SortCatalog(c *Catalog) {
	slices.SortFunc(c.Nodes, compareNodes)
	SortInstances(c.Instances)
}

// SortInstances orders instances as SortCatalog does.
func SortInstances(in []Instance) { slices.SortFunc(in, compareInstances) }

// EqualInstances reports whether a and b hold the same instances in the
// same order, every field alike: what lets a stage reuse its work for a
// service whose instances did not change. It compares field by field
// (reflect.DeepEqual costs more than the work it would save).
func EqualInstances(a, b []Instance) bool {
	if len(a) != len(b) {
		return false
	}
	if SameInstances(a, b) {
		return true
	}
	for i := range a { // by pointer: an Instance is some 300 bytes
		if !equalInstance(&a[i], &b[i]) {
			return false
		}
	}
	return true
}

// SameInstances: a and b are the same list, so equal without reading
// them. A catalog is never written once made, and a source that only
// moved its index hands on its last catalog's list.
func SameInstances(a, b []Instance) bool { return SameList(a, b) }

// SameList reports whether a and b are the same slice of the same array
// (both empty counts): for what is never written once made, equal
// without reading it.
func SameList[E any](a, b []E) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

func equalInstance(a, b *Instance) bool {
	return a.Source == b.Source && a.Datacenter == b.Datacenter && a.Node == b.Node && a.NodeID == b.NodeID &&
		a.NodeAddress == b.NodeAddress && a.ID == b.ID && a.Name == b.Name && a.Kind == b.Kind &&
		a.Namespace == b.Namespace && a.Address == b.Address && a.Port == b.Port && a.Weight == b.Weight &&
		a.WarningWeight == b.WarningWeight && a.Status == b.Status && a.Registered == b.Registered &&
		equalSlices(a.Tags, b.Tags) && equalSlices(a.Checks, b.Checks) && equalSlices(a.NodeChecks, b.NodeChecks) &&
		equalMaps(a.Meta, b.Meta) && equalMaps(a.TaggedAddresses, b.TaggedAddresses) &&
		equalMaps(a.NodeMeta, b.NodeMeta) && equalMaps(a.NodeTaggedAddresses, b.NodeTaggedAddresses)
}

// equalSlices and equalMaps take the same list or map for equal without
// reading it: consecutive catalogs of a source share those of every
// instance that did not change.
func equalSlices[E comparable](a, b []E) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0] || slices.Equal(a, b))
}

func equalMaps(a, b map[string]string) bool {
	return len(a) == len(b) && (len(a) == 0 ||
		reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer() || maps.Equal(a, b))
}

// EqualResults reports whether two sets of answers are the same, as
// reflect.DeepEqual would but without walking every instance through
// reflection.
func EqualResults(a, b map[Query]Result) bool {
	if len(a) != len(b) {
		return false
	}
	for q, ra := range a {
		rb, ok := b[q]
		if !ok || !equalResult(ra, rb) {
			return false
		}
	}
	return true
}

func equalResult(a, b Result) bool {
	if (a.Catalog == nil) != (b.Catalog == nil) || (a.Pairs == nil) != (b.Pairs == nil) ||
		(a.Datacenters == nil) != (b.Datacenters == nil) ||
		!slices.Equal(a.Pairs, b.Pairs) || !slices.Equal(a.Datacenters, b.Datacenters) {
		return false
	}
	if a.Catalog == nil || a.Catalog == b.Catalog {
		return true
	}
	ca, cb := a.Catalog, b.Catalog
	return ca.Datacenter == cb.Datacenter && equalInstancesOf(ca, cb) &&
		slices.EqualFunc(ca.Nodes, cb.Nodes, func(x, y Node) bool {
			return x.ID == y.ID && x.Name == y.Name && x.Address == y.Address && x.Datacenter == y.Datacenter &&
				maps.Equal(x.TaggedAddresses, y.TaggedAddresses) && maps.Equal(x.Meta, y.Meta)
		})
}
