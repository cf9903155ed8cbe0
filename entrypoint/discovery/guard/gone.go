package guard

import (
	"github.com/seamless-lb/seamless/entrypoint/model"
)

// smallGroup is the most instances of one service compared pair by pair;
// a larger service gets a map of its IDs.
const smallGroup = 64

// gone returns the instances of prev that cur no longer has (by service
// name and ID), leaving out those skip reports. Sources sort their
// catalogs by service name (model.SortCatalog), so the two are walked
// service by service and a change allocates for what it removed, not a
// set of the whole catalog; an unsorted catalog gets the set.
func gone(prev, cur []model.Instance, skip func(model.Instance) bool) []model.Instance {
	if model.SameInstances(prev, cur) {
		return nil // the same list, re-dated by its source
	}
	// Loops over indexes, not slices' generic helpers, which would copy
	// two instances (hundreds of bytes) per comparison.
	if !model.SortedByName(prev) || !model.SortedByName(cur) {
		return goneFrom(prev, cur, skip)
	}
	var out []model.Instance
	j := 0
	for i := 0; i < len(prev); {
		name := prev[i].Name
		ie := i + 1
		for ie < len(prev) && prev[ie].Name == name {
			ie++
		}
		for j < len(cur) && cur[j].Name < name {
			j++
		}
		je := j
		for je < len(cur) && cur[je].Name == name {
			je++
		}
		if ie-i > smallGroup || je-j > smallGroup {
			out = append(out, goneFrom(prev[i:ie], cur[j:je], skip)...)
			i, j = ie, je
			continue
		}
		for ; i < ie; i++ {
			found := false
			for k := j; k < je && !found; k++ {
				found = cur[k].ID == prev[i].ID
			}
			if !found && (skip == nil || !skip(prev[i])) {
				out = append(out, prev[i])
			}
		}
		j = je
	}
	return out
}

// goneFrom is gone with a set of cur's instances.
func goneFrom(prev, cur []model.Instance, skip func(model.Instance) bool) []model.Instance {
	present := make(map[[2]string]bool, len(cur))
	for _, in := range cur {
		present[[2]string{in.Name, in.ID}] = true
	}
	var out []model.Instance
	for _, in := range prev {
		if !present[[2]string{in.Name, in.ID}] && (skip == nil || !skip(in)) {
			out = append(out, in)
		}
	}
	return out
}
