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
func (c *splitCatalog) run(ctx context.Context, sb *sub) {
	w := &subWatch{c: c, ctx: ctx, sb: sb, bo: c.s.newBackoff()}
	if sb.seed > 0 { // wait for a change after the seed's read
		w.cur.index, w.prev, w.have = sb.seed, sb.seedDigest, true
	}
	w.loop(nil)
}

// subWatch is run's loop and what it keeps between answers. A held
// health query's answer is waited for on a goroutine of its own
// (held.go), which then goes on with the loop: the loop's state cannot
// live in its frame.
type subWatch struct {
	c   *splitCatalog
	ctx context.Context
	sb  *sub

	cur  cursor
	prev any
	have bool
	// After a failure the agent's view of a service may lag its
	// servers (verify); behind is the view's index while it does, or
	// while that could not be checked.
	verify bool
	behind uint64
	view   [sha256.Size]byte // digest of the view's latest answer
	bo     *backoff.Backoff
	epoch  context.Context // the restart context of the last request

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
			if w.behind != 0 {
				wait = behindPoll // a view that lags: ask its servers again soon
			}
			if sb.kind == partHealth {
				h, err = c.holdHealth(w, healthIndex(w.cur.wait()), wait)
				if h != nil {
					c.wg.Go(func() { h.wait(); w.loop(h) })
					return
				}
			}
			if err == nil {
				ev, index, err = c.read(w.begin(), sb, w.cur.wait(), wait)
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
			w.verify = sb.kind == partHealth
			continue // cut short by a restart or the agent's return: read afresh at once
		}
		if err != nil {
			w.cur.failed()
			w.verify = sb.kind == partHealth
			if !c.send(ctx, event{sub: sb, err: err}) || !c.s.probe.backoff(ctx, w.recovery, w.bo.Next()) {
				return
			}
			continue
		}
		w.bo.Reset()
		if !w.answered(ev, index) || !sleep(ctx, minInterval) {
			return
		}
	}
}

// prepare notes what the next request is cut short by: a restart of
// Consul, the agent's return.
func (w *subWatch) prepare() {
	if w.epoch != nil && w.epoch.Err() != nil {
		w.cur.failed() // another sub-watch saw Consul restart
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

// answered takes an answer; false when the context ended.
func (w *subWatch) answered(ev event, index uint64) bool {
	c, ctx, sb := w.c, w.ctx, w.sb
	var log *Source // per-service queries would log the same restart a thousand times
	if sb.kind != partHealth {
		log = c.s
	}
	if w.cur.seen != 0 && index < w.cur.seen {
		c.s.noteReset()
		c.restart()
		w.epoch = nil
	}
	// A seeded query's first answer at or below the dump's index is
	// its wait running out: its service did not change since.
	quiet := sb.seed > 0 && w.cur.seen == 0 && !w.cur.reread && index != 0 && index <= sb.seed
	moved := w.cur.answered(index, log, c.what(sb)) && !quiet
	ev.index = index
	if sb.kind == partHealth && (moved || !w.have) {
		// Only an answer that can differ is converted: most answers
		// of a thousand services are waits that ran out.
		ev.instances = convertEntries(ev.entries, c.dc, c.s.cfg.TagFilter)
		c.converted.Add(1)
	}
	ev.entries = nil
	if moved || !w.have {
		var now any
		switch sb.kind {
		case partServices:
			now = ev.services
		case partNodes:
			now = ev.nodes
		default:
			// A digest, not the instances: fetch holds them, and a
			// second copy of every service's here would cost as much
			// again.
			now = digest(ev.instances)
		}
		ev.changed = !w.have || !reflect.DeepEqual(w.prev, now)
		w.prev, w.have = now, true
		if d, ok := now.([sha256.Size]byte); ok {
			w.view = d
		}
	}
	// Every answer goes to fetch: an unchanged one says the query is
	// alive, and its index how recent the catalog is.
	if !c.send(ctx, ev) {
		return false
	}
	if w.behind != 0 && index != w.behind {
		w.behind = 0 // the view moved: it follows its servers again
	}
	if w.verify || w.behind != 0 {
		w.verify = false
		lagging, changed, ok := c.checkView(ctx, sb, index, w.view, w.prev)
		if ok {
			if changed != nil {
				w.prev = digest(changed.instances)
				if !c.send(ctx, *changed) {
					return false
				}
			}
			w.behind = 0
			if lagging {
				w.behind = index
			}
		} else {
			// Not known to follow its servers: poll it as a view that
			// lags, and check again, until a check answers or it moves.
			w.behind = index
		}
	}
	return true
}

// behindPoll is how often a service is read from the servers while the
// agent's view of it lags them.
const behindPoll = 5 * time.Second

// directTimeout bounds a read from the servers: it must not hold a
// service's query longer than the agent's view would.
const directTimeout = 3 * time.Second

// checkView compares the agent's view of service sb at index (digest
// view) with its servers', after a failure or while the view lags. The
// agent serves a blocking health query from a streaming view, and keeps
// serving that view's last state while its subscription retries: after a
// partition heals, with a backoff that grew during the cut (up to a
// minute in Consul 1.14), it answers at once with what it had before the
// cut. A read without an index goes to the servers instead. lagging says
// the servers differ from the view; changed is the servers' answer when
// it differs from what was passed on (last), also when it agrees with the
// view again after an earlier answer of theirs was passed on; ok is false
// when the servers could not tell: their read failed, or the server that
// answered is behind the view (restarted, still applying its log, it
// answers from older state). The view then serves, and is checked again
// at its next poll (behindPoll).
func (c *splitCatalog) checkView(ctx context.Context, sb *sub, index uint64, view [sha256.Size]byte, last any) (lagging bool, changed *event, ok bool) {
	insts, at, err := c.direct(ctx, sb.name)
	if err != nil {
		if ctx.Err() == nil {
			c.s.log.Debug("reading a service from the servers failed; its view serves until the next check", "service", sb.name, "err", err)
		}
		return false, nil, false
	}
	if at < index {
		c.s.log.Debug("the server that answered is behind the agent's view of a service; its view serves until the next check",
			"service", sb.name, "view_index", index, "server_index", at)
		return false, nil, false
	}
	d := digest(insts)
	lagging = d != view
	if lagging {
		c.s.log.Debug("the agent's view of a service lags its servers; reading it from them until the view moves",
			"service", sb.name, "view_index", index, "server_index", at)
	}
	if last == any(d) {
		return lagging, nil, true
	}
	return lagging, &event{sub: sb, index: index, instances: insts, changed: true}, true
}

// direct reads the health of service name from the servers: without an
// index (the agent answers only blocking queries from its view), and
// stale, so that any server answers from its own state rather than
// forward to a leader that may be gone. at is the answer's index.
func (c *splitCatalog) direct(ctx context.Context, name string) (insts []model.Instance, at uint64, err error) {
	select {
	case c.directs <- struct{}{}:
		defer func() { <-c.directs }()
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	}
	ctx, cancel := context.WithTimeout(ctx, directTimeout)
	defer cancel()
	opts, cancelQ := c.s.queryOptions(ctx, c.dc, 0)
	defer cancelQ()
	opts.AllowStale = true
	entries, meta, err := c.readHealth(opts, name, 0)
	if err != nil {
		return nil, 0, err
	}
	return convertEntries(entries, c.dc, c.s.cfg.TagFilter), meta.LastIndex, nil
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
// wait when 0), and converts its answer.
func (c *splitCatalog) read(ctx context.Context, sb *sub, index uint64, wait time.Duration) (event, uint64, error) {
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
		ev.services, meta, err = c.s.client.Catalog().Services(opts)
		if err != nil {
			return ev, 0, fmt.Errorf("listing services: %w", err)
		}
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
		ev.entries, meta, err = c.readHealth(opts, sb.name, index)
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
