package routes

import (
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// Server slots let membership change without a reload: every backend has
// a fixed number of servers, s1…sN; an instance keeps its slot for as long
// as it exists at the same address, a new one (or one that moved) takes a
// free slot, and the applier changes a
// slot's address, weight and state over HAProxy's runtime API. Only a
// backend that outgrows its slots needs a reload, with twice as many.
//
// Planning is pure: a rendering reads the committed table and proposes the
// next one (a slotPlan) without changing it. The applier commits the
// proposal (model.Rendering.Commit) only once HAProxy runs the rendering,
// so a refused, failed or repeated rendering leaves no trace, and the next
// one starts again from what runs.

// unusedAddr is where a free slot points; it is also in maintenance.
const unusedAddr = "127.0.0.1:1"

// SlotTable is the committed assignment: which instance holds which slot
// of which backend in the configuration HAProxy runs, with the drain
// clocks of removed instances. It outlives the Renderer (a SIGHUP builds a
// new one) so that assignments stay stable for the running HAProxy. It
// holds only the backends of the last committed rendering: a backend that
// is no longer rendered is forgotten with its drains.
type SlotTable struct {
	mu sync.Mutex
	// plan is replaced whole at commit, never changed in place, and its
	// maps and slices are shared with plans: readers may keep it unlocked.
	plan slotPlan
}

// NewSlotTable returns an empty table.
func NewSlotTable() *SlotTable { return &SlotTable{plan: slotPlan{over: map[string][]slot{}}} }

// Len is the number of backends the table holds.
func (t *SlotTable) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.plan.len()
}

func (t *SlotTable) committed() slotPlan {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.plan
}

// commit makes p the table: HAProxy runs the rendering p was planned for.
func (t *SlotTable) commit(p slotPlan) {
	if p.base != nil && len(p.over) > maxOver {
		p = slotPlan{over: p.all()}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.plan = p
}

// slot is one server slot of a backend. It points at its server, one of
// the service cache's (never written), rather than hold a copy or a key:
// 16 slots of every backend are 16 bytes each. A draining slot points at
// the server that left, so its instance and address stay what the slot
// describes until the drain ends.
type slot struct {
	srv        *Server // the holder; nil when free
	drainUntil int64   // Unix nanoseconds; non-zero while a removed instance drains
}

// draining reports whether a removed instance drains in the slot.
func (sl slot) draining() bool { return sl.drainUntil != 0 }

// planSlots places servers into a backend's committed slots (nil for a
// backend the table does not hold) at time now, and returns its slots in
// order with the earliest time a drain ends (zero if none). Removed
// instances drain for drain, then their slot is freed. committed is never
// written: it is copied at the first slot that changes, and returned as
// is when none does.
func planSlots(committed []slot, servers []Server, minSlots int, drain time.Duration, now time.Time) ([]slot, time.Time) {
	slots, owned := committed, false
	if slots == nil {
		slots, owned = make([]slot, max(minSlots, nextPow2(len(servers)))), true
	}
	set := func(i int, s slot) {
		if slots[i] == s {
			return
		}
		if !owned {
			slots, owned = slices.Clone(slots), true
		}
		slots[i] = s
	}
	find := indexServers(servers)
	var recheck time.Time
	held := make([]bool, len(servers)) // by index in servers
	for i := range slots {
		sl := slots[i]
		if sl.srv == nil {
			continue
		}
		if j := find(sl.srv); j >= 0 {
			set(i, slot{srv: &servers[j]})
			held[j] = true
			continue
		}
		if !sl.draining() {
			sl.drainUntil = now.Add(drain).UnixNano()
		}
		until := time.Unix(0, sl.drainUntil)
		if !now.Before(until) {
			set(i, slot{})
			continue
		}
		set(i, sl)
		if recheck.IsZero() || until.Before(recheck) {
			recheck = until
		}
	}
	for j := range servers {
		if held[j] {
			continue
		}
		s := &servers[j]
		i := slices.IndexFunc(slots, func(sl slot) bool { return sl.srv == nil })
		if i < 0 {
			i = len(slots)
			grown := make([]slot, len(slots)+max(len(slots), 1))
			copy(grown, slots)
			slots, owned = grown, true
		}
		set(i, slot{srv: s})
		held[j] = true
	}
	return slots, recheck
}

// planCache remembers, per backend, the servers it last planned and the
// slots it proposed. Planning those slots (once committed) with the same
// servers again proposes them again unchanged (every slot holds one of the servers, each server a slot, and
// a draining slot drains on) until the first drain in them ends, so a
// backend whose servers did not change costs a lookup, not a plan: one
// change does not re-plan a thousand backends, nor the hundreds that
// drain an instance that moved (50 changes a second drain 500 backends
// at once with the default drain of 10 s; planning them again at every
// rendering was half of its time at 1,000 × 10).
// Identity is by slice: the committed table's slices are never written
// (SlotTable), nor are the servers the service cache hands out.
type planCache struct {
	mu         sync.Mutex
	last, next map[string]plannedAs // next: the one before last's, emptied
	planned    int                  // backends planned (not found in the cache)
}

type plannedAs struct {
	servers []Server
	slots   []slot
	until   time.Time // when the first drain in slots ends; zero if none
}

// plan is planSlots(committed, servers, …), from the cache when it can be.
func (c *planCache) plan(backend string, committed []slot, servers []Server, minSlots int, drain time.Duration, now time.Time) ([]slot, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.next == nil {
		c.next = make(map[string]plannedAs, len(c.last))
	}
	if p, ok := c.last[backend]; ok && sameSlice(p.servers, servers) && sameSlice(p.slots, committed) &&
		(p.until.IsZero() || now.Before(p.until)) {
		c.next[backend] = p
		return committed, p.until
	}
	slots, recheck := planSlots(committed, servers, minSlots, drain, now)
	c.planned++
	// Once committed, these slots planned again with these servers are
	// these slots: kept from this rendering on.
	c.next[backend] = plannedAs{servers: servers, slots: slots, until: recheck}
	return slots, recheck
}

// done ends a rendering: what it did not plan is forgotten. The map of
// the rendering before is emptied for the next to fill.
func (c *planCache) done() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.last)
	c.last, c.next = c.next, c.last
}

// sameSlice reports whether a and b are the same non-empty slice.
func sameSlice[E any](a, b []E) bool {
	return len(a) > 0 && len(a) == len(b) && &a[0] == &b[0]
}

// sameHolder: a and b are the same instance at the same address, what
// holds a slot. An instance that moves (re-registered at another address
// or port) takes another slot and its old one drains, rather than the
// slot's address changing under it: HAProxy keeps sending a kept-alive
// client's requests over the server connection its session holds for as
// long as the same server is picked, which would be the old address,
// maybe an old process still answering, until that connection closed.
func sameHolder(a, b *Server) bool {
	return a.Instance == b.Instance && a.Port == b.Port && a.Address == b.Address
}

// holder is what sameHolder compares, as a map key.
type holder struct {
	instance string
	address  Address
	port     int
}

// indexServers returns a lookup of the index in servers of the one that
// holds the slot srv holds (-1: none): a scan for the few servers of most
// backends, a map for many. Neither makes a string: planning every
// backend at a start made a key for each of its servers twice. An
// instance ID is unique only within its source, so two servers of a
// backend may share one at different addresses.
func indexServers(servers []Server) func(*Server) int {
	if len(servers) <= 32 {
		return func(srv *Server) int {
			for j := range servers {
				if sameHolder(&servers[j], srv) {
					return j
				}
			}
			return -1
		}
	}
	m := make(map[holder]int, len(servers))
	for j, s := range servers {
		m[holder{s.Instance, s.Address, s.Port}] = j
	}
	return func(srv *Server) int {
		if j, ok := m[holder{srv.Instance, srv.Address, srv.Port}]; ok {
			return j
		}
		return -1
	}
}

func nextPow2(n int) int {
	p := 1
	for p < n {
		p *= 2
	}
	return p
}

// slotNames are the names of the first slots, made once: a rendering
// names every slot of every backend.
var slotNames = func() []string {
	n := make([]string, 256)
	for i := range n {
		n[i] = "s" + strconv.Itoa(i+1)
	}
	return n
}()

// slotName names the slot at index i: s1, s2…
func slotName(i int) string {
	if i < len(slotNames) {
		return slotNames[i]
	}
	return "s" + strconv.Itoa(i+1)
}

// slotServers turns slots into the template's servers and the rendering's
// description of them.
func slotServers(backend string, slots []slot) ([]viewServer, []model.ServerSlot) {
	ms := make([]model.ServerSlot, len(slots))
	for i, sl := range slots {
		m := model.ServerSlot{Backend: backend, Server: slotName(i), Weight: 1, State: model.SlotMaint}
		if sl.srv != nil {
			m.Instance = sl.srv.Instance
			m.Address, m.Port, m.Weight = sl.srv.Address.Host, sl.srv.Port, sl.srv.Weight
			m.State = model.SlotReady
			if sl.draining() {
				// Draining at runtime; a reload starts it in maintenance,
				// while the old worker finishes what it has.
				m.State = model.SlotDrain
			}
		}
		ms[i] = m
	}
	return viewServers(ms), ms
}

// slotCache keeps slotServers' answer per backend for the slots it was
// made from. planSlots returns a backend's committed slots themselves
// when none changed, so the same slice means the same answer: one change
// does not rebuild the servers of every backend. Each rendering keeps only
// the backends it renders.
type slotCache struct {
	mu   sync.Mutex
	last map[string]slotServersOf
	next map[string]slotServersOf // the one before last's, emptied
}

type slotServersOf struct {
	slots []slot
	vs    []viewServer
	ms    []model.ServerSlot
}

// of is slotServers(backend, slots), from the cache when slots is the
// slice it was made from. Call done after the rendering's last of.
func (c *slotCache) of(backend string, slots []slot) ([]viewServer, []model.ServerSlot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.next == nil {
		c.next = make(map[string]slotServersOf, len(c.last))
	}
	e, ok := c.last[backend]
	if !ok || len(e.slots) != len(slots) || len(slots) == 0 || &e.slots[0] != &slots[0] {
		e.slots = slots
		e.vs, e.ms = slotServers(backend, slots)
	}
	c.next[backend] = e
	return e.vs, e.ms
}

// done ends a rendering: what it did not ask for is forgotten. The map
// of the rendering before is emptied for the next to fill.
func (c *slotCache) done() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.last)
	c.last, c.next = c.next, c.last
}
