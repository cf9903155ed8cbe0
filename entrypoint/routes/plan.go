package routes

import "maps"

// maxOver is how many changed backends a plan carries over its base
// before a commit folds them in: a plan copies them, the fold copies
// every backend, and about the square root of a thousand backends keeps
// both small per change.
const maxOver = 32

// slotPlan is the table a rendering proposes: the slots of every backend
// it renders, and nothing else. So that one change does not make a map of
// every backend, a plan that renders the backends of the table it starts
// from holds that table's map (base) and, over it, the backends whose
// slots differ (over); without a base, over holds every backend. Neither
// map is written once the plan is made.
type slotPlan struct {
	base map[string][]slot
	over map[string][]slot
}

// get returns the slots of backend, and whether the plan holds it.
func (p slotPlan) get(backend string) ([]slot, bool) {
	if s, ok := p.over[backend]; ok {
		return s, true
	}
	s, ok := p.base[backend]
	return s, ok
}

// len is the number of backends the plan holds.
func (p slotPlan) len() int {
	if p.base != nil {
		return len(p.base)
	}
	return len(p.over)
}

// all returns every backend's slots in one new map.
func (p slotPlan) all() map[string][]slot {
	m := make(map[string][]slot, p.len())
	maps.Copy(m, p.base)
	maps.Copy(m, p.over)
	return m
}

// planner makes a rendering's plan from the committed one, backend by
// backend.
type planner struct {
	from    slotPlan
	over    map[string][]slot
	found   int // backends planned that from holds
	planned int
}

func newPlanner(from slotPlan) *planner {
	p := &planner{from: from, over: make(map[string][]slot, len(from.over)+1)}
	if from.base != nil {
		maps.Copy(p.over, from.over)
	}
	return p
}

// set records a backend's slots, planned from committed (found: the
// committed plan holds it).
func (p *planner) set(backend string, committed, slots []slot, found bool) {
	p.planned++
	if found {
		p.found++
		if sameSlice(slots, committed) {
			return
		}
	}
	p.over[backend] = slots
}

// plan returns the plan; each is the slots of every backend planned, by
// name, which it calls when the backends are not the committed plan's.
func (p *planner) plan(each func(func(string, []slot))) slotPlan {
	if p.found == p.planned && p.planned == p.from.len() {
		base := p.from.base
		if base == nil {
			base = p.from.over
		}
		return slotPlan{base: base, over: p.over}
	}
	all := make(map[string][]slot, p.planned)
	each(func(backend string, slots []slot) { all[backend] = slots })
	return slotPlan{over: all}
}
