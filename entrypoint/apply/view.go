package apply

import (
	"cmp"
	"maps"
	"slices"

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

// Running returns the view of the running rendering (empty before the
// first one, and for templates without slots).
func (a *Applier) Running() Running {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.view
}

// publish copies what /status shows of the running rendering; it runs on
// the applier's goroutine, which owns runRend and applied.
func (a *Applier) publish() {
	if a.runRend == nil {
		return
	}
	v := Running{Slots: slices.Clone(a.runRend.Servers), Skipped: slices.Clone(a.runRend.Skipped),
		Routes: slices.Clone(a.runRend.Routes), ConsulIndex: maps.Clone(a.indexes)}
	type where struct {
		id, address string
		port        int
	}
	health := make(map[where]string, len(a.applied.Instances))
	for _, in := range a.applied.Instances {
		health[where{in.ID, in.Address, in.Port}] = in.Status
	}
	v.Health = make([]string, len(v.Slots))
	for i, s := range v.Slots {
		if s.Instance != "" {
			v.Health[i] = health[where{s.Instance, s.Address, s.Port}]
		}
	}
	a.mu.Lock()
	a.view = v
	a.mu.Unlock()
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
