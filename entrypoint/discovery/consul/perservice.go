package consul

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

const (
	// fixedWatches are the blocking queries a per-service catalog holds
	// besides one per service: the service list and the node list.
	fixedWatches = 2
	// DefaultWatches is the default budget of blocking queries per
	// catalog: room under an agent's default http_max_conns_per_client
	// of 200 for KV watches and other clients on the same address.
	DefaultWatches = 128
	// connReadBuffer and connWriteBuffer size the buffers of each
	// connection to the agent: a request is a few hundred bytes, and a
	// read larger than the buffer bypasses it.
	connReadBuffer  = 1 << 10
	connWriteBuffer = 512
)

// holdingTransport is a copy of t fit to hold a blocking query on each of
// keep connections: as many idle connections kept, and small buffers,
// which each held connection keeps for as long as its query waits (Go's
// default is 4 KiB each way: 8 MiB at 1,000 watches).
func holdingTransport(t *http.Transport, keep int) *http.Transport {
	t = t.Clone()
	t.MaxIdleConnsPerHost = max(t.MaxIdleConnsPerHost, keep)
	if t.MaxIdleConns != 0 {
		t.MaxIdleConns = max(t.MaxIdleConns, keep)
	}
	t.ReadBufferSize, t.WriteBufferSize = connReadBuffer, connWriteBuffer
	return t
}

// partKind says what a sub-watch of a per-service catalog reads.
type partKind int

const (
	partServices partKind = iota // /v1/catalog/services
	partNodes                    // /v1/catalog/nodes
	partHealth                   // /v1/health/service/<name>
)

// sub is one blocking query of a per-service catalog.
type sub struct {
	kind   partKind
	name   string // the service, for partHealth
	cancel context.CancelFunc
	// seed, when not 0, is the index of the node dump the query's first
	// answer came from (seed.go): it waits on it, and seedDigest is
	// what it answered.
	seed       uint64
	seedDigest [32]byte
}

// event is a sub-watch's answer: an error, or an answer that did or did
// not change what the sub-watch reported last.
type event struct {
	sub       *sub
	err       error
	changed   bool
	index     uint64              // of the answer
	services  map[string][]string // nil when the list is the one passed on last (listed)
	listed    [32]byte            // the service list's digest
	nodes     []model.Node
	dcName    string
	instances []model.Instance
	entries   []healthEntry // the answer of a health query, until converted
}

// overBudget: the catalog has more services than the budget of blocking
// queries allows.
type overBudget struct{ services int }

func (e *overBudget) Error() string {
	return fmt.Sprintf("%d services to watch, over the budget", e.services)
}

// splitCatalog assembles a catalog from one blocking query per service on
// /v1/health/service/<name>, plus the service list and the node list. Each
// sub-watch converts its own answer, only when it changed; fetch puts the
// cached parts together. Only fetch's goroutine touches the parts; the
// sub-watches talk to it through events.
type splitCatalog struct {
	s      *Source
	dc     string
	budget int
	set    *watchSet

	ctx    context.Context // the sub-watches' lifetime
	cancel context.CancelFunc
	wg     sync.WaitGroup
	events chan event
	// directs bounds the reads from the servers (checkView) in flight: an
	// outage ends for every service at once.
	directs chan struct{}
	starter starter

	services, nodes *sub
	health          map[string]*sub
	order           []string // the watched services, sorted: the catalog's order
	parts           map[string][]model.Instance
	// nodeChecks is the list of node checks the parts share, by node:
	// each health answer brings its own copy of its nodes' checks.
	nodeChecks   map[string][]model.Check
	nodeList     []model.Node
	dcName       string
	haveServices bool
	haveNodes    bool
	complete     bool // every part answered once
	dirty        bool // a part changed since the last assembly
	moved        bool // only an index moved since: the last catalog, re-dated, will do
	last         *model.Catalog
	warnedACL    atomic.Bool
	converted    atomic.Uint64 // health answers converted
	decoded      atomic.Uint64 // health answers decoded (healthEntries)
	// stale holds why each sub-watch's latest answer was refused as
	// stale; a sub-watch that answers well again leaves it.
	stale map[*sub]string
	// indexes of the parts' latest answers, by sub-watch: the catalog's
	// index is the highest (model.Catalog.Index).
	indexes map[*sub]uint64
	// pending are the services of the first listing, waiting for the
	// seed's read (seed.go); seedIndex is its index, the catalog's
	// lowest since.
	pending   []string
	seedIndex uint64
	seedEpoch context.Context // the restart context at the seed: a reset since ends seedIndex

	// restarted is cancelled (and replaced) when a sub-watch saw the index
	// go backwards: Consul restarted with less data. Every other
	// sub-watch then reads afresh rather than wait on an index the new
	// Consul will not reach for a long time (the Go transport re-sends a
	// GET whose connection closed, so a query may reach the new Consul
	// without ever failing).
	restartMu     sync.Mutex
	restarted     context.Context
	restartCancel context.CancelFunc
	restartHeld   map[*heldHealth]struct{} // cut short by the next restart (cutAtRestart)
}

// maxDirect is how many services are read from the servers at once.
const maxDirect = 8

func newSplitCatalog(ctx context.Context, s *Source, dc string, budget int, set *watchSet) *splitCatalog {
	c := &splitCatalog{s: s, dc: dc, budget: budget, set: set, events: make(chan event, 64), directs: make(chan struct{}, maxDirect),
		health: map[string]*sub{}, parts: map[string][]model.Instance{}, nodeChecks: map[string][]model.Check{}, stale: map[*sub]string{},
		indexes: map[*sub]uint64{}}
	c.ctx, c.cancel = context.WithCancel(ctx)
	c.restarted, c.restartCancel = context.WithCancel(c.ctx)
	c.services = c.start(partServices, "")
	c.nodes = c.start(partNodes, "")
	return c
}

// stop ends every sub-watch and waits for them.
func (c *splitCatalog) stop() {
	c.cancel() // every send also selects on the context
	c.wg.Wait()
}

// restart tells every sub-watch to read afresh: it cuts short the
// blocking queries in flight (the held ones on the caller's goroutine),
// and the others read afresh next time.
func (c *splitCatalog) restart() {
	c.restartMu.Lock()
	c.restartCancel()
	c.restarted, c.restartCancel = context.WithCancel(c.ctx)
	held := c.restartHeld
	c.restartHeld = nil
	c.restartMu.Unlock()
	cutAll(held)
}

func (c *splitCatalog) restartCtx() context.Context {
	c.restartMu.Lock()
	defer c.restartMu.Unlock()
	return c.restarted
}

func (c *splitCatalog) start(kind partKind, name string) *sub {
	ctx, cancel := context.WithCancel(c.ctx)
	sb := &sub{kind: kind, name: name, cancel: cancel}
	c.wg.Go(func() { c.run(ctx, sb) })
	return sb
}

// current reports whether sb is still one of the catalog's sub-watches.
func (c *splitCatalog) current(sb *sub) bool {
	switch sb.kind {
	case partServices:
		return sb == c.services
	case partNodes:
		return sb == c.nodes
	}
	return c.health[sb.name] == sb
}

// fetch returns once the catalog may have changed: the first time when
// every part has answered; then after each batch of answers, the same
// *Catalog when no part changed. An error is a sub-watch's failure (it
// retries on its own); *overBudget says the catalog should be read
// another way.
func (c *splitCatalog) fetch(ctx context.Context) (*model.Catalog, error) {
	for {
		var batch []event
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case ev := <-c.events:
			batch = append(batch, ev)
		}
	drain:
		for {
			select {
			case ev := <-c.events:
				batch = append(batch, ev)
			default:
				break drain
			}
		}
		var (
			err      error
			answered bool
		)
		for _, ev := range batch {
			if !c.current(ev.sub) {
				delete(c.stale, ev.sub)
				continue
			}
			if ev.err != nil {
				err = ev.err
				if r, ok := isStale(ev.err); ok {
					c.stale[ev.sub] = r
				}
				continue
			}
			delete(c.stale, ev.sub)
			answered = true
			if !ev.changed && ev.index != c.indexes[ev.sub] {
				// The same answer at another index (a change elsewhere, a
				// fresh read, a Consul that started over): the catalog
				// is as recent as that.
				c.indexes[ev.sub] = ev.index
				// Below the seed's index it says nothing newer (the
				// waits of the seeded queries run out together).
				if floor := c.floor(); floor == 0 || ev.index > floor {
					c.moved = true
				}
			}
			if ev.changed {
				if over := c.apply(ev); over != nil {
					return nil, over
				}
			}
		}
		if c.pending != nil && c.haveNodes {
			if err := c.seed(ctx); err != nil {
				return nil, err
			}
		}
		if !c.complete {
			c.complete = c.haveServices && c.haveNodes && c.pending == nil && len(c.parts) == len(c.health)
		}
		switch {
		case c.complete && (c.dirty || c.moved && c.last == nil):
			c.last, c.dirty, c.moved = c.assemble(), false, false
			return c.last, nil
		case c.complete && c.moved && c.last != nil:
			// Every change answers the service list too, at its new
			// index and with the same names: a copy of every instance
			// (2.9 MB at 1000×10, half of a change's garbage) only to
			// carry that index. A catalog is never written once made,
			// so the new one shares the last one's lists.
			cat := *c.last
			cat.Index = c.index()
			c.last, c.moved = &cat, false
			return c.last, nil
		case err != nil:
			return nil, err
		case c.complete && answered:
			return c.last, nil // a wait ran out: the query is alive
		}
	}
}

// staleness says why the catalog is stale: a sub-watch's latest answer
// was refused as stale, while others may have answered well.
func (c *splitCatalog) staleness() string {
	if len(c.stale) == 0 {
		return ""
	}
	reasons := slices.Sorted(maps.Values(c.stale))
	if len(reasons) == 1 {
		return reasons[0]
	}
	return fmt.Sprintf("%s (and %d more of its queries)", reasons[0], len(reasons)-1)
}

// apply takes a changed answer.
func (c *splitCatalog) apply(ev event) *overBudget {
	c.indexes[ev.sub] = ev.index
	switch ev.sub.kind {
	case partServices:
		first := !c.haveServices
		c.haveServices = true
		// Only the services used are watched, and counted against the
		// budget.
		want := c.set.update(ev.services)
		if len(want)+fixedWatches > c.budget {
			return &overBudget{services: len(want)}
		}
		if c.pending != nil || (first && c.seedWanted(len(want), int(c.set.listed.Load()))) {
			c.pending, c.order = want, want // read from the node dump once the node list answered
			return nil
		}
		for name, sb := range c.health {
			if _, ok := slices.BinarySearch(want, name); !ok {
				sb.cancel()
				delete(c.health, name)
				delete(c.stale, sb)
				delete(c.indexes, sb)
				if _, had := c.parts[name]; had {
					delete(c.parts, name)
					c.dirty = true
				}
			}
		}
		for _, name := range want {
			if c.health[name] == nil {
				c.health[name] = c.start(partHealth, name)
			}
		}
		c.order = want
	case partNodes:
		c.haveNodes, c.nodeList, c.dirty = true, ev.nodes, true
		if len(c.nodeChecks) > 0 { // forget the checks of nodes gone
			names := make(map[string]bool, len(ev.nodes))
			for _, n := range ev.nodes {
				names[n.Name] = true
			}
			maps.DeleteFunc(c.nodeChecks, func(node string, _ []model.Check) bool { return !names[node] })
		}
		if ev.dcName != "" { // an empty node list (a Consul restarted empty) names none
			c.dcName = ev.dcName
		}
	case partHealth:
		if old, had := c.parts[ev.sub.name]; had && model.EqualInstances(old, ev.instances) {
			return nil
		}
		c.shareNodeChecks(ev.instances)
		c.parts[ev.sub.name], c.dirty = ev.instances, true
	}
	return nil
}

// shareNodeChecks gives insts, not yet passed on, the node checks the
// parts already hold where they are the same: otherwise every service
// read again after a change of its node would keep a copy per instance
// (10 MB at 100,000 instances). A node's changed list becomes the one
// shared from then on.
func (c *splitCatalog) shareNodeChecks(insts []model.Instance) {
	for i := range insts {
		in := &insts[i]
		if len(in.NodeChecks) == 0 {
			delete(c.nodeChecks, in.Node)
			continue
		}
		if have, ok := c.nodeChecks[in.Node]; ok && slices.Equal(have, in.NodeChecks) {
			in.NodeChecks = have
		} else {
			c.nodeChecks[in.Node] = in.NodeChecks
		}
	}
}

// index is the catalog's: the highest of its parts' latest answers, and
// not below the seed's.
func (c *splitCatalog) index() uint64 {
	i := c.floor()
	for _, x := range c.indexes {
		i = max(i, x)
	}
	return i
}

// assemble puts the cached parts together: they come sorted by service
// name, and each part is sorted, so the result is in model.SortCatalog's
// order without sorting. The catalog holds the parts and the node list
// themselves, never written once converted: a service that did not
// change is the same list in the next catalog, and costs no copy here
// nor a reading downstream (nor an encoding at the next save).
func (c *splitCatalog) assemble() *model.Catalog {
	dc := c.dc
	if dc == "" {
		dc = c.dcName
	}
	parts := make([][]model.Instance, 0, len(c.order))
	for _, name := range c.order {
		parts = append(parts, c.parts[name])
	}
	return model.PerService(dc, nilIfNone(c.nodeList), parts, c.index())
}
