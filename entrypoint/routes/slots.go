package routes

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// Server slots let membership change without a reload: every backend has
// a fixed number of servers, s1…sN; an instance keeps its slot for as long
// as it exists, a new one takes a free slot, and the applier changes a
// slot's address, weight and state over HAProxy's runtime API. Only a
// backend that outgrows its slots needs a reload, with twice as many.

// unusedAddr is where a free slot points; it is also in maintenance.
const unusedAddr = "127.0.0.1:1"

// SlotTable remembers which instance holds which slot of which backend. It
// outlives the Renderer (a SIGHUP builds a new one) so that assignments
// stay stable for the running HAProxy.
type SlotTable struct {
	mu       sync.Mutex
	backends map[string]*slotBackend
}

// NewSlotTable returns an empty table.
func NewSlotTable() *SlotTable { return &SlotTable{backends: map[string]*slotBackend{}} }

type slotBackend struct {
	slots []slot
}

type slot struct {
	key        string // instance ID; "" when free
	srv        Server
	drainUntil time.Time // non-zero while a removed instance drains
}

// assign places servers into backend's slots at time now and returns the
// slots in order, with the earliest time a drain ends (zero if none).
// Removed instances drain for drain, then their slot is freed.
func (t *SlotTable) assign(backend string, servers []Server, minSlots int, drain time.Duration, now time.Time) ([]slot, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.backends[backend]
	if b == nil {
		b = &slotBackend{slots: make([]slot, max(minSlots, nextPow2(len(servers))))}
		t.backends[backend] = b
	}
	want := map[string]Server{}
	for _, s := range servers {
		want[s.Instance] = s
	}
	var recheck time.Time
	held := map[string]bool{}
	for i := range b.slots {
		sl := &b.slots[i]
		if sl.key == "" {
			continue
		}
		if s, ok := want[sl.key]; ok {
			sl.srv, sl.drainUntil = s, time.Time{}
			held[sl.key] = true
			continue
		}
		if sl.drainUntil.IsZero() {
			sl.drainUntil = now.Add(drain)
		}
		if !now.Before(sl.drainUntil) {
			*sl = slot{}
			continue
		}
		if recheck.IsZero() || sl.drainUntil.Before(recheck) {
			recheck = sl.drainUntil
		}
	}
	for _, s := range servers {
		if held[s.Instance] {
			continue
		}
		i := slices.IndexFunc(b.slots, func(sl slot) bool { return sl.key == "" })
		if i < 0 {
			i = len(b.slots)
			b.slots = append(b.slots, make([]slot, max(len(b.slots), 1))...)
		}
		b.slots[i] = slot{key: s.Instance, srv: s}
		held[s.Instance] = true
	}
	return slices.Clone(b.slots), recheck
}

func nextPow2(n int) int {
	p := 1
	for p < n {
		p *= 2
	}
	return p
}

// slotServers turns slots into the template's servers and the rendering's
// description of them.
func slotServers(backend string, slots []slot) ([]viewServer, []model.ServerSlot) {
	vs := make([]viewServer, len(slots))
	ms := make([]model.ServerSlot, len(slots))
	for i, sl := range slots {
		name := fmt.Sprintf("s%d", i+1)
		m := model.ServerSlot{Backend: backend, Server: name, Weight: 1, State: model.SlotMaint}
		v := viewServer{Name: name, Addr: unusedAddr, Weight: 1, Disabled: true}
		if sl.key != "" {
			m.Instance = sl.key
			m.Address, m.Port, m.Weight = sl.srv.Address.Host, sl.srv.Port, sl.srv.Weight
			v.Addr, v.Weight = sl.srv.Addr(), sl.srv.Weight
			if sl.drainUntil.IsZero() {
				m.State, v.Disabled = model.SlotReady, false
			} else {
				// Draining at runtime; a reload starts it in maintenance,
				// while the old worker finishes what it has.
				m.State = model.SlotDrain
			}
		}
		vs[i], ms[i] = v, m
	}
	return vs, ms
}
