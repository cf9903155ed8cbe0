package routes

import (
	"slices"
	"sync"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// serviceCache keeps each service's buildService answer with the instances
// it was built from, so that a rendering rebuilds only the services whose
// instances changed, and the last assemble's answer, so that a change that
// moves no route and no port (an instance's status, address or weight:
// most changes) assembles nothing and allocates nothing per service. Each
// build keeps only the services it saw: a vanished one is forgotten at
// the next.
type serviceCache struct {
	mu sync.Mutex
	// byName is the last build's; spare, the one before's, emptied: the
	// next build fills it rather than make a map of every service.
	byName, spare map[string]*builtService
	cands         []candidate // the last build's, reused
	asm           *assembly
}

type builtService struct {
	insts []model.Instance // the catalog's own, never written
	cand  candidate
	ok    bool
	skips []Skip
}

// assembly is what assemble made of the candidates of one build.
type assembly struct {
	rt    Routes
	skips []Skip // assemble's own: conflicts, reserved ports
	at    []int  // the index in rt.Services of each candidate; -1: none
}

// build is Build through the cache. The Routes it returns share their
// lists with the last build's when the routes did not change (rt.shape
// says so): read them only, and only until the next build, which updates
// the servers of rt.Services in place.
func (sc *serviceCache) build(c model.Catalog, p Policy) (Routes, []Skip) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	w, ok := sc.walk(&c, p)
	if !ok { // not sorted: a merged catalog is, a test's may not be
		w, _ = sc.walk(&model.Catalog{Instances: sortedInstances(c.All())}, p)
	}
	clear(sc.byName)
	sc.byName, sc.spare = w.next, sc.byName
	sc.cands = w.cands

	if !w.same {
		var own skips
		rt := assemble(w.cands, p.Reserved, &own)
		a := &assembly{rt: rt, skips: own.list, at: make([]int, len(w.cands))}
		k := 0
		for i, c := range w.cands { // rt.Services come in the candidates' order
			a.at[i] = -1
			if k < len(rt.Services) && rt.Services[k].Name == c.name {
				a.at[i], k = k, k+1
			}
		}
		a.rt.shape = a
		sc.asm = a
	} else {
		for _, i := range w.rebuilt {
			if k := sc.asm.at[i]; k >= 0 {
				sc.asm.rt.Services[k].Servers = w.cands[i].servers
			}
		}
	}
	for _, k := range sc.asm.skips {
		w.sk.add(k.Kind, k.Service, k.Instance, k.Reason)
	}
	return sc.asm.rt, w.sk.sorted()
}

// walked is one walk of a catalog.
type walked struct {
	next    map[string]*builtService
	cands   []candidate
	rebuilt []int // indexes in cands of the candidates built anew
	sk      skips
	// same: the candidates are the last assembly's but for their servers.
	same bool
}

// walk builds the services of c, from the cache where their instances
// did not change. It reports false when c is not in instanceOrder: a
// service that did not change was sorted when it was built, so only the
// others and the boundaries between services are checked, not every
// instance.
func (sc *serviceCache) walk(c *model.Catalog, p Policy) (walked, bool) {
	w := walked{next: sc.spare, cands: sc.cands[:0], same: sc.asm != nil}
	if w.next == nil {
		w.next = make(map[string]*builtService, len(sc.byName))
	}
	last, first := "", true
	for group := range c.Services() {
		name := group[0].Name
		if !first && name <= last {
			clear(w.next)
			return w, false
		}
		last, first = name, false
		b, hit := sc.byName[name]
		if !hit || !model.EqualInstances(b.insts, group) {
			if !slices.IsSortedFunc(group, instanceOrder) {
				clear(w.next)
				return w, false
			}
			var own skips
			cand, ok := buildService(group, p, &own)
			w.same = w.same && hit && b.ok == ok && (!ok || sameShape(b.cand, cand))
			b = &builtService{cand: cand, ok: ok, skips: own.list}
			if ok {
				w.rebuilt = append(w.rebuilt, len(w.cands))
			}
		}
		// The newest catalog's instances: the cache pins no older one.
		b.insts = group
		w.next[name] = b
		for _, k := range b.skips {
			w.sk.add(k.Kind, k.Service, k.Instance, k.Reason)
		}
		if b.ok {
			w.cands = append(w.cands, b.cand)
		}
	}
	w.same = w.same && len(w.next) == len(sc.byName)
	return w, true
}

// sameShape: a and b claim the same routes and ports in the same order of
// registration, so that they assemble alike; their servers may differ.
func sameShape(a, b candidate) bool {
	return a.name == b.name && a.redirect == b.redirect && a.rank == b.rank && a.source == b.source &&
		a.registered == b.registered && slices.Equal(a.rules, b.rules) && slices.Equal(a.ports, b.ports)
}
