package apply

import (
	"cmp"
	"maps"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// Running is what the running configuration was rendered from, for
// /status: its server slots, the source health of the instance in each,
// and what it leaves out.
type Running struct {
	Slots []model.ServerSlot
	// Health by slot index: the instance's status; "" for a free slot.
	Health  []string
	Skipped []string
	Routes  []model.Route
	// ConsulIndex is, by datacenter, the Consul index of the catalog the
	// rendering was made from (model.Catalog.Index); empty without Consul.
	ConsulIndex map[string]uint64
}

// published is what publish hands to Running: the running rendering and
// the catalog behind it, both never written once made, and the view made
// from them by the first Running that asked.
type published struct {
	rend    *model.Rendering
	catalog model.Catalog
	indexes map[string]uint64
	view    *Running
}

// Running returns the view of the running rendering (empty before the
// first one, and for templates without slots). It is made on the first
// call after a change and kept: a change costs the applier no copy of
// every slot, only /status, which asks far less often, pays for it.
func (a *Applier) Running() Running {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := &a.published
	if p.view == nil && p.rend != nil {
		p.view = runningView(p.rend, &p.catalog, p.indexes)
	}
	if p.view == nil {
		return Running{}
	}
	return *p.view
}

// publish hands the running rendering to Running; it runs on the
// applier's goroutine, which owns runRend and applied.
func (a *Applier) publish() {
	if a.runRend == nil {
		return
	}
	a.mu.Lock()
	a.published = published{rend: a.runRend, catalog: a.applied, indexes: maps.Clone(a.indexes)}
	a.mu.Unlock()
}

func runningView(rend *model.Rendering, c *model.Catalog, indexes map[string]uint64) *Running {
	// The rendering's own lists: never written once made, and read only
	// by /status.
	v := &Running{Slots: rend.Servers.Flat(), Skipped: rend.Skipped, Routes: rend.Routes, ConsulIndex: indexes}
	type where struct {
		id, address string
		port        int
	}
	health := make(map[where]string, c.Len())
	for s := range c.Services() {
		for _, in := range s {
			health[where{in.ID, in.Address, in.Port}] = in.Status
		}
	}
	v.Health = make([]string, len(v.Slots))
	for i, s := range v.Slots {
		if s.Instance != "" {
			v.Health[i] = health[where{s.Instance, s.Address, s.Port}]
		}
	}
	return v
}

// consulIndexes is, by datacenter, the index of each catalog among qs in
// st (the queries a rendering was made from); catalogs without an index
// (not Consul's) or a datacenter (empty, never answered) are left out.
func consulIndexes(st model.State, qs []model.Query) map[string]uint64 {
	var out map[string]uint64
	for _, q := range qs {
		if q.Kind != model.QueryCatalog {
			continue
		}
		r, ok := st.Result(q)
		if !ok || r.Catalog == nil || r.Catalog.Index == 0 {
			continue
		}
		dc := cmp.Or(r.Catalog.Datacenter, q.Datacenter)
		if dc == "" {
			continue
		}
		if out == nil {
			out = map[string]uint64{}
		}
		out[dc] = max(out[dc], r.Catalog.Index)
	}
	return out
}
