package model

import (
	"cmp"
	"slices"
	"strconv"
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
	names := slices.Clone(order)
	for n := range snaps {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	slices.Sort(names[len(order):])

	results := map[Query]Result{}
	var local *Catalog
	seenInst := map[string]bool{}
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
				local = &Catalog{}
			}
			if r.Catalog == nil {
				continue
			}
			if local.Datacenter == "" {
				local.Datacenter = r.Catalog.Datacenter
			}
			for _, node := range r.Catalog.Nodes {
				if !seenNode[node.Name] {
					seenNode[node.Name] = true
					local.Nodes = append(local.Nodes, node)
				}
			}
			for _, in := range r.Catalog.Instances {
				k := in.Name + "\x00" + in.Address + "\x00" + strconv.Itoa(in.Port)
				if !seenInst[k] {
					seenInst[k] = true
					local.Instances = append(local.Instances, in)
				}
			}
		}
	}
	if local != nil {
		SortCatalog(local)
		results[LocalCatalog] = Result{Catalog: local}
	}
	return State{results: results}
}

// SortCatalog orders nodes by name and instances by service name, node,
// address, port and ID.
func SortCatalog(c *Catalog) {
	slices.SortFunc(c.Nodes, func(a, b Node) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(c.Instances, func(a, b Instance) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Node, b.Node),
			cmp.Compare(a.Address, b.Address), cmp.Compare(a.Port, b.Port), cmp.Compare(a.ID, b.ID))
	})
}
