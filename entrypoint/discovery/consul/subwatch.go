package consul

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"reflect"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/backoff"
)

// run reads sb's query until its context ends, sending an event for each
// answer and each failure; a failure is retried with backoff.
func (c *splitCatalog) run(ctx context.Context, sb *sub) { c.runSetUp(ctx, sb, nil) }

// runSetUp is run, calling setUp (when not nil) once its first request
// is written, has failed, or is left to read (which waits on the
// goroutine): before the loop can wait on anything.
func (c *splitCatalog) runSetUp(ctx context.Context, sb *sub, setUp func()) {
	if ctx.Err() != nil && setUp != nil { // stopped before its turn
		setUp()
		return
	}
	w := &subWatch{c: c, ctx: ctx, sb: sb, bo: c.s.newBackoff(), pace: pacer{burst: 1, interval: minInterval}, setUp: setUp}
	if sb.kind == partHealth {
		w.pace.burst = queryBurst
	}
	if sb.seed > 0 { // wait for a change after the seed's read
		w.cur.index, w.prev, w.have = sb.seed, sb.seedDigest, true
	}
	w.loop(nil)
}

// subWatch is run's loop and what it keeps between answers. A held
// health query waits for its answer with no goroutine (park.go), and a
// failed query waits out its backoff with none; the loop goes on, on a
// new one, once the answer begins or the wait is over: the loop's state
// cannot live in its frame.
type subWatch struct {
	c   *splitCatalog
	ctx context.Context
	sb  *sub

	cur   cursor
	prev  any // what was passed on last (a health answer's digest)
	have  bool
	trail viewTrail // a health query's: is its view followed (viewcheck.go)
	bo    *backoff.Backoff
	pace  pacer
	epoch context.Context // the restart context of the last request
	setUp func()          // see runSetUp; nil once called

	// Of the request in flight.
	recovery, reconnection context.Context
	stop, stopR            func() bool
	cancel                 context.CancelFunc
}

// loop runs the sub-watch from h, a held health query whose answer has
// begun, or from its next request when h is nil.
func (w *subWatch) loop(h *heldHealth) {
	c, ctx, sb := w.c, w.ctx, w.sb
	for {
		var (
			ev    event
			index uint64
			err   error
		)
		if h == nil {
			w.prepare()
			wait := time.Duration(0) // the configured wait
			if w.trail.catchUp != 0 {
				wait = behindPoll // a view not followed: ask its servers again soon
			}
			if sb.kind == partHealth {
				h, err = c.holdHealth(w, healthIndex(w.cur.wait()), wait)
			}
			if w.setUp != nil {
				w.setUp()
				w.setUp = nil
			}
			if h != nil {
				c.hold(w, h)
				return
			}
			if err == nil {
				ev, index, err = c.read(w.begin(), sb, w.cur.wait(), wait, w.passedList(), w.quietTo())
				w.end()
			}
		} else {
			ev, index, err = c.answerHealth(h)
			h = nil
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil && (w.epoch.Err() != nil || w.reconnection.Err() != nil) {
			w.cur.failed()
			w.trail.verify = sb.kind == partHealth
			continue // cut short by a restart or the agent's return: read afresh at once
		}
		if err != nil {
			w.cur.failed()
			w.trail.verify = sb.kind == partHealth
			if c.send(ctx, event{sub: sb, err: err}) {
				c.backOff(w)
			}
			return
		}
		w.bo.Reset()
		if !w.answered(ev, index) {
			return
		}
		w.pace.answered(time.Now())
		if !w.pace.wait(ctx) {
			return
		}
	}
}

// backOff goes on with w's loop, on a new goroutine, once its backoff
// has passed or the agent is back: none waits meanwhile.
func (c *splitCatalog) backOff(w *subWatch) {
	c.wg.Add(1) // the query backing off is one of the watches stop waits for
	c.s.probe.backoffThen(w.ctx, w.recovery, w.bo.Next(), func(goOn bool) {
		if !goOn {
			c.wg.Done()
			return
		}
		if w.sb.kind != partHealth { // nothing to set up, and not to wait behind those
			go func() {
				defer c.wg.Done()
				w.loop(nil)
			}()
			return
		}
		// When the agent is back, every query backing off would go on at
		// once: the starter sets them up a few at a time.
		c.startAll(func(setUp func()) {
			defer c.wg.Done()
			if w.ctx.Err() != nil {
				setUp()
				return
			}
			w.setUp = setUp
			w.loop(nil)
		})
	})
}

// hold goes on with w's loop once h's answer begins: parked, without a
// goroutine until then, where the connection allows.
func (c *splitCatalog) hold(w *subWatch, h *heldHealth) {
	c.wg.Add(1) // the parked query is one of the watches stop waits for
	goOn := func() {
		defer c.wg.Done()
		h.wait()
		w.loop(h)
	}
	if h.p.err != nil || !heldParker.park(h.p.c, h.deadline, func() { go goOn() }) {
		go goOn()
	}
}

// prepare notes what the next request is cut short by: a restart of
// Consul, the agent's return.
func (w *subWatch) prepare() {
	if w.epoch != nil && w.epoch.Err() != nil {
		w.cur.failed() // another sub-watch saw Consul restart
		w.trail.restarted = w.sb.kind == partHealth
	}
	w.epoch = w.c.restartCtx()
	w.recovery, w.reconnection = w.c.s.probe.recovery(), w.c.s.probe.reconnection()
}

// begin sets up a request read on the loop's goroutine: a context that
// ends with what prepare noted.
func (w *subWatch) begin() context.Context {
	rctx, cancel := context.WithCancel(w.ctx)
	w.cancel = cancel
	w.stop = func() bool { return false }
	if w.cur.wait() > 0 { // a fresh read answers at once anyway
		w.stop = context.AfterFunc(w.epoch, cancel)
	}
	// A request in flight through a cut, blocking or not, may hang
	// on a broken connection until its deadline: the agent's return
	// ends it.
	w.stopR = context.AfterFunc(w.reconnection, cancel)
	return rctx
}

// end releases what begin set up.
func (w *subWatch) end() {
	w.stop()
	w.stopR()
	w.cancel()
}

// startOver acts on Consul having started over: the removal guard holds
// what goes next, and every other query reads afresh (this one is not cut
// by its own restart).
func (w *subWatch) startOver() {
	w.c.s.noteReset()
	w.c.restart()
	w.epoch = nil
}

// answered takes an answer; false when the context ended.
func (w *subWatch) answered(ev event, index uint64) bool {
	c, ctx, sb := w.c, w.ctx, w.sb
	if sb.kind == partHealth {
		return w.answeredHealth(ev, index)
	}
	if w.cur.seen != 0 && index < w.cur.seen {
		w.startOver()
	}
	moved := w.cur.answered(index, c.s, c.what(sb))
	ev.index = index
	if moved || !w.have {
		var now any = ev.listed
		if sb.kind == partNodes {
			now = ev.nodes
		}
		ev.changed = !w.have || !reflect.DeepEqual(w.prev, now)
		w.prev, w.have = now, true
	}
	// Every answer goes to fetch: an unchanged one says the query is
	// alive, and its index how recent the catalog is.
	return c.send(ctx, ev)
}

// passedList is the digest of the service list passed on last, for read
// to skip decoding the same list again; nil before any, and for other
// queries.
func (w *subWatch) passedList() *[32]byte {
	if d, ok := w.prev.([32]byte); ok && w.have && w.sb.kind == partServices {
		return &d
	}
	return nil
}

func (c *splitCatalog) send(ctx context.Context, ev event) bool {
	select {
	case c.events <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

func (c *splitCatalog) what(sb *sub) string {
	switch sb.kind {
	case partServices:
		return "/v1/catalog/services"
	case partNodes:
		return "/v1/catalog/nodes"
	}
	return "/v1/health/service/" + sb.name
}

// healthIndex is the index a health query waits on to read at index. A
// fresh read of a service's health waits on index 1, which any answer
// passes at once: with an index the agent answers from its streaming
// view, as it does the blocking queries. Without one it forwards the
// read to the servers, which forward it to the leader they know: after
// the leader's death, a dead address, held until their dial times out
// (10 s in the chaos suite) while the view had caught up within a second.
func healthIndex(index uint64) uint64 { return max(index, 1) }

// answerHealth is read's conversion of a held health query's answer.
func (c *splitCatalog) answerHealth(h *heldHealth) (event, uint64, error) {
	ev := event{sub: h.sb}
	entries, meta, err := h.answer()
	if err != nil {
		return ev, 0, fmt.Errorf("reading service %q: %w", h.sb.name, err)
	}
	ev.entries = entries
	return ev, meta.LastIndex, nil
}

// read issues sb's query, waiting on index (for wait, or the configured
// wait when 0), and converts its answer (a health answer at or below
// quietTo is not decoded: healthEntries).
func (c *splitCatalog) read(ctx context.Context, sb *sub, index uint64, wait time.Duration, passed *[32]byte, quietTo uint64) (event, uint64, error) {
	if sb.kind == partHealth {
		index = healthIndex(index)
	}
	opts, cancel := c.s.queryOptions(ctx, c.dc, index)
	defer cancel()
	if wait > 0 && opts.WaitIndex > 0 {
		opts.WaitTime = wait
	}
	ev := event{sub: sb}
	var (
		meta *api.QueryMeta
		err  error
	)
	switch sb.kind {
	case partServices:
		// The same request as Catalog().Services(opts), decoded only
		// when it is not the list passed on last: every registration
		// anywhere moves the list's index, and decoding 10,000 services'
		// tags at every change cost 4 MB and a comparison of them.
		body := listBody{passed: passed}
		meta, err = c.s.client.Raw().Query("/v1/catalog/services", &body, opts)
		if err != nil {
			return ev, 0, fmt.Errorf("listing services: %w", err)
		}
		ev.services, ev.listed = body.services, body.digest
	case partNodes:
		var nodes []*api.Node
		nodes, meta, err = c.s.client.Catalog().Nodes(opts)
		if err != nil {
			return ev, 0, fmt.Errorf("listing nodes: %w", err)
		}
		dump := make([]*nodeInfo, 0, len(nodes))
		for _, n := range nodes {
			if n == nil {
				continue
			}
			dump = append(dump, nodeFromAPI(n))
			if ev.dcName == "" && n.PeerName == "" {
				ev.dcName = n.Datacenter
			}
		}
		ev.nodes = convertDump(dump, c.dc, "").Nodes
	case partHealth:
		// A blocking query (index > 0) on the health of a service is
		// served by the agent from its streaming view (Consul 1.10+,
		// use_streaming_backend, on by default) without a parameter.
		ev.entries, meta, err = c.readHealth(opts, sb.name, index, quietTo)
		if err != nil {
			return ev, 0, fmt.Errorf("reading service %q: %w", sb.name, err)
		}
	}
	if meta.ResultsFilteredByACLs && sb.kind != partHealth && c.warnedACL.CompareAndSwap(false, true) {
		c.s.log.Warn("the token may not read all of the catalog; Consul left out what it may not read",
			"query", c.what(sb))
	}
	return ev, meta.LastIndex, nil
}

// digest identifies converted instances, every field (the JSON of a map
// is sorted by key).
func digest(insts []model.Instance) [sha256.Size]byte {
	h := sha256.New()
	_ = json.NewEncoder(h).Encode(insts) // plain data: it cannot fail
	var d [sha256.Size]byte
	h.Sum(d[:0])
	return d
}

func nodeFromAPI(n *api.Node) *nodeInfo {
	return &nodeInfo{ID: n.ID, Node: n.Node, PeerName: n.PeerName, Address: n.Address, Datacenter: n.Datacenter,
		TaggedAddresses: n.TaggedAddresses, Meta: n.Meta}
}
