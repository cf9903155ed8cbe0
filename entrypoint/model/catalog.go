package model

import (
	"iter"
	"maps"
	"slices"
)

// PerService makes a catalog from one list of instances per service, in
// order of service name, each list sorted as SortCatalog sorts and all of
// one name. The catalog keeps the lists, not a copy: a source that
// changes one service hands the next catalog every other service's list
// as it was, so a change costs the stages after it what changed (a
// stage skips a service whose list is the same one; see SameInstances).
// The catalog takes services; empty lists are left out.
func PerService(datacenter string, nodes []Node, services [][]Instance, index uint64) *Catalog {
	empty := func(s []Instance) bool { return len(s) == 0 }
	if slices.ContainsFunc(services, empty) {
		services = slices.DeleteFunc(slices.Clone(services), empty)
	}
	return &Catalog{Datacenter: datacenter, Nodes: nodes, Index: index, services: services}
}

// Len is the number of instances.
func (c *Catalog) Len() int {
	if c.services == nil {
		return len(c.Instances)
	}
	n := 0
	for _, s := range c.services {
		n += len(s)
	}
	return n
}

// All returns every instance in one list: Instances itself, or for a
// PerService catalog a new list, for the readers that need the whole
// catalog at once (the snapshot on disk, a user template); the others
// read Services.
func (c *Catalog) All() []Instance {
	if c.services == nil {
		return c.Instances
	}
	out := make([]Instance, 0, c.Len())
	for _, s := range c.services {
		out = append(out, s...)
	}
	return out
}

// Services yields the instances one run of a service name at a time, in
// the catalog's order: each service once in a sorted catalog, and a
// PerService catalog's lists as it holds them. The runs are the
// catalog's own: read them, never write them.
func (c *Catalog) Services() iter.Seq[[]Instance] {
	return func(yield func([]Instance) bool) {
		r := runs{c: c}
		for s, ok := r.next(); ok; s, ok = r.next() {
			if !yield(s) {
				return
			}
		}
	}
}

// runs walks a catalog's runs by hand: ZipServices walks two at once, and
// iter.Pull would switch goroutines at every service.
type runs struct {
	c *Catalog
	i int
}

func (r *runs) next() ([]Instance, bool) {
	if r.c.services != nil {
		if r.i >= len(r.c.services) {
			return nil, false
		}
		s := r.c.services[r.i]
		r.i++
		return s[:len(s):len(s)], true
	}
	in := r.c.Instances
	if r.i >= len(in) {
		return nil, false
	}
	j := r.i + 1
	for j < len(in) && in[j].Name == in[r.i].Name {
		j++
	}
	s := in[r.i:j:j]
	r.i = j
	return s, true
}

// SortedByService reports whether each service is one run and the runs
// come in order of name, as in a sorted catalog. Only the names where
// runs meet are compared.
func (c *Catalog) SortedByService() bool {
	last := ""
	first := true
	for s := range c.Services() {
		if !first && s[0].Name <= last {
			return false
		}
		first, last = false, s[0].Name
	}
	return true
}

// ZipServices calls f with each service's instances in a and in b (nil
// where one has none), in order of name. Catalogs sorted by service are
// walked side by side, without a map of either; a service whose lists
// are the same one (SameInstances) costs f nothing to recognise.
func ZipServices(a, b *Catalog, f func(name string, as, bs []Instance)) {
	if !a.SortedByService() || !b.SortedByService() {
		ag, bg := groupByService(a), groupByService(b)
		names := slices.Sorted(maps.Keys(ag))
		for n := range bg {
			if _, ok := ag[n]; !ok {
				names = append(names, n)
			}
		}
		slices.Sort(names)
		for _, n := range names {
			f(n, ag[n], bg[n])
		}
		return
	}
	ra, rb := runs{c: a}, runs{c: b}
	as, okA := ra.next()
	bs, okB := rb.next()
	for okA || okB {
		switch {
		case !okB || okA && as[0].Name < bs[0].Name:
			f(as[0].Name, as, nil)
			as, okA = ra.next()
		case !okA || bs[0].Name < as[0].Name:
			f(bs[0].Name, nil, bs)
			bs, okB = rb.next()
		default:
			f(as[0].Name, as, bs)
			as, okA = ra.next()
			bs, okB = rb.next()
		}
	}
}

// groupByService keys c's instances by service name; a service that is
// one run is not copied.
func groupByService(c *Catalog) map[string][]Instance {
	out := map[string][]Instance{}
	for s := range c.Services() {
		if prev, ok := out[s[0].Name]; ok {
			out[s[0].Name] = append(slices.Clip(prev), s...)
		} else {
			out[s[0].Name] = s
		}
	}
	return out
}

// equalInstancesOf reports whether a and b hold the same instances in
// the same order, comparing service by service so that lists two
// PerService catalogs share are not read.
func equalInstancesOf(a, b *Catalog) bool {
	if a.services != nil && b.services != nil {
		return slices.EqualFunc(a.services, b.services, EqualInstances)
	}
	return EqualInstances(a.All(), b.All())
}
