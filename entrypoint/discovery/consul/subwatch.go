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
)

// run reads sb's query until its context ends, sending an event for each
// answer and each failure; a failure is retried with backoff.
func (c *splitCatalog) run(ctx context.Context, sb *sub) {
	var (
		cur  cursor
		prev any
		have bool
		// After a failure the agent's view of a service may lag its
		// servers (verify); behind is the view's index while it does.
		verify bool
		behind uint64
		view   [sha256.Size]byte // digest of the view's latest answer
	)
	if sb.seed > 0 { // wait for a change after the seed's read
		cur.index, prev, have = sb.seed, sb.seedDigest, true
	}
	bo := c.s.newBackoff()
	var epoch context.Context // the restart context of the last request
	for {
		if epoch != nil && epoch.Err() != nil {
			cur.failed() // another sub-watch saw Consul restart
		}
		epoch = c.restartCtx()
		recovery, reconnection := c.s.probe.recovery(), c.s.probe.reconnection()
		rctx, cancel := context.WithCancel(ctx)
		stop := func() bool { return false }
		if cur.wait() > 0 { // a fresh read answers at once anyway
			stop = context.AfterFunc(epoch, cancel)
		}
		// A request in flight through a cut, blocking or not, may hang
		// on a broken connection until its deadline: the agent's return
		// ends it.
		stopR := context.AfterFunc(reconnection, cancel)
		wait := time.Duration(0) // the configured wait
		if behind != 0 {
			wait = behindPoll // a view that lags: ask its servers again soon
		}
		ev, index, err := c.read(rctx, sb, cur.wait(), wait)
		stop()
		stopR()
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil && (epoch.Err() != nil || reconnection.Err() != nil) {
			cur.failed()
			verify = sb.kind == partHealth
			continue // cut short by a restart or the agent's return: read afresh at once
		}
		if err != nil {
			cur.failed()
			verify = sb.kind == partHealth
			if !c.send(ctx, event{sub: sb, err: err}) || !c.s.probe.backoff(ctx, recovery, bo.Next()) {
				return
			}
			continue
		}
		bo.Reset()
		var log *Source // per-service queries would log the same restart a thousand times
		if sb.kind != partHealth {
			log = c.s
		}
		if cur.seen != 0 && index < cur.seen {
			c.s.noteReset()
			c.restart()
			epoch = nil
		}
		// A seeded query's first answer at or below the dump's index is
		// its wait running out: its service did not change since.
		quiet := sb.seed > 0 && cur.seen == 0 && !cur.reread && index != 0 && index <= sb.seed
		moved := cur.answered(index, log, c.what(sb)) && !quiet
		ev.index = index
		if sb.kind == partHealth && (moved || !have) {
			// Only an answer that can differ is converted: most answers
			// of a thousand services are waits that ran out.
			ev.instances = convertEntries(ev.entries, c.dc, c.s.cfg.TagFilter)
			c.converted.Add(1)
		}
		ev.entries = nil
		if moved || !have {
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
			ev.changed = !have || !reflect.DeepEqual(prev, now)
			prev, have = now, true
			if d, ok := now.([sha256.Size]byte); ok {
				view = d
			}
		}
		// Every answer goes to fetch: an unchanged one says the query is
		// alive, and its index how recent the catalog is.
		if !c.send(ctx, ev) {
			return
		}
		if behind != 0 && index != behind {
			behind = 0 // the view moved: it follows its servers again
		}
		if verify || behind != 0 {
			verify = false
			lagging, changed, ok := c.checkView(ctx, sb, index, view, prev)
			if ok {
				if changed != nil {
					prev = digest(changed.instances)
					if !c.send(ctx, *changed) {
						return
					}
				}
				behind = 0
				if lagging {
					behind = index
				}
			}
		}
		if !sleep(ctx, minInterval) {
			return
		}
	}
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
// it differs from what was passed on (last); ok is false when the servers
// could not be read, and the view is left to serve.
func (c *splitCatalog) checkView(ctx context.Context, sb *sub, index uint64, view [sha256.Size]byte, last any) (lagging bool, changed *event, ok bool) {
	insts, err := c.direct(ctx, sb.name)
	if err != nil {
		if ctx.Err() == nil {
			c.s.log.Debug("reading a service from the servers failed; its view serves", "service", sb.name, "err", err)
		}
		return false, nil, false
	}
	d := digest(insts)
	if d == view {
		return false, nil, true
	}
	c.s.log.Debug("the agent's view of a service lags its servers; reading it from them until the view moves",
		"service", sb.name, "view_index", index)
	if last == any(d) {
		return true, nil, true
	}
	return true, &event{sub: sb, index: index, instances: insts, changed: true}, true
}

// direct reads the health of service name from the servers: without an
// index (the agent answers only blocking queries from its view), and
// stale, so that any server answers from its own state rather than
// forward to a leader that may be gone.
func (c *splitCatalog) direct(ctx context.Context, name string) ([]model.Instance, error) {
	select {
	case c.directs <- struct{}{}:
		defer func() { <-c.directs }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	ctx, cancel := context.WithTimeout(ctx, directTimeout)
	defer cancel()
	opts, cancelQ := c.s.queryOptions(ctx, c.dc, 0)
	defer cancelQ()
	opts.AllowStale = true
	entries, _, err := c.readHealth(opts, name, 0)
	if err != nil {
		return nil, err
	}
	return convertEntries(entries, c.dc, c.s.cfg.TagFilter), nil
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

// read issues sb's query, waiting on index (for wait, or the configured
// wait when 0), and converts its answer.
func (c *splitCatalog) read(ctx context.Context, sb *sub, index uint64, wait time.Duration) (event, uint64, error) {
	if sb.kind == partHealth && index == 0 {
		// A fresh read of a service's health waits on index 1, which any
		// answer passes at once: with an index the agent answers from its
		// streaming view, as it does the blocking queries. Without one it
		// forwards the read to the servers, which forward it to the
		// leader they know: after the leader's death, a dead address,
		// held until their dial times out (10 s in the chaos suite) while
		// the view had caught up within a second.
		index = 1
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
