package guard

import (
	"github.com/seamless-lb/seamless/entrypoint/model"
)

// smallGroup is the most instances of one service compared pair by pair;
// a larger service gets a map of its IDs.
const smallGroup = 64

// gone returns the instances of prev that cur no longer has (by service
// name and ID), leaving out those skip reports. The catalogs are compared
// service by service (model.ZipServices): a change allocates for what it
// removed, not a set of the whole catalog, and a service whose list cur
// shares with prev is not read.
func gone(prev, cur *model.Catalog, skip func(model.Instance) bool) []model.Instance {
	var out []model.Instance
	model.ZipServices(prev, cur, func(_ string, ps, cs []model.Instance) {
		if model.SameInstances(ps, cs) {
			return // the same list, handed on by its source
		}
		if len(ps) > smallGroup || len(cs) > smallGroup {
			out = append(out, goneFrom(ps, cs, skip)...)
			return
		}
		// Loops over indexes, not slices' generic helpers, which would
		// copy two instances (hundreds of bytes) per comparison.
		for i := range ps {
			found := false
			for k := 0; k < len(cs) && !found; k++ {
				found = cs[k].ID == ps[i].ID
			}
			if !found && (skip == nil || !skip(ps[i])) {
				out = append(out, ps[i])
			}
		}
	})
	return out
}

// goneFrom is gone for one service, with a set of cur's instances.
func goneFrom(prev, cur []model.Instance, skip func(model.Instance) bool) []model.Instance {
	present := make(map[string]bool, len(cur))
	for i := range cur {
		present[cur[i].ID] = true
	}
	var out []model.Instance
	for _, in := range prev {
		if !present[in.ID] && (skip == nil || !skip(in)) {
			out = append(out, in)
		}
	}
	return out
}
