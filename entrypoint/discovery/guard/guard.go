// Package guard holds back a mass disappearance: a source that reports in
// one snapshot that most of its instances are gone is more often a source
// that lost its data (a Consul restarted empty, a services directory
// half-copied) than a real scale-down. The removal is held for a
// confirmation period while the instances keep their last known state;
// everything else in the snapshot (additions, health, addresses) applies
// at once. If the source still says they are gone when the period ends,
// they go: a deliberate scale to zero still works, only later.
//
// A source that started over may also report, for a moment, instances it
// removed before: a Consul server restored from a Raft snapshot serves
// the snapshot's catalog until a leader tells it what came after. Within
// the hold period after such a reset, an instance the guard saw removed
// is withheld until the period ends: if it was old state it goes again
// before that and is never routed to; if the source still reports it
// then, it is passed on.
package guard

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// Options configure a guard.
type Options struct {
	// Percent: a snapshot that removes more than this share of a
	// catalog's instances, and more than one, has its removal held; 100
	// holds only when every instance goes. 0 disables the guard.
	Percent int
	// Hold is how long a removal is held before it is applied.
	Hold time.Duration
	// Routed reports whether an instance with the status gets traffic
	// (SEAMLESS_CONSUL_HEALTH); nil: passing only. A held instance is
	// drained only while its service has a routed one, and never when
	// critical instances are routed too (it would change nothing).
	Routed func(status string) bool
	Log    *slog.Logger
}

// Guard is a model.Source around another one.
type Guard struct {
	src  model.Source
	opts Options
	log  *slog.Logger

	mu    sync.Mutex // guards what follows, read by Status
	held  map[key]*held
	holds uint64
	// removed: instances passed on, then removed. Listed again just
	// after a reset, such an instance is more likely old state than new.
	removed removals
	// withheld: instances the source reports again after a reset that
	// were removed before, kept out until withheldUntil.
	withheld      map[key]bool
	withheldUntil time.Time
	withholds     uint64

	// Owned by Run.
	sent map[model.Query]*model.Catalog // the catalogs last passed on
}

// key names an instance: IDs are unique within a service of a source.
type key struct {
	q        model.Query
	name, id string
}

// held is an instance the source no longer reports, kept until until.
type held struct {
	in    model.Instance
	node  *model.Node // its node, when the catalog lists it
	until time.Time
	// Its service still had instances that serve when it went, and the
	// source had not started over: it is passed on critical while they
	// serve.
	drain bool
}

var (
	_ model.Source   = (*Guard)(nil)
	_ model.Wanter   = (*Guard)(nil)
	_ model.Reporter = (*Guard)(nil)
)

// Wrap returns src behind a guard; with Percent 0, src itself.
func Wrap(src model.Source, o Options) model.Source {
	if o.Percent <= 0 {
		return src
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Routed == nil {
		o.Routed = func(status string) bool { return status == model.StatusPassing }
	}
	return &Guard{src: src, opts: o, log: o.Log.With("component", "discovery", "source", src.Name()),
		held: map[key]*held{}, sent: map[model.Query]*model.Catalog{}}
}

// Unwrap returns the source behind a guard, or s itself.
func Unwrap(s model.Source) model.Source {
	if g, ok := s.(*Guard); ok {
		return g.src
	}
	return s
}

// Name is the wrapped source's.
func (g *Guard) Name() string { return g.src.Name() }

// Want passes the queries on to a source that takes them.
func (g *Guard) Want(qs []model.Query) {
	if w, ok := g.src.(model.Wanter); ok {
		w.Want(qs)
	}
}

// Status is the wrapped source's, with what the guard holds. A source
// that cannot say how it is doing counts as up.
func (g *Guard) Status() model.SourceStatus {
	st := g.inner()
	g.mu.Lock()
	defer g.mu.Unlock()
	st.Held, st.HeldUntil, st.HoldsTotal = len(g.held), g.lastUntilLocked(), g.holds
	st.Withheld, st.WithholdsTotal = len(g.withheld), g.withholds
	if len(g.withheld) > 0 {
		st.WithheldUntil = g.withheldUntil
	}
	return st
}

func (g *Guard) inner() model.SourceStatus {
	if r, ok := g.src.(model.Reporter); ok {
		return r.Status()
	}
	return model.SourceStatus{Name: g.src.Name(), Up: true}
}

func (g *Guard) lastUntilLocked() time.Time {
	var t time.Time
	for _, h := range g.held {
		if h.until.After(t) {
			t = h.until
		}
	}
	return t
}

// firstUntil is when the guard next has something to release.
func (g *Guard) firstUntil() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	var t time.Time
	if len(g.withheld) > 0 {
		t = g.withheldUntil
	}
	for _, h := range g.held {
		if t.IsZero() || h.until.Before(t) {
			t = h.until
		}
	}
	return t
}

// Run runs the wrapped source and passes its snapshots on, with the
// instances held back added, following model.Source's contract: only the
// newest is passed on when out is slow.
func (g *Guard) Run(ctx context.Context, out chan<- model.Snapshot) {
	in := make(chan model.Snapshot)
	var wg sync.WaitGroup
	wg.Go(func() { g.src.Run(ctx, in) })
	defer wg.Wait()

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var (
		latest  model.Snapshot // the source's newest
		have    bool
		pending model.Snapshot
		outc    chan<- model.Snapshot // out while pending waits, else nil
		due     time.Time
	)
	for {
		select {
		case <-ctx.Done():
			return
		case s := <-in:
			latest, have = s, true
			g.hold(s, time.Now())
			pending, outc = g.compose(s), out
		case <-timer.C:
			due = time.Time{}
			if g.expire(time.Now()) && have {
				pending, outc = g.compose(latest), out
			}
		case outc <- pending:
			pending, outc = model.Snapshot{}, nil
		}
		if next := g.firstUntil(); !next.Equal(due) {
			due = next
			timer.Stop()
			if !due.IsZero() {
				timer.Reset(max(time.Until(due), 0))
			}
		}
	}
}

// hold compares s with what was passed on last: held instances that s
// reports again are released, and a removal of too many at once is held.
// So is any removal while the source has just started over (s.Reset
// within the hold period): its data then comes back in pieces, and a
// piece that lacks a whole service removes too few instances at once to
// look like a mass removal. Meanwhile what it reports of the instances
// removed before is withheld.
func (g *Guard) hold(s model.Snapshot, now time.Time) {
	restarted := !s.Reset.IsZero() && now.Sub(s.Reset) < g.opts.Hold
	g.mu.Lock()
	defer g.mu.Unlock()
	indexes := map[model.Query]byService{}
	for k := range g.held {
		r, ok := s.Results[k.q]
		if ok && r.Catalog != nil {
			if indexes[k.q] == nil {
				indexes[k.q] = indexServices(r.Catalog)
			}
			ok = !indexes[k.q].has(k)
		}
		if !ok {
			delete(g.held, k) // back, or the query is no longer asked
		}
	}
	var withheld map[key]bool
	for q, r := range s.Results {
		prev := g.sent[q]
		if r.Catalog == nil || prev == nil || r.Catalog == prev {
			continue
		}
		if restarted && g.removed.len() > 0 {
			// What was not passed on: the instances the source added, and
			// those withheld before.
			for _, in := range gone(r.Catalog, prev, nil) {
				if k := (key{q, in.Name, in.ID}); g.removed.has(k, now) {
					if withheld == nil {
						withheld = map[key]bool{}
					}
					withheld[k] = true
				}
			}
		}
		var skip func(model.Instance) bool // already held
		if len(g.held) > 0 {
			skip = func(in model.Instance) bool { return g.held[key{q, in.Name, in.ID}] != nil }
		}
		gone := gone(prev, r.Catalog, skip)
		mass := g.tooMany(len(gone), prev.Len())
		if !mass && (!restarted || len(gone) == 0) {
			for _, in := range gone {
				g.removed.add(key{q, in.Name, in.ID}, now)
			}
			continue
		}
		until := now.Add(g.opts.Hold)
		nodes := map[string]*model.Node{}
		for i := range prev.Nodes {
			nodes[prev.Nodes[i].Name] = &prev.Nodes[i]
		}
		services := map[string]bool{}
		serves := g.serves(r.Catalog)
		drained := 0
		for _, in := range gone {
			// A service the source still lists with instances that serve
			// is being scaled down; one it lost whole is held as it was.
			drain := !restarted && !g.opts.Routed(model.StatusCritical) && serves(in.Name)
			g.held[key{q, in.Name, in.ID}] = &held{in: in, node: nodes[in.Node], until: until, drain: drain}
			services[in.Name] = true
			if drain {
				drained++
			}
		}
		g.holds++
		msg := "the source dropped too many instances at once; keeping them until it confirms (drained where their service has others that serve)"
		if !mass {
			msg = "the source started over with less data and dropped instances; keeping them until it confirms"
		}
		g.log.Warn(msg,
			"query", q.String(), "held", len(gone), "of", prev.Len(), "drained", drained,
			"services", strings.Join(slices.Sorted(maps.Keys(services)), ","),
			"until", until.Format(time.RFC3339), "threshold_percent", g.opts.Percent)
	}
	g.withholdLocked(withheld, s.Reset.Add(g.opts.Hold))
}

// withholdLocked replaces what is withheld; it logs what is new.
func (g *Guard) withholdLocked(withheld map[key]bool, until time.Time) {
	services := map[string]bool{}
	for k := range withheld {
		if !g.withheld[k] {
			services[k.name] = true
		}
	}
	g.withheld = withheld
	if len(withheld) > 0 {
		g.withheldUntil = until
	}
	if len(services) == 0 {
		return
	}
	g.withholds++
	g.log.Warn("the source started over and reports again instances it removed before (a Consul server restored from an older snapshot); withholding them until it confirms",
		"withheld", len(withheld), "services", strings.Join(slices.Sorted(maps.Keys(services)), ","),
		"until", until.Format(time.RFC3339))
}

// tooMany: removing gone of total instances is a mass removal.
func (g *Guard) tooMany(gone, total int) bool {
	if gone < 2 {
		return false
	}
	if g.opts.Percent >= 100 {
		return gone == total
	}
	return gone*100 > g.opts.Percent*total
}

// expire ends the holds that are due: the removal is applied when the
// source is up to confirm it, and held on otherwise. It reports whether
// anything was released.
func (g *Guard) expire(now time.Time) bool {
	up := g.inner().Up
	g.mu.Lock()
	defer g.mu.Unlock()
	var released, extended int
	for k, h := range g.held {
		switch {
		case h.until.After(now):
		case up:
			delete(g.held, k)
			g.removed.add(k, now)
			released++
		default:
			h.until = now.Add(g.opts.Hold)
			extended++
		}
	}
	if extended > 0 {
		g.log.Warn("the source is down and cannot confirm the removal; holding on",
			"held", extended, "until", now.Add(g.opts.Hold).Format(time.RFC3339))
	}
	if released > 0 {
		g.log.Info("the source still reports the instances gone; removal applied", "removed", released, "still_held", len(g.held))
	}
	if len(g.withheld) > 0 && !g.withheldUntil.After(now) {
		if !up {
			g.withheldUntil = now.Add(g.opts.Hold)
			g.log.Warn("the source is down and cannot confirm the instances it reported again; withholding them on",
				"withheld", len(g.withheld), "until", g.withheldUntil.Format(time.RFC3339))
			return released > 0
		}
		// Their removals stay remembered: passed on, they are no longer
		// additions, and a later removal records itself again.
		g.log.Info("the source still reports the instances it had removed; passed on", "instances", len(g.withheld))
		g.withheld = nil
		return true
	}
	return released > 0
}

// compose is s with the held instances (and their nodes) added; it
// records what is passed on.
func (g *Guard) compose(s model.Snapshot) model.Snapshot {
	g.mu.Lock()
	defer g.mu.Unlock()
	byQuery := map[model.Query][]*held{}
	for k, h := range g.held {
		byQuery[k.q] = append(byQuery[k.q], h)
	}
	for k := range g.withheld {
		if _, ok := byQuery[k.q]; !ok {
			byQuery[k.q] = nil
		}
	}
	out := model.Snapshot{Source: s.Source, Results: maps.Clone(s.Results), Reset: s.Reset}
	for q, hs := range byQuery {
		r := out.Results[q]
		c := &model.Catalog{Datacenter: r.Catalog.Datacenter, Index: r.Catalog.Index, Nodes: slices.Clone(r.Catalog.Nodes),
			Instances: slices.Concat(slices.Collect(r.Catalog.Services())...)} // one copy, of either kind
		if len(g.withheld) > 0 {
			c.Instances = slices.DeleteFunc(c.Instances, func(in model.Instance) bool { return g.withheld[key{q, in.Name, in.ID}] })
		}
		serves := g.serves(r.Catalog)
		for _, h := range hs {
			in := h.in
			if h.drain && serves(in.Name) {
				in = drained(in)
			}
			c.Instances = append(c.Instances, in)
			if h.node != nil && !slices.ContainsFunc(c.Nodes, func(n model.Node) bool { return n.Name == h.node.Name }) {
				c.Nodes = append(c.Nodes, *h.node)
			}
		}
		model.SortCatalog(c)
		r.Catalog = c
		out.Results[q] = r
	}
	clear(g.sent)
	for q, r := range out.Results {
		if r.Catalog != nil {
			g.sent[q] = r.Catalog
		}
	}
	return out
}

// is reports whether in is the instance k names.
func (k key) is(in model.Instance) bool { return in.Name == k.name && in.ID == k.id }

// byService is a catalog's runs by service name, made once per catalog
// that has held instances: a mass removal at 5,000 services holds tens of
// thousands, each asking about its own service, and walking the catalog
// for each took seconds.
type byService map[string][][]model.Instance

func indexServices(c *model.Catalog) byService {
	m := byService{}
	for s := range c.Services() {
		m[s[0].Name] = append(m[s[0].Name], s)
	}
	return m
}

// has reports whether the catalog has the instance k names.
func (m byService) has(k key) bool {
	return slices.ContainsFunc(m[k.name], func(s []model.Instance) bool { return slices.ContainsFunc(s, k.is) })
}

// serves returns whether c has an instance of a service that gets
// traffic; it indexes c at its first call and remembers each answer.
func (g *Guard) serves(c *model.Catalog) func(service string) bool {
	var m byService
	known := map[string]bool{}
	return func(service string) bool {
		if v, ok := known[service]; ok {
			return v
		}
		if m == nil {
			m = indexServices(c)
		}
		v := slices.ContainsFunc(m[service], func(s []model.Instance) bool {
			return slices.ContainsFunc(s, func(in model.Instance) bool { return g.opts.Routed(in.Status) })
		})
		known[service] = v
		return v
	}
}

// drainedCheck explains, to a template that prints checks, why a held
// instance is critical.
const drainedCheck = "seamless:removal-held"

// drained is a held instance whose service has others to serve: the
// source most likely removed it on purpose (a scale-down), and a backend
// that stops soon after its deregistration must not get new requests
// for the whole hold. Critical, every template (and the built-in one's
// health filter) stops sending it new requests and lets the ones it
// serves finish, while the guard keeps it ready to come back: a source
// that lost its data loses whole services, which are held as they were.
func drained(in model.Instance) model.Instance {
	in.Checks = append(slices.Clip(in.Checks), model.Check{Node: in.Node, CheckID: drainedCheck, Name: "seamless removal guard",
		Status: model.StatusCritical, ServiceID: in.ID, ServiceName: in.Name,
		Output: "the source no longer lists this instance; the removal guard holds it, drained, while other instances serve"})
	in.Status = model.StatusCritical
	return in
}
